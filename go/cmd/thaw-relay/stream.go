package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

const readBuf = 32 << 10

// tail keeps the last max bytes written to it and counts the others.
type tail struct {
	max     int
	buf     []byte // the kept bytes are buf[start:], at most max of them
	start   int
	dropped int64
}

func (t *tail) write(p []byte) {
	kept := len(t.buf) - t.start
	if len(p) >= t.max {
		t.dropped += int64(kept + len(p) - t.max)
		t.buf, t.start = append(t.buf[:0], p[len(p)-t.max:]...), 0
		return
	}
	if over := kept + len(p) - t.max; over > 0 {
		t.dropped += int64(over)
		t.start += over
	}
	if len(t.buf)+len(p) > cap(t.buf) {
		// Move the kept bytes to the front of an array of up to 2 x max: each
		// move frees room for at least as many bytes as it copies, and memory
		// stays within 2 x max.
		keep := t.buf[t.start:]
		if size := min(2*t.max, 2*(len(keep)+len(p))); cap(t.buf) < size {
			nb := make([]byte, len(keep), size)
			copy(nb, keep)
			t.buf = nb
		} else {
			t.buf = t.buf[:copy(t.buf, keep)]
		}
		t.start = 0
	}
	t.buf = append(t.buf, p...)
}

func (t *tail) bytes() []byte { return t.buf[t.start:] }

// stream is one of the sandbox's outputs: read from its pipe into held until
// adoption, then into the container's stream.
type stream struct {
	name string
	src  *os.File      // the read end of the sandbox's pipe; nil: none
	done chan struct{} // closed when src reached end of file (at once when nil)

	mu      sync.Mutex // held by a write to dst: the pipe's order is the output's
	held    tail
	adopted bool
	dst     *os.File // after adoption: the container's stream; nil once closed
	eof     bool
	read    int64 // bytes read from src
}

func newStream(name string, src *os.File, max int) *stream {
	return &stream{name: name, src: src, done: make(chan struct{}), held: tail{max: max}, eof: src == nil}
}

// pump reads the sandbox's pipe to its end: a parked or broken output never
// stops it, so the sandbox never blocks on a full pipe.
func (s *stream) pump() {
	defer close(s.done)
	if s.src == nil {
		return
	}
	buf := make([]byte, readBuf)
	for {
		n, err := s.src.Read(buf)
		if n > 0 {
			s.deliver(buf[:n])
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) { // closed: the relay is ending
				diag.Printf("reading the sandbox's %s: %v", s.name, err)
			}
			break
		}
	}
	s.src.Close()
	s.mu.Lock()
	s.eof = true
	if s.adopted {
		s.closeDstLocked()
	}
	s.mu.Unlock()
}

func (s *stream) deliver(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.read += int64(len(p))
	if !s.adopted {
		s.held.write(p)
	} else if s.dst != nil {
		s.writeLocked(p)
	}
}

// writeLocked writes to dst; on failure the container's stream is closed and
// what follows discarded.
func (s *stream) writeLocked(p []byte) {
	if _, err := s.dst.Write(p); err != nil {
		if !errors.Is(err, syscall.EPIPE) {
			diag.Printf("writing the container's %s: %v; discarding the rest", s.name, err)
		}
		s.closeDstLocked()
	}
}

func (s *stream) closeDstLocked() {
	if s.dst != nil {
		s.dst.Close()
		s.dst = nil
	}
}

// adoptLocked writes notice and the held output to dst and makes dst the
// stream's destination; it unlocks s.mu, which its caller locked.
func (s *stream) adoptLocked(dst *os.File, notice string) {
	defer s.mu.Unlock()
	s.adopted, s.dst = true, dst
	if notice != "" {
		s.writeLocked([]byte(notice))
	}
	if kept := s.held.bytes(); len(kept) > 0 && s.dst != nil {
		s.writeLocked(kept)
	}
	s.held = tail{}
	if s.eof {
		s.closeDstLocked()
	}
}

func (s *stream) bytesRead() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.read
}

// stdio is the sandbox's side of the three pipes.
type stdio struct {
	in          *os.File // the write end of the sandbox's stdin pipe; nil: none
	out, errOut *stream
	outputsDone chan struct{} // closed when both outputs reached end of file
}

func newStdio(in, out, errOut *os.File, bufferBytes int) *stdio {
	return &stdio{in: in, out: newStream("stdout", out, bufferBytes), errOut: newStream("stderr", errOut, bufferBytes),
		outputsDone: make(chan struct{})}
}

func (sb *stdio) start() {
	go sb.out.pump()
	go sb.errOut.pump()
	go func() {
		<-sb.out.done
		<-sb.errOut.done
		close(sb.outputsDone)
	}()
}

// hold stops the outputs where they are: the pumps wait (the sandbox's
// pipes hold what it writes meanwhile). release or adoptHeld must follow.
func (sb *stdio) hold() {
	sb.out.mu.Lock()
	sb.errOut.mu.Lock()
}

func (sb *stdio) release() {
	sb.errOut.mu.Unlock()
	sb.out.mu.Unlock()
}

// adoptHeld starts relaying to the container's stdin, stdout and stderr;
// the outputs must be held (hold), and are released once their buffers went
// out.
func (sb *stdio) adoptHeld(files [3]*os.File) {
	notice := ""
	if n := sb.out.held.dropped + sb.errOut.held.dropped; n > 0 {
		notice = fmt.Sprintf(droppedNotice, n)
	}
	// One goroutine each: a container that reads its stderr only after its
	// stdout's end must not stall on a full stderr pipe.
	go sb.out.adoptLocked(files[1], "")
	go sb.errOut.adoptLocked(files[2], notice)
	go copyStdin(sb.in, files[0])
}

// copyStdin copies the container's stdin to the sandbox's until either ends;
// closing the sandbox's write end then is what a pipe's end of file is.
func copyStdin(sandbox, container *os.File) {
	defer container.Close()
	if sandbox == nil {
		return
	}
	defer sandbox.Close()
	buf := make([]byte, readBuf)
	for {
		n, err := container.Read(buf)
		if n > 0 {
			if _, werr := sandbox.Write(buf[:n]); werr != nil {
				if !errors.Is(werr, syscall.EPIPE) {
					diag.Printf("writing the sandbox's stdin: %v", werr)
				}
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				diag.Printf("reading the container's stdin: %v", err)
			}
			return
		}
	}
}

// close ends the relay's side, once the outputs are done or when no adoption
// came: it waits for buffered output being written (the stream locks), then
// closes what is left.
func (sb *stdio) close() {
	for _, s := range []*stream{sb.out, sb.errOut} {
		if s.src != nil {
			s.src.Close() // a second close is harmless: the pump closes it at end of file
		}
		s.mu.Lock()
		s.closeDstLocked()
		s.mu.Unlock()
	}
	if sb.in != nil {
		sb.in.Close()
	}
}
