package main

import (
	"bytes"
	"errors"
	"io"
	"os"
)

// The smallest -max-bytes: a bound below one read buffer would rotate on
// every read.
const minMaxBytes = 64 << 10

const readBuf = 32 << 10

// rotating is a log file that never grows past max bytes: a write that would
// cross the bound first moves the file to path.1 (replacing the previous
// one) and starts an empty file.
type rotating struct {
	path string
	max  int64
	f    *os.File
	size int64
}

func openRotating(path string, max int64) (*rotating, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &rotating{path: path, max: max, f: f, size: st.Size()}, nil
}

// Write keeps whole lines together where it can: when p does not fit, the
// part up to its last newline that fits goes into the current file, the
// rest into the next one. A line longer than the bound is cut.
func (r *rotating) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		room := r.max - r.size
		if int64(len(p)) <= room {
			n, err := r.f.Write(p)
			r.size += int64(n)
			return written + n, err
		}
		cut := 0
		if room > 0 {
			cut = bytes.LastIndexByte(p[:room], '\n') + 1
			if cut == 0 && r.size == 0 {
				cut = int(room) // one line longer than the whole file: cut it
			}
		}
		if cut > 0 {
			n, err := r.f.Write(p[:cut])
			r.size += int64(n)
			written += n
			if err != nil {
				return written, err
			}
			p = p[cut:]
		}
		if err := r.rotate(); err != nil {
			return written, err
		}
	}
	return written, nil
}

func (r *rotating) rotate() error {
	if err := os.Rename(r.path, r.path+".1"); err != nil {
		return err
	}
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	r.f.Close()
	r.f, r.size = f, 0
	return nil
}

func (r *rotating) Close() error { return r.f.Close() }

// pump copies in to w until in reaches end of file (every writer closed).
// A failing write (disk full) drops that data and keeps reading: the
// workload must never block on a full pipe because its log cannot be
// written.
func pump(in io.Reader, w io.Writer) error {
	buf := make([]byte, readBuf)
	var firstErr error
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil && firstErr == nil {
				firstErr = werr
			}
		}
		if errors.Is(err, io.EOF) {
			return firstErr
		}
		if err != nil {
			return err
		}
	}
}
