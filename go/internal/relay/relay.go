// Package relay is the hand-over of a container's stdio to the relay of a
// parked sandbox: the wire protocol between go/cmd/thaw-relay, which listens
// (control/thawd/parking.py starts it), and the stand-in, go/internal/standin,
// which adopts the sandbox for a container and calls Send.
//
// One connection to the relay's Unix stream socket carries one message from
// the stand-in: the payload Hello with three descriptors as SCM_RIGHTS, the
// container's stdin, stdout and stderr in that order. The relay answers one
// line: OK once it holds them, or "error: WHAT\n" (and closes what came), after
// which it waits for another connection. One adoption per relay: the socket
// is closed and removed before OK. The relay's side is Listen, Accept and
// Adoption.Confirm.
package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// Hello is the payload of the adoption message; the version names this
	// protocol, so that a stand-in and a relay of different releases refuse
	// each other instead of misreading each other.
	Hello = "thaw-relay-adopt v1\n"
	// OK is the relay's answer once it holds the three descriptors.
	OK = "ok\n"

	// The relay side's bound on one connection's message and answer: the
	// stand-in sends at once, so this only frees the relay from a client that
	// connects and says nothing.
	receiveTimeout = 10 * time.Second
	// Room for this many descriptors in a message: more are discarded by the
	// kernel (MSG_CTRUNC) and the message refused.
	maxFDs = 16
	// The longest reply line Send reads.
	maxReply = 4096
	// How long Listen's probe of an existing socket file waits for an answer.
	staleProbe = time.Second
)

// MaxPath is the longest socket path: sun_path holds 108 bytes, one kept for
// the NUL others expect. Twin: control/thawd/parking.py (its socket path
// comment).
var MaxPath = len(unix.RawSockaddrUnix{}.Path) - 1

var streamNames = [3]string{"stdin", "stdout", "stderr"}

// Error is a failed step of an adoption, on either side: Send's connect,
// send and reply; the relay's listen, accept, receive and reply (Confirm).
type Error struct {
	Socket string // the relay's socket path
	Step   string // connect | send | reply | listen | accept | receive
	Reply  string // step reply: what the relay answered instead of OK (maybe part of a line)
	Err    error  // the cause; nil when the relay answered a whole line other than OK
}

func (e *Error) Error() string {
	msg := "thaw-relay socket " + e.Socket + ": " + e.Step
	if e.Reply != "" {
		msg += fmt.Sprintf(": the relay answered %q", e.Reply)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// errNoReply: the relay closed the connection before a whole line.
var errNoReply = errors.New("the connection closed before a whole reply line")

// Send hands files (the container's stdin, stdout, stderr) to the relay
// listening on socketPath and waits for its answer; timeout bounds all of it
// and must be positive. A nil file is "none": /dev/null goes in its place,
// read-only for stdin, write-only for the outputs. The caller keeps its own
// copies of the descriptors: the relay receives duplicates.
//
// A timeout after the message was sent leaves it unknown whether the relay
// took the descriptors (it may have answered OK just too late).
func Send(socketPath string, files [3]*os.File, timeout time.Duration) error {
	fail := func(step string, err error) error { return &Error{Socket: socketPath, Step: step, Err: err} }
	if timeout <= 0 {
		return fail("connect", fmt.Errorf("the timeout %v is not positive", timeout))
	}
	deadline := time.Now().Add(timeout)
	for i, f := range files {
		if f != nil {
			continue
		}
		flag := os.O_WRONLY
		if i == 0 {
			flag = os.O_RDONLY
		}
		null, err := os.OpenFile(os.DevNull, flag, 0)
		if err != nil {
			return fail("send", fmt.Errorf("%s: %w", streamNames[i], err))
		}
		defer null.Close()
		files[i] = null
	}
	fds, err := descriptors(files)
	if err != nil {
		return fail("send", err)
	}
	c, err := net.DialTimeout("unix", socketPath, timeout)
	if err != nil {
		return fail("connect", cause(err))
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return fail("send", err)
	}
	n, _, err := conn.WriteMsgUnix([]byte(Hello), unix.UnixRights(fds...), nil)
	runtime.KeepAlive(files) // the numbers in fds belong to these files
	if err == nil && n != len(Hello) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fail("send", cause(err))
	}
	reply, err := readLine(conn)
	switch {
	case err != nil:
		return &Error{Socket: socketPath, Step: "reply", Reply: reply, Err: cause(err)}
	case reply != OK:
		return &Error{Socket: socketPath, Step: "reply", Reply: reply}
	}
	return nil
}

// descriptors reads each file's number through its raw connection, not
// File.Fd, which would switch a pollable file to blocking mode for good. The
// numbers stay valid while the files are open (Send keeps them alive).
func descriptors(files [3]*os.File) ([]int, error) {
	fds := make([]int, 0, len(files))
	for i, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", streamNames[i], err)
		}
		var fd int
		if err := rc.Control(func(u uintptr) { fd = int(u) }); err != nil {
			return nil, fmt.Errorf("%s: %w", streamNames[i], err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// readLine reads up to and including the first newline; what it read so far
// comes back with any error.
func readLine(r io.Reader) (string, error) {
	var line []byte
	buf := make([]byte, 256)
	for len(line) < maxReply {
		n, err := r.Read(buf)
		line = append(line, buf[:n]...)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			return string(line[:i+1]), nil
		}
		if errors.Is(err, io.EOF) {
			return string(line), errNoReply
		}
		if err != nil {
			return string(line), err
		}
	}
	return string(line), fmt.Errorf("no newline in the first %d bytes", maxReply)
}

// cause drops the net and syscall wrappers, whose text repeats the socket
// path and the step that Error names already; errors.Is still sees through.
func cause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	var sc *os.SyscallError
	if errors.As(err, &sc) && sc.Err != nil {
		err = sc.Err
	}
	return err
}
