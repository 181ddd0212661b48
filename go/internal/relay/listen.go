package relay

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listener is the relay's side: a socket file of mode 0600 and the adoption
// it waits for.
type Listener struct {
	path string

	mu      sync.Mutex
	ln      *net.UnixListener // nil once the socket is closed
	self    os.FileInfo       // the socket file as bound: only this one is removed
	closed  bool
	current *net.UnixConn // the connection Accept is reading; Close ends it
}

// Listen creates the relay's socket at path. The socket is never reachable
// with a wider mode than 0600: it is bound in a private directory (0700)
// beside path, set to 0600 and renamed into place; the umask, which would do
// the same, belongs to the whole process. A socket file already at path is
// replaced (atomically, by that rename) only when nothing answers on it; any
// other file there is an error.
func Listen(path string) (*Listener, error) {
	fail := func(err error) (*Listener, error) { return nil, &Error{Socket: path, Step: "listen", Err: err} }
	if len(path) > MaxPath {
		return fail(fmt.Errorf("the path is %d bytes, more than a socket address holds (%d)", len(path), MaxPath))
	}
	if err := checkStale(path); err != nil {
		return fail(err)
	}
	private, err := os.MkdirTemp(filepath.Dir(path), ".r")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(private) // empty once the socket moved out
	bound := filepath.Join(private, "s")
	bindName := bound
	if len(bound) > MaxPath {
		// The private directory's name made the path too long: reach it
		// through a descriptor instead (/proc/self/fd/N/s is 20 bytes or so).
		dir, err := os.OpenFile(private, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return fail(err)
		}
		defer dir.Close()
		bindName = "/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/s"
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: bindName, Net: "unix"})
	if err != nil {
		return fail(cause(err))
	}
	ln.SetUnlinkOnClose(false) // the file moves; Close removes it by its final name
	if err := os.Chmod(bound, 0o600); err != nil {
		ln.Close()
		return fail(err)
	}
	if err := os.Rename(bound, path); err != nil {
		ln.Close()
		return fail(err)
	}
	self, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return fail(err)
	}
	return &Listener{path: path, ln: ln, self: self}, nil
}

// checkStale: nil when path is free or a socket nothing answers on (a relay
// that died without removing it).
func checkStale(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("the path exists and is not a socket (%v)", st.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, staleProbe)
	if err == nil {
		c.Close()
		return errors.New("another process listens on this socket")
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	return fmt.Errorf("probing the socket file already there: %w", cause(err))
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Adoption is a correct adoption message, not answered yet: the relay gets
// ready to relay (it stops buffering) and then calls Confirm, so that no
// output the sandbox writes after the stand-in heard OK is taken for output
// from before the container started.
type Adoption struct {
	Files [3]*os.File // the container's stdin, stdout, stderr
	l     *Listener
	conn  *net.UnixConn
}

// Accept waits for a correct adoption message. A connection whose message is
// not Hello with exactly three descriptors gets "error: WHAT\n", is closed
// with the descriptors it carried, and is reported to refused (which may be
// nil); so are failures to accept, after a pause. A correct one closes the
// socket and removes its file before Accept returns: once Send returned nil,
// no other connection can come in. The error wraps net.ErrClosed once the
// listener is closed; any other error means the socket is gone for good.
func (l *Listener) Accept(refused func(error)) (*Adoption, error) {
	closedErr := &Error{Socket: l.path, Step: "accept", Err: net.ErrClosed}
	pause := 10 * time.Millisecond
	for {
		l.mu.Lock()
		ln, closed := l.ln, l.closed
		l.mu.Unlock()
		if closed {
			return nil, closedErr
		}
		if ln == nil {
			return nil, &Error{Socket: l.path, Step: "accept",
				Err: errors.New("no socket: it could not be created again after an unconfirmed adoption")}
		}
		conn, err := ln.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return nil, closedErr
		}
		if err != nil {
			// EMFILE and the like pass; the relay must not die of them, its
			// parked sandbox would lose the reader of its output.
			report(refused, &Error{Socket: l.path, Step: "accept", Err: cause(err)})
			time.Sleep(pause)
			pause = min(2*pause, time.Second)
			continue
		}
		if !l.track(conn) {
			conn.Close()
			return nil, closedErr
		}
		conn.SetDeadline(time.Now().Add(receiveTimeout))
		files, err := readAdoption(conn)
		if err != nil {
			conn.Write([]byte("error: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n"))
			conn.Close()
			l.track(nil)
			report(refused, &Error{Socket: l.path, Step: "receive", Err: err})
			continue
		}
		l.mu.Lock()
		l.unlistenLocked()
		l.mu.Unlock()
		return &Adoption{Files: files, l: l, conn: conn}, nil
	}
}

func report(refused func(error), err error) {
	if refused != nil {
		refused(err)
	}
}

// track records the connection Accept reads, so that Close can end it;
// false when the listener is already closed.
func (l *Listener) track(c *net.UnixConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.current = c
	return true
}

// Confirm answers OK. When OK does not go through (the stand-in gave up or
// the listener was closed), the stand-in keeps the container's stdio and
// starts the container cold, so the relay must not hold it too: Files are
// closed, the socket is created again (the sandbox stays parked, adoptable),
// and the error says so; the relay's next Accept waits for another stand-in.
func (a *Adoption) Confirm() error {
	_, err := a.conn.Write([]byte(OK))
	a.conn.Close()
	a.l.track(nil)
	if err == nil {
		return nil
	}
	for _, f := range a.Files {
		f.Close()
	}
	rerr := &Error{Socket: a.l.path, Step: "reply", Err: cause(err)}
	if lerr := a.l.relisten(); lerr != nil {
		return errors.Join(rerr, lerr)
	}
	return rerr
}

// unlistenLocked closes the socket and removes its file if the file is
// still this listener's (a later relay may have put its own there).
func (l *Listener) unlistenLocked() error {
	if l.ln == nil {
		return nil
	}
	err := l.ln.Close()
	l.ln = nil
	if st, serr := os.Lstat(l.path); serr == nil && os.SameFile(st, l.self) {
		if rerr := os.Remove(l.path); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// relisten creates the socket again, unless the listener was closed meanwhile.
func (l *Listener) relisten() error {
	fresh, err := Listen(l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		fresh.Close()
		return &Error{Socket: l.path, Step: "accept", Err: net.ErrClosed}
	}
	l.ln, l.self = fresh.ln, fresh.self
	return nil
}

// readAdoption reads the one message of a connection; on any error every
// descriptor it carried is closed.
func readAdoption(conn *net.UnixConn) ([3]*os.File, error) {
	var files [3]*os.File
	buf := make([]byte, 2*len(Hello))
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return files, fmt.Errorf("reading the message: %w", cause(err))
	}
	fds, perr := rights(oob[:oobn])
	switch {
	case perr != nil:
		err = fmt.Errorf("unreadable control message: %w", perr)
	case flags&unix.MSG_CTRUNC != 0:
		err = fmt.Errorf("more than %d descriptors (control message truncated), want 3 (stdin, stdout, stderr)", maxFDs)
	case n == 0 && len(fds) == 0:
		err = errors.New("the connection closed without a message")
	case len(fds) != 3:
		err = fmt.Errorf("the message carried %d descriptor(s), want 3 (stdin, stdout, stderr)", len(fds))
	case string(buf[:n]) != Hello:
		err = fmt.Errorf("the payload is %q, want %q", buf[:n], Hello)
	}
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return files, err
	}
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "container "+streamNames[i])
	}
	return files, nil
}

// rights collects the descriptors of every SCM_RIGHTS message in oob.
func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// Close stops listening, ends a connection Accept is reading, and removes the
// socket file if it is still this listener's. Later calls do nothing.
func (l *Listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.current != nil {
		l.current.Close()
	}
	return l.unlistenLocked()
}
