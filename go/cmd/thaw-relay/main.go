// Command thaw-relay holds the stdio of one parked sandbox. thawd restores
// gVisor sandboxes ahead of demand ("parked"), before containerd asks for a
// container; when the shim later creates a container of the same workload,
// thaw's stand-in hands it the parked sandbox instead of creating one. The
// shim gave that container's stdio to `runsc create` as the stand-in's
// descriptors 0, 1 and 2, but the sandbox was restored long before, with
// stdio of thaw's choosing: three pipes whose other ends this relay holds,
// one relay per parked sandbox (as conmon is one monitor per container).
//
//	thaw-relay -socket PATH -stdin-fd N -stdout-fd N -stderr-fd N [-buffer-bytes 1048576] [-accept-timeout 0]
//
// Its twins: control/thawd/parking.py starts it; the stand-in
// (go/internal/standin) calls relay.Send of go/internal/relay, which is the
// protocol of both sides.
//
// Descriptors, inherited from thawd: -stdin-fd is the write end of the
// sandbox's stdin pipe, -stdout-fd and -stderr-fd the read ends of its stdout
// and stderr pipes. Each flag must be given; -1 is "none"; the others must be
// open, 3 or above (0, 1 and 2 are the relay's own) and distinct, and at least
// one output is required (the relay ends when the sandbox's outputs close).
//
// Start: the relay listens on PATH, a Unix stream socket of mode 0600 from
// the moment it exists (bound in a private directory beside PATH, then
// renamed into place). A socket file already at PATH is replaced only when
// nothing answers on it. Then it writes "ready\n" on its stdout and closes
// it (descriptor 1 becomes /dev/null): thawd waits for that line before it
// restores the sandbox.
//
// Parked: the sandbox's stdout and stderr are read into two buffers, each
// keeping its stream's last -buffer-bytes bytes (default 1 MiB) and counting
// the bytes it dropped, so that a parked workload that prints never blocks on
// a full pipe. Nothing is written to the sandbox's stdin.
//
// Adoption: the stand-in connects and sends one message, the payload
// "thaw-relay-adopt v1\n" with three descriptors as SCM_RIGHTS: the
// container's stdin, stdout and stderr, in that order. Any other message is
// answered with one line "error: WHAT\n", its descriptors are closed, and the
// relay waits for the next connection. For a correct one the socket is
// closed and removed (one adoption per relay), then "ok\n" is answered; should
// that answer not go through (the stand-in gave up: it keeps the container's
// stdio and starts the container cold), the descriptors are closed, the
// socket is created again and the sandbox stays parked. After "ok\n" comes,
// first on the container's stderr when the buffers dropped anything, one line
//
//	[thaw-relay: N bytes of output from before this container started were dropped]
//
// (N for both streams together); each buffer goes to its stream, followed by
// the live output, in order. The container's stdin is copied to the
// sandbox's, whose write end is closed when the container's stdin reaches end
// of file, as a pipe's would be. A write to the container's stdout or stderr
// that fails (EPIPE: its reader went away) ends that copy, and that stream's
// descriptor is closed, but the sandbox's pipe is still read, and discarded,
// so that the sandbox never blocks. SIGPIPE and SIGHUP are ignored.
//
// Exit status: 0 once every sandbox output given has reached end of file (the
// sandbox's processes are gone), before or after adoption, with every
// descriptor closed and the socket removed if still there; 0 at once on
// SIGTERM or SIGINT (the socket removed); 0 when -accept-timeout seconds (0:
// none) passed without an adoption, thawd's safety net; 1 when the socket
// cannot be created (at the start, or again after an unanswered adoption) or
// the ready line not written; 2 for bad arguments, with a usage line on
// stderr. Diagnostics go to stderr (thawd: the parked sandbox's relay.log),
// one line each, prefixed "thaw-relay: ".
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"thaw.dev/thaw/go/internal/relay"
)

const usage = "usage: thaw-relay -socket PATH -stdin-fd N -stdout-fd N -stderr-fd N " +
	"[-buffer-bytes 1048576] [-accept-timeout SECONDS]"

// The largest -buffer-bytes: two buffers of this size per parked sandbox
// must stay small beside the sandbox itself.
const maxBufferBytes = 256 << 20

// droppedNotice is written on the container's stderr before the buffered
// output when the buffers dropped bytes (%d: both streams' count).
const droppedNotice = "[thaw-relay: %d bytes of output from before this container started were dropped]\n"

var diag = log.New(os.Stderr, "thaw-relay: ", 0)

type config struct {
	socket                      string
	stdinFD, stdoutFD, stderrFD int // -1: none
	bufferBytes                 int
	acceptTimeout               time.Duration // 0: none
}

func main() {
	c, err := parse(os.Args[1:])
	if err == nil {
		var sb *stdio
		if sb, err = c.open(); err == nil {
			// A broken container stdout must be an EPIPE that ends one copy,
			// not the signal that ends the relay; a hang-up of thawd's
			// terminal is none of the relay's business.
			signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP)
			stop := make(chan struct{})
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
			go func() { <-sigs; close(stop) }()
			os.Exit(run(c, sb, announceReady, stop))
		}
	}
	if !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "thaw-relay:", err)
	}
	fmt.Fprintln(os.Stderr, usage)
	os.Exit(2)
}

func parse(args []string) (config, error) {
	fs := flag.NewFlagSet("thaw-relay", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // main prints the error and the usage line
	socket := fs.String("socket", "", "the Unix socket the stand-in connects to (mode 0600)")
	stdinFD := fs.Int("stdin-fd", -1, "write end of the sandbox's stdin pipe (-1: none)")
	stdoutFD := fs.Int("stdout-fd", -1, "read end of the sandbox's stdout pipe (-1: none)")
	stderrFD := fs.Int("stderr-fd", -1, "read end of the sandbox's stderr pipe (-1: none)")
	buffer := fs.Int("buffer-bytes", 1<<20, "output kept per stream before adoption (the last bytes)")
	timeout := fs.Float64("accept-timeout", 0, "seconds to wait for an adoption (0: forever)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range []string{"socket", "stdin-fd", "stdout-fd", "stderr-fd"} {
		if !given[name] {
			return config{}, fmt.Errorf("-%s is required", name)
		}
	}
	if math.IsNaN(*timeout) || *timeout < 0 || *timeout > 1e6 {
		return config{}, fmt.Errorf("-accept-timeout %v is not between 0 and 1e6 seconds", *timeout)
	}
	c := config{socket: *socket, stdinFD: *stdinFD, stdoutFD: *stdoutFD, stderrFD: *stderrFD,
		bufferBytes: *buffer, acceptTimeout: time.Duration(*timeout * float64(time.Second))}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.socket == "":
		return errors.New("-socket is empty")
	case c.bufferBytes < 0 || c.bufferBytes > maxBufferBytes:
		return fmt.Errorf("-buffer-bytes %d is not between 0 and %d", c.bufferBytes, maxBufferBytes)
	case c.stdoutFD == -1 && c.stderrFD == -1:
		return errors.New("-stdout-fd and -stderr-fd are both -1: the relay ends when the sandbox's outputs close")
	}
	seen := map[int]string{}
	for _, f := range []struct {
		name string
		fd   int
	}{{"stdin-fd", c.stdinFD}, {"stdout-fd", c.stdoutFD}, {"stderr-fd", c.stderrFD}} {
		switch {
		case f.fd == -1:
			continue
		case f.fd < 3:
			return fmt.Errorf("-%s %d: descriptors 0, 1 and 2 are the relay's own", f.name, f.fd)
		case seen[f.fd] != "":
			return fmt.Errorf("-%s %d is also -%s", f.name, f.fd, seen[f.fd])
		}
		seen[f.fd] = f.name
	}
	return nil
}

// open checks that each descriptor is open in the right direction (a
// swapped pipe end in thawd shows here, not as a sandbox that blocks).
func (c config) open() (*stdio, error) {
	in, err := inherited("stdin-fd", c.stdinFD, true)
	if err != nil {
		return nil, err
	}
	out, err := inherited("stdout-fd", c.stdoutFD, false)
	if err != nil {
		return nil, err
	}
	errOut, err := inherited("stderr-fd", c.stderrFD, false)
	if err != nil {
		return nil, err
	}
	return newStdio(in, out, errOut, c.bufferBytes), nil
}

func inherited(flagName string, fd int, write bool) (*os.File, error) {
	if fd == -1 {
		return nil, nil
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, fmt.Errorf("-%s %d is not an open descriptor: %v", flagName, fd, err)
	}
	switch acc := fl & unix.O_ACCMODE; {
	case write && acc == unix.O_RDONLY:
		return nil, fmt.Errorf("-%s %d is open read-only: it must be the write end of the sandbox's stdin pipe", flagName, fd)
	case !write && acc == unix.O_WRONLY:
		return nil, fmt.Errorf("-%s %d is open write-only: it must be the read end of a sandbox output pipe", flagName, fd)
	}
	return os.NewFile(uintptr(fd), flagName), nil
}

// announceReady writes the ready line and closes stdout by putting /dev/null
// in its place: a plain close would free descriptor 1 for the next
// descriptor the relay gets, a container's stream perhaps.
func announceReady() error {
	if _, err := os.Stdout.WriteString("ready\n"); err != nil {
		return err
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	return unix.Dup3(int(null.Fd()), 1, 0)
}

// run is the relay: it listens, calls ready, buffers until an adoption, then
// relays until the sandbox's outputs close. A close of stop ends it at once.
func run(c config, sb *stdio, ready func() error, stop <-chan struct{}) int {
	sb.start()
	l, err := relay.Listen(c.socket)
	if err != nil {
		diag.Print(err)
		return 1
	}
	defer l.Close()
	if err := ready(); err != nil {
		diag.Printf("writing the ready line: %v", err)
		return 1
	}
	adopted := make(chan error, 1) // nil: adopted; else the listener's closing
	go func() { adopted <- accept(l, sb) }()
	var expired <-chan time.Time
	if c.acceptTimeout > 0 {
		t := time.NewTimer(c.acceptTimeout)
		defer t.Stop()
		expired = t.C
	}
	var why string
	select {
	case <-stop:
		return 0
	case err = <-adopted:
	case <-sb.outputsDone:
		why = "the sandbox's outputs closed before any container adopted it"
	case <-expired:
		why = fmt.Sprintf("no container adopted the sandbox within %v", c.acceptTimeout)
	}
	if why != "" {
		// An adoption answered OK in the meantime must still be honoured:
		// the stand-in was told the relay holds the container's stdio.
		l.Close()
		if err = <-adopted; err != nil {
			diag.Print(why)
		}
	}
	if err != nil {
		sb.close()
		if !errors.Is(err, net.ErrClosed) {
			diag.Print(err)
			return 1
		}
		return 0
	}
	select {
	case <-stop:
		return 0
	case <-sb.outputsDone:
	}
	sb.close()
	return 0
}

// accept waits for the adoption and starts relaying to the container's
// stdio. The outputs are held (neither buffered nor relayed) from before OK
// until the buffers went out, so that what the sandbox prints after the
// stand-in heard OK comes after them, and is not counted as dropped.
func accept(l *relay.Listener, sb *stdio) error {
	for {
		a, err := l.Accept(func(err error) { diag.Printf("refused an adoption: %v", err) })
		if err != nil {
			return err
		}
		sb.hold()
		if err := a.Confirm(); err != nil {
			sb.release()
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			diag.Printf("adoption not confirmed: %v", err)
			continue
		}
		sb.adoptHeld(a.Files)
		return nil
	}
}
