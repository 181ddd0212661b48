package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/klauspost/compress/zlib" // inflates ~1.25x faster than compress/zlib here (docs/store.md)
	"github.com/zeebo/blake3"
)

// align is O_DIRECT's offset, length and address alignment; the page size
// covers every block size. Twin: control/transfer.py ALIGN.
const align = 4096

// fetchError is what the caller turns into IntegrityError or StoreError.
type fetchError struct {
	Kind   string `json:"kind"` // integrity | store | io
	Chunk  string `json:"chunk,omitempty"`
	Object string `json:"object,omitempty"`
	Offset int64  `json:"offset"`
	Length int    `json:"length,omitempty"`
	Detail string `json:"detail"`
}

func (e *fetchError) Error() string {
	return fmt.Sprintf("%s %s %s@%d: %s", e.Kind, e.Chunk, e.Object, e.Offset, e.Detail)
}

type job struct {
	p      *plan
	fds    []*os.File
	dfds   []*os.File // O_DIRECT twins, nil where the file system refuses them
	direct atomic.Bool
	client *http.Client

	written, directBytes                    atomic.Int64
	fetchedChunks, fetchedBytes, fetchedRaw atomic.Int64
	retries                                 atomic.Int64
	maxRange, maxRaw                        int
	maxSealed                               int // largest sealed chunk, 0 if none (crypt.go)
	started                                 time.Time
}

func newJob(p *plan) (*job, error) {
	sizes, err := fileSizes(p.Files)
	if err != nil {
		return nil, err
	}
	if err := p.check(sizes); err != nil {
		return nil, err
	}
	j := &job{p: p, started: time.Now()}
	for _, path := range p.Files {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			j.close()
			return nil, err
		}
		j.fds = append(j.fds, f)
		var d *os.File
		if p.DirectIO {
			d, _ = os.OpenFile(path, os.O_WRONLY|syscall.O_DIRECT, 0) // nil: buffered only
		}
		j.dfds = append(j.dfds, d)
	}
	j.direct.Store(p.DirectIO)
	for _, r := range p.Ranges {
		j.maxRange = max(j.maxRange, r.length)
		for _, c := range r.chunks {
			if c.codec != codecNone {
				j.maxRaw = max(j.maxRaw, c.raw)
			}
			if c.key != nil {
				j.maxSealed = max(j.maxSealed, c.stored)
			}
		}
	}
	timeout := time.Duration(p.TimeoutS * float64(time.Second))
	j.client = &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment, // as botocore honours HTTP(S)_PROXY
		DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   p.Workers,
		DisableCompression:    true, // a ranged GET must come back as the stored bytes
		ResponseHeaderTimeout: timeout,
		ReadBufferSize:        256 << 10,
	}}
	return j, nil
}

func (j *job) close() {
	for _, f := range j.fds {
		f.Close()
	}
	for _, f := range j.dfds {
		if f != nil {
			f.Close()
		}
	}
}

func (j *job) stats() map[string]any {
	return map[string]any{
		"fetched_chunks": j.fetchedChunks.Load(), "fetched_bytes": j.fetchedBytes.Load(),
		"fetched_raw_bytes": j.fetchedRaw.Load(), "written_bytes": j.written.Load(),
		"direct_bytes": j.directBytes.Load(), "retries": j.retries.Load(),
		"seconds": time.Since(j.started).Seconds(),
	}
}

// run executes every range on p.Workers goroutines; the first failure stops
// the rest (ranges not started are dropped, GETs in flight are cancelled).
func (j *job) run(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	work := make(chan *rng)
	var once sync.Once
	var first error
	fail := func(err error) {
		once.Do(func() { first = err; cancel() })
	}
	var wg sync.WaitGroup
	for w := 0; w < j.p.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := alignedBuffer(j.maxRange + 2*align)
			scratch := make([]byte, j.maxRaw)
			var opened []byte // where sealed chunks are decrypted to (aligned: O_DIRECT writes from it)
			if j.maxSealed > 0 {
				opened = alignedBuffer(j.maxSealed + align)
			}
			inflater := &inflater{}
			for r := range work {
				if ctx.Err() != nil {
					continue
				}
				if err := j.one(ctx, r, buf, scratch, opened, inflater); err != nil {
					fail(err)
				}
			}
		}()
	}
	for i := range j.p.Ranges {
		select {
		case work <- &j.p.Ranges[i]:
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
func (j *job) one(ctx context.Context, r *rng, buf, scratch, opened []byte, inf *inflater) error {
	// Place the body so that the first uncompressed chunk's bytes sit at its
	// file offset modulo align: runs of such chunks can then go out with
	// O_DIRECT straight from the buffer (decoded chunks are copies anyway).
	pad := 0
	for _, c := range r.chunks {
		if c.codec == codecNone && c.key == nil {
			pad = int(((c.places[0].off-int64(c.pos))%align + align) % align)
			break
		}
	}
	body := buf[pad : pad+r.length]
	if err := j.get(ctx, r, body); err != nil {
		return err
	}
	obj := j.p.Objects[r.obj].Name
	type segment struct {
		file   int
		off    int64
		pos, n int
	}
	var segs []segment
	for i := range r.chunks {
		c := &r.chunks[i]
		data := body[c.pos : c.pos+c.stored]
		at := 0 // where a sealed chunk's payload starts in opened
		if c.key != nil {
			if c.codec == codecNone { // its payload is its raw bytes: put them at their file offset modulo align
				at = int(c.places[0].off % align)
			}
			var err error
			if data, err = openChunk(c.key, c.sum, c.codec, data, opened[at:at]); err != nil {
				return &fetchError{Kind: "integrity", Chunk: hex.EncodeToString(c.sum[:]), Object: obj,
					Offset: r.start + int64(c.pos), Detail: fmt.Sprintf("bytes at %s offset %d do not open (%v): "+
						"the stored chunk was altered or damaged", obj, r.start+int64(c.pos), err)}
			}
		}
		if c.codec == codecZlib {
			var err error
			if data, err = inf.decode(data, scratch[:c.raw]); err != nil {
				return &fetchError{Kind: "integrity", Chunk: hex.EncodeToString(c.sum[:]), Object: obj,
					Offset: r.start + int64(c.pos), Detail: fmt.Sprintf("bytes at %s offset %d do not decode (%v): "+
						"the stored chunk was altered or damaged", obj, r.start+int64(c.pos), err)}
			}
		}
		// A schema-2 manifest carries each chunk's BLAKE3 beside its SHA-256 name:
		// checking that costs about half as much CPU per byte here (docs/store.md).
		algo, want, got := "sha256", c.sum, [32]byte{}
		if c.hasCheck {
			algo, want, got = "blake3", c.check, blake3.Sum256(data)
		} else {
			got = sha256.Sum256(data)
		}
		if got != want {
			return &fetchError{Kind: "integrity", Chunk: hex.EncodeToString(c.sum[:]), Object: obj,
				Offset: r.start + int64(c.pos), Detail: fmt.Sprintf("bytes at %s offset %d have %s %x, not %x: "+
					"the stored chunk was altered or damaged", obj, r.start+int64(c.pos), algo, got, want)}
		}
		rest := c.places
		if c.codec == codecNone && c.key != nil { // opened in place for an O_DIRECT write; write it now
			if err := j.writeSegment(rest[0].file, opened, at, rest[0].off, c.raw); err != nil {
				return err
			}
			rest = rest[1:]
		} else if c.codec == codecNone {
			pl := rest[0]
			if n := len(segs); n > 0 && segs[n-1].file == pl.file && segs[n-1].off+int64(segs[n-1].n) == pl.off &&
				segs[n-1].pos+segs[n-1].n == c.pos {
				segs[n-1].n += c.stored
			} else {
				segs = append(segs, segment{pl.file, pl.off, c.pos, c.stored})
			}
			rest = rest[1:]
		}
		for _, pl := range rest { // decoded bytes live in scratch: write them now
			if err := j.pwrite(j.fds[pl.file], data, pl.off); err != nil {
				return err
			}
		}
		j.fetchedChunks.Add(1)
		j.fetchedBytes.Add(int64(c.stored))
		j.fetchedRaw.Add(int64(c.raw))
	}
	for _, s := range segs {
		if err := j.writeSegment(s.file, buf, pad+s.pos, s.off, s.n); err != nil {
			return err
		}
	}
	return nil
}

// writeSegment writes buf[pos:pos+n] at file offset off: the whole pages
// through the O_DIRECT twin (buf holds them at a congruent, aligned place),
// the partial pages at the ends through the page cache. A page written with
// O_DIRECT belongs wholly to this segment, so no buffered write touches it.
func (j *job) writeSegment(file int, buf []byte, pos int, off int64, n int) error {
	head := min(n, int((align-off%align)%align))
	mid := (n - head) / align * align
	d := j.dfds[file]
	// Only a segment whose bytes sit in buf at their file offset modulo align
	// can go out with O_DIRECT (the range was placed for its first one).
	if mid == 0 || d == nil || !j.direct.Load() || (int64(pos)-off)%align != 0 {
		return j.pwrite(j.fds[file], buf[pos:pos+n], off)
	}
	if err := j.pwrite(d, buf[pos+head:pos+head+mid], off+int64(head)); err != nil {
		// EINVAL and friends from a file system that takes O_DIRECT opens but
		// not these writes: stop using it, write this segment buffered.
		j.direct.Store(false)
		return j.pwrite(j.fds[file], buf[pos:pos+n], off)
	}
	j.directBytes.Add(int64(mid))
	if head > 0 {
		if err := j.pwrite(j.fds[file], buf[pos:pos+head], off); err != nil {
			return err
		}
	}
	if tail := n - head - mid; tail > 0 {
		return j.pwrite(j.fds[file], buf[pos+head+mid:pos+n], off+int64(head+mid))
	}
	return nil
}

func (j *job) pwrite(f *os.File, b []byte, off int64) error {
	if _, err := f.WriteAt(b, off); err != nil {
		return &fetchError{Kind: "io", Object: f.Name(), Offset: off, Length: len(b), Detail: err.Error()}
	}
	j.written.Add(int64(len(b)))
	return nil
}

// get reads exactly len(body) bytes of the range's object from r.start,
// retrying what botocore's standard mode retries (connection failures,
// timeouts, 429, 5xx) up to p.Attempts attempts in all, with jittered
// exponential backoff.
func (j *job) get(ctx context.Context, r *rng, body []byte) error {
	o := j.p.Objects[r.obj]
	var last error
	for attempt := 1; ; attempt++ {
		err, retry := j.getOnce(ctx, o.URL, r.start, body)
		if err == nil {
			return nil
		}
		last = err
		if !retry || attempt >= j.p.Attempts || ctx.Err() != nil {
			break
		}
		j.retries.Add(1)
		backoff := time.Duration(rand.Float64() * float64(min(20*time.Second, (250*time.Millisecond)<<attempt)))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil && errors.Is(last, context.Canceled) {
		last = errors.New("cancelled: another range failed first")
	}
	return &fetchError{Kind: "store", Object: o.Name, Offset: r.start, Length: len(body), Detail: last.Error()}
}

var xmlField = regexp.MustCompile(`<(Code|Message)>([^<]*)</`)

func (j *job) getOnce(ctx context.Context, url string, start int64, body []byte) (error, bool) {
	// Deadline: the configured timeout plus the time to move the range at 1 MB/s.
	limit := time.Duration(j.p.TimeoutS*float64(time.Second)) + time.Duration(len(body))*time.Microsecond
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err, false
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, start+int64(len(body))-1))
	resp, err := j.client.Do(req)
	if err != nil {
		return err, true
	}
	defer resp.Body.Close()
	whole := resp.StatusCode == http.StatusOK && start == 0
	if resp.StatusCode != http.StatusPartialContent && !whole {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		detail := fmt.Sprintf("HTTP %d", resp.StatusCode)
		for _, m := range xmlField.FindAllSubmatch(msg, 2) {
			detail += " " + string(m[1]) + ": " + string(m[2])
		}
		s := resp.StatusCode
		return errors.New(detail), s == 408 || s == 429 || s >= 500
	}
	if resp.ContentLength >= 0 && resp.ContentLength != int64(len(body)) {
		return fmt.Errorf("asked for %d bytes at %d, got %d (the pack does not match its manifest)",
			len(body), start, resp.ContentLength), false
	}
	if n, err := io.ReadFull(resp.Body, body); err != nil {
		return fmt.Errorf("read %d of %d bytes at %d: %v", n, len(body), start, err), true
	}
	var one [1]byte
	if n, _ := resp.Body.Read(one[:]); n > 0 {
		return fmt.Errorf("asked for %d bytes at %d, got more (the pack does not match its manifest)",
			len(body), start), false
	}
	return nil, false
}

// inflater decodes zlib chunks, reusing its state between chunks.
type inflater struct {
	r   io.ReadCloser
	src bytes.Reader
}

func (z *inflater) decode(payload, dst []byte) ([]byte, error) {
	z.src.Reset(payload)
	if z.r == nil {
		r, err := zlib.NewReader(&z.src)
		if err != nil {
			return nil, fmt.Errorf("zlib: %v", err)
		}
		z.r = r
	} else if err := z.r.(zlib.Resetter).Reset(&z.src, nil); err != nil {
		return nil, fmt.Errorf("zlib: %v", err)
	}
	n, err := io.ReadFull(z.r, dst)
	if err != nil {
		return nil, fmt.Errorf("decodes to %d bytes, expected %d (%v)", n, len(dst), err)
	}
	var one [1]byte
	if m, err := z.r.Read(one[:]); m > 0 {
		return nil, fmt.Errorf("decodes to more than %d bytes", len(dst))
	} else if err != io.EOF {
		return nil, fmt.Errorf("zlib: %v", err) // includes a bad Adler-32
	}
	return dst, nil
}

// alignedBuffer is n bytes starting on an align boundary (O_DIRECT needs it).
func alignedBuffer(n int) []byte {
	b := make([]byte, n+align)
	skip := (align - int(uintptr(unsafe.Pointer(&b[0]))%align)) % align
	return b[skip : skip+n]
}
