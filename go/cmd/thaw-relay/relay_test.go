package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thaw.dev/thaw/go/internal/relay"
)

// deadline is when a test gives up waiting: its own deadline less a margin,
// or 30 s.
func deadline(t *testing.T) time.Time {
	if d, ok := t.Deadline(); ok {
		return d.Add(-2 * time.Second)
	}
	return time.Now().Add(30 * time.Second)
}

func socketPath(t *testing.T) string {
	dir, err := os.MkdirTemp("", "tr") // short: t.TempDir's path carries the test's name
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "r.sock")
}

func pipe(t *testing.T) (*os.File, *os.File) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// sandbox is what the sandbox's processes hold of the relay's pipes.
type sandbox struct {
	stdin          *os.File // read end
	stdout, stderr *os.File // write ends
}

// container is what the shim holds of the container's stdio pipes; sent are
// the other ends, the ones the stand-in hands to the relay.
type container struct {
	stdin          *os.File // write end
	stdout, stderr *os.File // read ends
	sent           [3]*os.File
}

func newContainer(t *testing.T) *container {
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	errR, errW := pipe(t)
	for _, f := range []*os.File{inW, outR, errR} {
		f.SetDeadline(deadline(t))
	}
	return &container{stdin: inW, stdout: outR, stderr: errR, sent: [3]*os.File{inR, outW, errW}}
}

// adopt does what the stand-in does, then drops its copies, as the
// stand-in's exit would.
func (c *container) adopt(t *testing.T, socket string) {
	t.Helper()
	if err := relay.Send(socket, c.sent, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, f := range c.sent {
		f.Close()
	}
}

// readAll reads both outputs to their end, at the same time (as the shim does).
func (c *container) readAll(t *testing.T) (string, string) {
	t.Helper()
	var out, errOut []byte
	var outErr, errErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); out, outErr = io.ReadAll(c.stdout) }()
	go func() { defer wg.Done(); errOut, errErr = io.ReadAll(c.stderr) }()
	wg.Wait()
	if outErr != nil || errErr != nil {
		t.Fatalf("reading the container's outputs: %v, %v (read %d and %d bytes)", outErr, errErr, len(out), len(errOut))
	}
	return string(out), string(errOut)
}

type relayRun struct {
	rc    chan int
	ready chan struct{}
	stop  chan struct{}
	sb    *stdio
	sand  sandbox
}

// start runs the relay in-process over fresh sandbox pipes and waits until it
// listens.
func start(t *testing.T, c config) *relayRun {
	t.Helper()
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	errR, errW := pipe(t)
	for _, f := range []*os.File{inR, outW, errW} {
		f.SetDeadline(deadline(t))
	}
	r := &relayRun{rc: make(chan int, 1), ready: make(chan struct{}), stop: make(chan struct{}),
		sb: newStdio(inW, outR, errR, c.bufferBytes), sand: sandbox{stdin: inR, stdout: outW, stderr: errW}}
	go func() { r.rc <- run(c, r.sb, func() error { close(r.ready); return nil }, r.stop) }()
	select {
	case <-r.ready:
	case rc := <-r.rc:
		t.Fatalf("the relay exited %d before it was ready", rc)
	case <-time.After(time.Until(deadline(t))):
		t.Fatal("the relay did not get ready")
	}
	return r
}

func (r *relayRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case rc := <-r.rc:
		return rc
	case <-time.After(time.Until(deadline(t))):
		t.Fatal("the relay did not exit")
	}
	return -1
}

// drained waits until the relay has read n bytes of the sandbox's stdout and
// m of its stderr.
func (r *relayRun) drained(t *testing.T, n, m int64) {
	t.Helper()
	for r.sb.out.bytesRead() < n || r.sb.errOut.bytesRead() < m {
		if time.Now().After(deadline(t)) {
			t.Fatalf("the relay read %d and %d bytes, not %d and %d", r.sb.out.bytesRead(), r.sb.errOut.bytesRead(), n, m)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func gone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket %s still there: %v", path, err)
	}
}

func cfg(socket string, buffer int) config {
	return config{socket: socket, stdinFD: 3, stdoutFD: 4, stderrFD: 5, bufferBytes: buffer}
}

func TestAdoptionDeliversTheLastBufferedBytesThenLiveOutputInOrder(t *testing.T) {
	sock := socketPath(t)
	r := start(t, cfg(sock, 1000))
	st, err := os.Lstat(sock)
	if err != nil || st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v, %v", st, err)
	}
	var early bytes.Buffer
	for i := 0; early.Len() < 300<<10; i++ { // far more than a pipe holds: the relay must drain it
		fmt.Fprintf(&early, "line %d\n", i)
	}
	if _, err := r.sand.stdout.Write(early.Bytes()); err != nil {
		t.Fatalf("a parked sandbox blocked on its stdout: %v", err)
	}
	r.sand.stderr.Write([]byte("early error\n"))
	r.drained(t, int64(early.Len()), 12)

	c := newContainer(t)
	c.adopt(t, sock)
	gone(t, sock)
	if _, err := net.Dial("unix", sock); err == nil {
		t.Fatal("a connection after adoption")
	}
	r.sand.stdout.Write([]byte("live out\n"))
	r.sand.stderr.Write([]byte("live error\n"))
	r.sand.stdout.Close()
	r.sand.stderr.Close()
	out, errOut := c.readAll(t)
	if want := string(early.Bytes()[early.Len()-1000:]) + "live out\n"; out != want {
		t.Fatalf("stdout: %d bytes %q...; want %d bytes %q...", len(out), out[:min(40, len(out))], len(want), want[:40])
	}
	notice := fmt.Sprintf(droppedNotice, early.Len()-1000)
	if want := notice + "early error\nlive error\n"; errOut != want {
		t.Fatalf("stderr %q, want %q", errOut, want)
	}
	if rc := r.wait(t); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
}

func TestNothingDroppedMeansNoNotice(t *testing.T) {
	sock := socketPath(t)
	r := start(t, cfg(sock, 1<<20))
	r.sand.stderr.Write([]byte("warming up\n"))
	r.drained(t, 0, 11)
	c := newContainer(t)
	c.adopt(t, sock)
	r.sand.stdout.Close()
	r.sand.stderr.Close()
	if out, errOut := c.readAll(t); out != "" || errOut != "warming up\n" {
		t.Fatalf("%q, %q", out, errOut)
	}
	r.wait(t)
}

func TestStdinIsRelayedAndItsEndOfFileReachesTheSandbox(t *testing.T) {
	sock := socketPath(t)
	r := start(t, cfg(sock, 1000))
	c := newContainer(t)
	c.adopt(t, sock)
	c.stdin.Write([]byte("hello sandbox\n"))
	line, err := bufio.NewReader(r.sand.stdin).ReadString('\n')
	if err != nil || line != "hello sandbox\n" {
		t.Fatalf("sandbox read %q, %v", line, err)
	}
	c.stdin.Close()
	if n, err := r.sand.stdin.Read(make([]byte, 16)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the container's stdin closed: %d, %v", n, err)
	}
	r.sand.stdout.Close()
	r.sand.stderr.Close()
	if rc := r.wait(t); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
}

func TestAWrongMessageIsRefusedAndALaterAdoptionWorks(t *testing.T) {
	sock := socketPath(t)
	r := start(t, cfg(sock, 1000))
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(deadline(t))
	one, _ := os.Open(os.DevNull)
	defer one.Close()
	if _, _, err := conn.(*net.UnixConn).WriteMsgUnix([]byte(relay.Hello), unix.UnixRights(int(one.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if err != nil || !strings.HasPrefix(line, "error: ") || !strings.Contains(line, "carried 1 descriptor(s)") {
		t.Fatalf("answer %q, %v", line, err)
	}
	r.sand.stdout.Write([]byte("still buffered\n"))
	c := newContainer(t)
	c.adopt(t, sock)
	r.sand.stdout.Close()
	r.sand.stderr.Close()
	if out, _ := c.readAll(t); out != "still buffered\n" {
		t.Fatalf("stdout %q", out)
	}
	r.wait(t)
}

func TestTheRelayEndsWhenTheSandboxOutputsCloseBeforeAdoption(t *testing.T) {
	sock := socketPath(t)
	r := start(t, cfg(sock, 1000))
	r.sand.stdout.Write([]byte("bye\n"))
	r.sand.stdout.Close()
	r.sand.stderr.Close()
	if rc := r.wait(t); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	gone(t, sock)
	// The sandbox's stdin write end went with it.
	r.sand.stdin.SetReadDeadline(deadline(t))
	if n, err := r.sand.stdin.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("sandbox stdin: %d, %v", n, err)
	}
}

func TestABrokenContainerStdoutKeepsTheSandboxDrained(t *testing.T) {
	sock := socketPath(t)
	r := start(t, cfg(sock, 1000))
	c := newContainer(t)
	c.adopt(t, sock)
	c.stdout.Close() // the reader went away: writes to it fail with EPIPE
	big := bytes.Repeat([]byte("x"), 1<<20)
	if _, err := r.sand.stdout.Write(big); err != nil {
		t.Fatalf("the sandbox blocked on its stdout: %v", err)
	}
	r.sand.stderr.Write([]byte("stderr still flows\n"))
	buf := make([]byte, 64)
	n, err := c.stderr.Read(buf)
	if err != nil || string(buf[:n]) != "stderr still flows\n" {
		t.Fatalf("stderr %q, %v", buf[:n], err)
	}
	r.sand.stdout.Close()
	r.sand.stderr.Close()
	if rc := r.wait(t); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
}

func TestNoAdoptionWithinTheAcceptTimeoutEndsTheRelay(t *testing.T) {
	sock := socketPath(t)
	c := cfg(sock, 1000)
	c.acceptTimeout = 200 * time.Millisecond
	r := start(t, c)
	if rc := r.wait(t); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	gone(t, sock)
}

func TestStopRemovesTheSocketAndEndsAtOnce(t *testing.T) {
	sock := socketPath(t)
	r := start(t, cfg(sock, 1000))
	close(r.stop)
	if rc := r.wait(t); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	gone(t, sock)
}

func TestBadArguments(t *testing.T) {
	full := []string{"-socket", "/run/r.sock", "-stdin-fd", "3", "-stdout-fd", "4", "-stderr-fd", "5"}
	if c, err := parse(full); err != nil || c.bufferBytes != 1<<20 || c.acceptTimeout != 0 {
		t.Fatalf("%+v, %v", c, err)
	}
	if c, err := parse(append(full, "-accept-timeout", "1.5", "-buffer-bytes", "0")); err != nil ||
		c.acceptTimeout != 1500*time.Millisecond || c.bufferBytes != 0 {
		t.Fatalf("%+v, %v", c, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{full[2:], "-socket is required"},
		{full[:6], "-stderr-fd is required"},
		{[]string{"-socket", "s", "-stdin-fd", "3", "-stdout-fd", "-1", "-stderr-fd", "-1"}, "both -1"},
		{[]string{"-socket", "s", "-stdin-fd", "-1", "-stdout-fd", "1", "-stderr-fd", "5"}, "the relay's own"},
		{[]string{"-socket", "s", "-stdin-fd", "4", "-stdout-fd", "4", "-stderr-fd", "5"}, "also -stdin-fd"},
		{append(full, "-buffer-bytes", "-1"), "-buffer-bytes"},
		{append(full, "-accept-timeout", "-2"), "-accept-timeout"},
		{append(full, "extra"), "unexpected argument"},
		{append(full, "-bogus"), "bogus"},
	} {
		if _, err := parse(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// The binary, end to end.

var built struct {
	once sync.Once
	path string
	err  error
}

func relayBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			built.err = fmt.Errorf("go not on PATH: %w", err)
			return
		}
		dir, err := os.MkdirTemp("", "thaw-relay-bin")
		if err != nil {
			built.err = err
			return
		}
		built.path = filepath.Join(dir, "thaw-relay")
		cmd := exec.Command(goBin, "build", "-buildvcs=false", "-o", built.path, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

func TestMain(m *testing.M) {
	rc := m.Run()
	if built.path != "" {
		os.RemoveAll(filepath.Dir(built.path))
	}
	os.Exit(rc)
}

type process struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	sand   sandbox
	exited chan error
}

// spawn starts the binary as thawd does: the sandbox's pipe ends as
// descriptors 3, 4, 5, stdout a pipe that carries the ready line.
func spawn(t *testing.T, sock string, extra ...string) *process {
	t.Helper()
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	errR, errW := pipe(t)
	readyR, readyW := pipe(t)
	p := &process{stderr: new(bytes.Buffer), sand: sandbox{stdin: inR, stdout: outW, stderr: errW}, exited: make(chan error, 1)}
	args := append([]string{"-socket", sock, "-stdin-fd", "3", "-stdout-fd", "4", "-stderr-fd", "5"}, extra...)
	p.cmd = exec.Command(relayBinary(t), args...)
	p.cmd.ExtraFiles = []*os.File{inW, outR, errR}
	p.cmd.Stdout, p.cmd.Stderr = readyW, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cmd.Process.Kill() })
	go func() { p.exited <- p.cmd.Wait() }()
	for _, f := range []*os.File{inW, outR, errR, readyW} {
		f.Close()
	}
	readyR.SetReadDeadline(deadline(t))
	got, err := io.ReadAll(readyR) // the ready line, then end of file: the relay closed its stdout
	if err != nil || string(got) != "ready\n" {
		t.Fatalf("stdout %q, %v; stderr %s", got, err, p.stderr)
	}
	return p
}

// emptied waits until the pipe of write end w holds nothing: the relay read
// it all (FIONREAD, alias TIOCINQ, counts the pipe's bytes from either end).
func emptied(t *testing.T, w *os.File) {
	t.Helper()
	for {
		n, err := unix.IoctlGetInt(int(w.Fd()), unix.TIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline(t)) {
			t.Fatalf("%d bytes still in the pipe", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *process) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(time.Until(deadline(t))):
		t.Fatalf("thaw-relay did not exit; stderr %s", p.stderr)
	}
	return -1
}

func TestTheBinaryRelaysAParkedSandbox(t *testing.T) {
	sock := socketPath(t)
	p := spawn(t, sock, "-buffer-bytes", "8")
	if st, err := os.Lstat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v, %v", st, err)
	}
	p.sand.stdout.Write([]byte("0123456789")) // 10 bytes through a buffer of 8
	emptied(t, p.sand.stdout)
	c := newContainer(t)
	c.adopt(t, sock)
	gone(t, sock)
	c.stdin.Write([]byte("in\n"))
	c.stdin.Close()
	r := bufio.NewReader(p.sand.stdin)
	p.sand.stdin.SetReadDeadline(deadline(t))
	if line, err := r.ReadString('\n'); line != "in\n" || err != nil {
		t.Fatalf("sandbox stdin %q, %v", line, err)
	}
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("sandbox stdin after the container's closed: %v", err)
	}
	p.sand.stdout.Write([]byte("live\n"))
	p.sand.stdout.Close()
	p.sand.stderr.Close()
	out, errOut := c.readAll(t)
	// The pipe is empty, but the relay's last read may not have reached its
	// buffer when the adoption came: then those bytes are live output, not
	// dropped. (In-process tests wait for the buffer itself.)
	buffered := out == "23456789live\n" && errOut == fmt.Sprintf(droppedNotice, 2)
	inFlight := out == "0123456789live\n" && errOut == ""
	if !buffered && !inFlight {
		t.Fatalf("stdout %q, stderr %q", out, errOut)
	}
	if rc := p.wait(t); rc != 0 {
		t.Fatalf("exit %d; stderr %s", rc, p.stderr)
	}
}

func TestTheBinaryEndsOnSIGTERMAndRemovesTheSocket(t *testing.T) {
	sock := socketPath(t)
	p := spawn(t, sock)
	p.cmd.Process.Signal(syscall.SIGTERM)
	if rc := p.wait(t); rc != 0 {
		t.Fatalf("exit %d; stderr %s", rc, p.stderr)
	}
	gone(t, sock)
}

func TestTheBinaryRefusesBadArguments(t *testing.T) {
	bin := relayBinary(t)
	for _, args := range [][]string{
		{},
		{"-socket", socketPath(t), "-stdin-fd", "-1", "-stdout-fd", "9", "-stderr-fd", "-1"}, // 9 is not open
	} {
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), "usage: thaw-relay -socket PATH") {
			t.Fatalf("%v: %v; stderr %s", args, err, &stderr)
		}
	}
}
