package relay

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// deadline is when a test gives up waiting: its own deadline less a margin,
// or 20 s.
func deadline(t *testing.T) time.Time {
	if d, ok := t.Deadline(); ok {
		return d.Add(-2 * time.Second)
	}
	return time.Now().Add(20 * time.Second)
}

// shortDir is a directory with a short path (t.TempDir's carries the test's
// name; a socket path has at most MaxPath bytes).
func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "rl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func pipe(t *testing.T) (*os.File, *os.File) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// acceptOne does what the relay does in the background: Accept, then
// Confirm, again while Confirm fails. Refusals and failed confirmations are
// collected.
func acceptOne(l *Listener) (<-chan [3]*os.File, <-chan error, *[]error) {
	got := make(chan [3]*os.File, 1)
	errc := make(chan error, 1)
	refused := new([]error) // read only after got or errc: the goroutine appends
	go func() {
		for {
			a, err := l.Accept(func(err error) { *refused = append(*refused, err) })
			if err != nil {
				errc <- err
				return
			}
			if err := a.Confirm(); err != nil {
				*refused = append(*refused, err)
				continue
			}
			got <- a.Files
			return
		}
	}()
	return got, errc, refused
}

func waitFiles(t *testing.T, got <-chan [3]*os.File, errc <-chan error) [3]*os.File {
	t.Helper()
	select {
	case files := <-got:
		return files
	case err := <-errc:
		t.Fatalf("Accept: %v", err)
	case <-time.After(time.Until(deadline(t))):
		t.Fatal("no adoption")
	}
	return [3]*os.File{}
}

func TestSendHandsOverTheThreeDescriptorsInOrder(t *testing.T) {
	path := filepath.Join(shortDir(t), "r.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	st, err := os.Lstat(path)
	if err != nil || st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket file %v, %v", st, err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Fatalf("directory holds %v: the private directory was left", entries)
	}
	got, errc, _ := acceptOne(l)
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	errR, errW := pipe(t)
	if err := Send(path, [3]*os.File{inR, outW, errW}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	files := waitFiles(t, got, errc)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	inW.Write([]byte("to stdin"))
	files[1].Write([]byte("to stdout"))
	files[2].Write([]byte("to stderr"))
	for _, c := range []struct {
		r    io.Reader
		want string
	}{{files[0], "to stdin"}, {outR, "to stdout"}, {errR, "to stderr"}} {
		buf := make([]byte, 64)
		n, err := c.r.Read(buf)
		if err != nil || string(buf[:n]) != c.want {
			t.Fatalf("read %q, %v; want %q", buf[:n], err, c.want)
		}
	}
}

func TestNilFilesGoAsDevNullOpenTheRightWay(t *testing.T) {
	path := filepath.Join(shortDir(t), "r.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got, errc, _ := acceptOne(l)
	if err := Send(path, [3]*os.File{}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	files := waitFiles(t, got, errc)
	null, _ := os.Stat(os.DevNull)
	for i, want := range []int{unix.O_RDONLY, unix.O_WRONLY, unix.O_WRONLY} {
		st, err := files[i].Stat()
		if err != nil || !os.SameFile(st, null) {
			t.Fatalf("%s: %v, %v: not /dev/null", streamNames[i], st, err)
		}
		fl, err := unix.FcntlInt(files[i].Fd(), unix.F_GETFL, 0)
		if err != nil || fl&unix.O_ACCMODE != want {
			t.Fatalf("%s: flags %#x, %v", streamNames[i], fl, err)
		}
		files[i].Close()
	}
}

// sendRaw sends payload with fds and returns the relay's answer.
func sendRaw(t *testing.T, path, payload string, fds ...int) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := c.(*net.UnixConn)
	conn.SetDeadline(deadline(t))
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := conn.WriteMsgUnix([]byte(payload), oob, nil); err != nil {
		t.Fatal(err)
	}
	line, err := readLine(conn)
	if err != nil {
		t.Fatalf("reply %q: %v", line, err)
	}
	return line
}

func TestAWrongMessageIsAnsweredAndItsDescriptorsClosed(t *testing.T) {
	path := filepath.Join(shortDir(t), "r.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got, errc, refused := acceptOne(l)
	r, w := pipe(t)
	line := sendRaw(t, path, Hello, int(w.Fd()))
	if !strings.HasPrefix(line, "error: ") || !strings.Contains(line, "carried 1 descriptor(s), want 3") {
		t.Fatalf("answer %q", line)
	}
	w.Close() // the relay closed its copy: the pipe's read end sees end of file
	r.SetReadDeadline(deadline(t))
	if n, err := r.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read %d, %v: the relay kept the descriptor", n, err)
	}
	fd := int(os.Stdin.Fd())
	if line := sendRaw(t, path, "hello\n", fd, fd, fd); !strings.Contains(line, `the payload is "hello\n"`) {
		t.Fatalf("answer %q", line)
	}
	if err := Send(path, [3]*os.File{}, 5*time.Second); err != nil {
		t.Fatalf("a correct adoption after wrong ones: %v", err)
	}
	for _, f := range waitFiles(t, got, errc) {
		f.Close()
	}
	if len(*refused) != 2 {
		t.Fatalf("refused %v", *refused)
	}
	var e *Error
	if !errors.As((*refused)[0], &e) || e.Step != "receive" || e.Socket != path {
		t.Fatalf("refusal %#v", (*refused)[0])
	}
}

func TestSendToNothingNamesTheSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "nobody.sock")
	err := Send(path, [3]*os.File{}, time.Second)
	var e *Error
	if !errors.As(err, &e) || e.Step != "connect" || e.Socket != path || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("%#v", err)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("message %q", err)
	}
}

// rawListener answers each connection with answer (nothing when empty) and
// keeps it open until the test ends.
func rawListener(t *testing.T, answer string) string {
	path := filepath.Join(shortDir(t), "raw.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			c.Read(make([]byte, 64))
			if answer != "" {
				c.Write([]byte(answer))
			}
		}
	}()
	return path
}

func TestSendReportsAnAnswerOtherThanOK(t *testing.T) {
	path := rawListener(t, "error: no\n")
	err := Send(path, [3]*os.File{}, 5*time.Second)
	var e *Error
	if !errors.As(err, &e) || e.Step != "reply" || e.Reply != "error: no\n" || e.Err != nil {
		t.Fatalf("%#v", err)
	}
	if !strings.Contains(err.Error(), `answered "error: no\n"`) {
		t.Fatalf("message %q", err)
	}
}

func TestSendGivesUpAtItsTimeout(t *testing.T) {
	path := rawListener(t, "")
	t0 := time.Now()
	err := Send(path, [3]*os.File{}, 300*time.Millisecond)
	var e *Error
	if !errors.As(err, &e) || e.Step != "reply" || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%#v", err)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("returned after %v", d)
	}
}

func TestListenReplacesADeadSocketOnly(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "r.sock")
	// A socket file nothing listens on: what a relay killed with SIGKILL leaves.
	dead, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	dead.SetUnlinkOnClose(false)
	dead.Close()
	l, err := Listen(path)
	if err != nil {
		t.Fatalf("over a dead socket: %v", err)
	}
	defer l.Close()
	_, err = Listen(path)
	var e *Error
	if !errors.As(err, &e) || e.Step != "listen" || !strings.Contains(err.Error(), "another process listens") {
		t.Fatalf("over a live one: %v", err)
	}
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("x"), 0o600)
	if _, err := Listen(plain); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("over a file: %v", err)
	}
	if data, _ := os.ReadFile(plain); string(data) != "x" {
		t.Fatal("the file was replaced")
	}
}

func TestCloseRemovesOnlyItsOwnSocketAndEndsAccept(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "r.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	_, errc, _ := acceptOne(l)
	l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept: %v", err)
		}
	case <-time.After(time.Until(deadline(t))):
		t.Fatal("Accept still waits")
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left: %v", err)
	}
	a, _ := Listen(path)
	os.Rename(path, path+".a")
	b, _ := Listen(path) // another relay's socket now at path
	a.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("closing a removed another listener's socket: %v", err)
	}
	b.Close()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left: %v", err)
	}
}

func TestALongPathIsBoundThroughTheDirectory(t *testing.T) {
	dir := shortDir(t)
	// Room for the path itself but not for the private directory's name too.
	path := filepath.Join(dir, strings.Repeat("p", MaxPath-len(dir)-1))
	if len(path) != MaxPath {
		t.Fatalf("path of %d bytes", len(path))
	}
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got, errc, _ := acceptOne(l)
	if err := Send(path, [3]*os.File{}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, f := range waitFiles(t, got, errc) {
		f.Close()
	}
	if _, err := Listen(path + "x"); err == nil || !strings.Contains(err.Error(), "more than a socket address holds") {
		t.Fatalf("too long: %v", err)
	}
}

func TestAnOKThatDoesNotGoThroughLeavesTheRelayAdoptable(t *testing.T) {
	path := filepath.Join(shortDir(t), "r.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got, errc, refused := acceptOne(l)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	conn := c.(*net.UnixConn)
	conn.CloseRead() // a stand-in that gave up: the relay's OK fails with EPIPE
	r, w := pipe(t)
	null := int(os.Stdin.Fd())
	if _, _, err := conn.WriteMsgUnix([]byte(Hello), unix.UnixRights(null, int(w.Fd()), null), nil); err != nil {
		t.Fatal(err)
	}
	w.Close()
	r.SetReadDeadline(deadline(t))
	if n, err := r.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read %d, %v: the relay kept a descriptor it did not answer OK for", n, err)
	}
	conn.Close()
	for {
		err := Send(path, [3]*os.File{}, time.Second)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ENOENT) || time.Now().After(deadline(t)) {
			t.Fatalf("after a failed OK: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // the socket is being created again
	}
	for _, f := range waitFiles(t, got, errc) {
		f.Close()
	}
	var e *Error
	if len(*refused) != 1 || !errors.As((*refused)[0], &e) || e.Step != "reply" || !errors.Is(e, syscall.EPIPE) {
		t.Fatalf("refused %v", *refused)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left after the adoption: %v", err)
	}
}
