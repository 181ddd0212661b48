package fetch

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Align is O_DIRECT's offset, length and address alignment; the page size
// covers every block size.
const Align = 4096

// Fill executes one FillPlan: a pull's ranged GETs, each chunk verified and
// written to its places, whole pages with O_DIRECT where the plan asks and
// the file system allows. Memory: each of the plan's workers holds one
// range buffer (the largest range) and one Verifier (the largest chunk).
type Fill struct {
	p      *FillPlan
	fds    []*os.File
	dfds   []*os.File // O_DIRECT twins, nil where the file system refuses them
	direct atomic.Bool
	getter *Getter

	written, directBytes                    atomic.Int64
	fetchedChunks, fetchedBytes, fetchedRaw atomic.Int64
	maxRange                                int
	started                                 time.Time
}

// FillStats is what thaw-fetch reports at the end (its "stats" line; read by
// control/images/transfer.py into FillStats).
type FillStats struct {
	FetchedChunks int64   `json:"fetched_chunks"`
	FetchedBytes  int64   `json:"fetched_bytes"` // stored bytes received
	FetchedRaw    int64   `json:"fetched_raw_bytes"`
	WrittenBytes  int64   `json:"written_bytes"`
	DirectBytes   int64   `json:"direct_bytes"` // of WrittenBytes, written with O_DIRECT
	Retries       int64   `json:"retries"`
	Seconds       float64 `json:"seconds"`
}

// NewFill checks the plan against its files and opens them. The caller
// calls Run, then Close.
func NewFill(p *FillPlan) (*Fill, error) {
	sizes, err := fileSizes(p.Files)
	if err != nil {
		return nil, err
	}
	if err := p.check(sizes); err != nil {
		return nil, err
	}
	f := &Fill{p: p, started: time.Now()}
	for _, path := range p.Files {
		fd, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.fds = append(f.fds, fd)
		var d *os.File
		if p.DirectIO {
			d, _ = os.OpenFile(path, os.O_WRONLY|syscall.O_DIRECT, 0) // nil: buffered only
		}
		f.dfds = append(f.dfds, d)
	}
	f.direct.Store(p.DirectIO)
	for _, r := range p.Ranges {
		f.maxRange = max(f.maxRange, r.Length)
	}
	f.getter = NewGetter(p.Workers, p.Retry.OrDefault(), time.Duration(p.TimeoutS*float64(time.Second)))
	return f, nil
}

// Getter is the fill's Getter (tests set its Clock).
func (f *Fill) Getter() *Getter { return f.getter }

// Close closes the files.
func (f *Fill) Close() {
	for _, fd := range f.fds {
		fd.Close()
	}
	for _, fd := range f.dfds {
		if fd != nil {
			fd.Close()
		}
	}
}

// Written is the number of bytes written so far (progress).
func (f *Fill) Written() int64 { return f.written.Load() }

// Stats of the run so far.
func (f *Fill) Stats() FillStats {
	return FillStats{FetchedChunks: f.fetchedChunks.Load(), FetchedBytes: f.fetchedBytes.Load(),
		FetchedRaw: f.fetchedRaw.Load(), WrittenBytes: f.written.Load(), DirectBytes: f.directBytes.Load(),
		Retries: f.getter.Retries.Load(), Seconds: time.Since(f.started).Seconds()}
}

// Run executes every range on the plan's workers; the first failure stops
// the rest (ranges not started are dropped, GETs in flight are cancelled)
// and is returned, an *Error.
func (f *Fill) Run(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	work := make(chan *Range)
	var once sync.Once
	var first error
	fail := func(err error) {
		once.Do(func() { first = err; cancel() })
	}
	var wg sync.WaitGroup
	for w := 0; w < f.p.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := alignedBuffer(f.maxRange + 2*Align)
			v := &Verifier{}
			for r := range work {
				if ctx.Err() != nil {
					continue
				}
				if err := f.one(ctx, r, buf, v); err != nil {
					fail(err)
				}
			}
		}()
	}
	for i := range f.p.Ranges {
		select {
		case work <- &f.p.Ranges[i]:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	return first
}

// one fetches a range, verifies each chunk, and writes it to its places.
func (f *Fill) one(ctx context.Context, r *Range, buf []byte, v *Verifier) error {
	// Place the body so that the first uncompressed chunk's bytes sit at its
	// file offset modulo Align: runs of such chunks can then go out with
	// O_DIRECT straight from the buffer (decoded chunks are copies anyway).
	pad := 0
	for _, c := range r.Chunks {
		if c.Codec == CodecNone && c.Key == nil {
			pad = int(((c.Places[0].Off-int64(c.Pos))%Align + Align) % Align)
			break
		}
	}
	body := buf[pad : pad+r.Length]
	obj := f.p.Objects[r.Object]
	if err := f.getter.GetInto(ctx, obj.URL, obj.Name, r.Start, body, nil); err != nil {
		return err
	}
	type segment struct {
		file   int
		off    int64
		pos, n int
	}
	var segs []segment // runs of uncompressed chunks, contiguous in the body and in a file
	for i := range r.Chunks {
		c := &r.Chunks[i]
		data, err := v.open(&c.Chunk, body[c.Pos:c.Pos+c.Stored], obj.Name, r.Start+int64(c.Pos), c.Places[0].Off)
		if err != nil {
			return err
		}
		rest := c.Places
		if c.Codec == CodecNone && c.Key == nil { // its stored bytes are its raw bytes: write them from the body
			pl := rest[0]
			if n := len(segs); n > 0 && segs[n-1].file == pl.File && segs[n-1].off+int64(segs[n-1].n) == pl.Off &&
				segs[n-1].pos+segs[n-1].n == c.Pos {
				segs[n-1].n += c.Stored
			} else {
				segs = append(segs, segment{pl.File, pl.Off, c.Pos, c.Stored})
			}
			rest = rest[1:]
		}
		// Decoded or decrypted bytes live in the Verifier until its next chunk: write them now
		// (a sealed uncompressed chunk's first place with O_DIRECT: open put it at a congruent address).
		for _, pl := range rest {
			if err := f.writeAt(pl.File, data, pl.Off); err != nil {
				return err
			}
		}
		f.fetchedChunks.Add(1)
		f.fetchedBytes.Add(int64(c.Stored))
		f.fetchedRaw.Add(int64(c.Raw))
	}
	for _, s := range segs {
		if err := f.writeAt(s.file, body[s.pos:s.pos+s.n], s.off); err != nil {
			return err
		}
	}
	return nil
}

// writeAt writes b at file offset off: its whole pages through the O_DIRECT
// twin when b sits at an address congruent to off modulo Align (those pages
// are then aligned in memory too), the partial pages at the ends through
// the page cache. A page written with O_DIRECT belongs wholly to this write,
// so no buffered write touches it.
func (f *Fill) writeAt(file int, b []byte, off int64) error {
	n := len(b)
	head := min(n, int((Align-off%Align)%Align))
	mid := (n - head) / Align * Align
	d := f.dfds[file]
	if mid == 0 || d == nil || !f.direct.Load() || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%Align != uintptr(off%Align) {
		return f.pwrite(f.fds[file], b, off)
	}
	if err := f.pwrite(d, b[head:head+mid], off+int64(head)); err != nil {
		// EINVAL and friends from a file system that takes O_DIRECT opens but
		// not these writes: stop using it, write this one buffered.
		f.direct.Store(false)
		return f.pwrite(f.fds[file], b, off)
	}
	f.directBytes.Add(int64(mid))
	if head > 0 {
		if err := f.pwrite(f.fds[file], b[:head], off); err != nil {
			return err
		}
	}
	if tail := n - head - mid; tail > 0 {
		return f.pwrite(f.fds[file], b[head+mid:], off+int64(head+mid))
	}
	return nil
}

func (f *Fill) pwrite(fd *os.File, b []byte, off int64) error {
	if _, err := fd.WriteAt(b, off); err != nil {
		return &Error{Kind: "io", Object: fd.Name(), Offset: off, Length: len(b), Detail: err.Error()}
	}
	f.written.Add(int64(len(b)))
	return nil
}

// alignedBuffer is n bytes starting on an Align boundary (O_DIRECT needs it).
func alignedBuffer(n int) []byte {
	b := make([]byte, n+Align)
	skip := (Align - int(uintptr(unsafe.Pointer(&b[0]))%Align)) % Align
	return b[skip : skip+n]
}
