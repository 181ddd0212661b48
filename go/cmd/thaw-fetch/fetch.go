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
	"net/url"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/klauspost/compress/zlib" // inflates ~1.25x faster than compress/zlib here (docs/store.md)

	"thaw.dev/thaw/go/internal/fetch"
)

// align is O_DIRECT's offset, length and address alignment; the page size
// covers every block size. Twin: control/images/transfer.py ALIGN.
const align = 4096

// fetchError is what the caller turns into IntegrityError or StoreError.
type fetchError struct {
	Kind   string `json:"kind"`            // integrity | store | io
	Store  string `json:"store,omitempty"` // scheme://host of the store, for a store error
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
	policy                                  retryPolicy
	now                                     func() time.Time                           // seams for tests
	rand                                    func() float64                             // of the retry policy
	sleep                                   func(ctx context.Context, d time.Duration) // (a fake clock)
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
	j := &job{p: p, started: time.Now(), policy: p.retry(), now: time.Now, rand: rand.Float64, sleep: sleepCtx}
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

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
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
			if data, err = fetch.OpenSealed(c.key, c.sum, c.codec, data, opened[at:at]); err != nil {
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
		// Checked against the chunk's SHA-256 name, the name the node trusts from
		// here on (its chunk index, local copies, `thaw verify`): a chunk whose
		// BLAKE3 matched a manifest's check but whose SHA-256 did not match its
		// name was installed, then called corrupt (issue 14 item 6). Once the
		// SHA-256 matches, BLAKE3 adds nothing; docs/store.md, "Integrity".
		if got := sha256.Sum256(data); got != c.sum {
			return &fetchError{Kind: "integrity", Chunk: hex.EncodeToString(c.sum[:]), Object: obj,
				Offset: r.start + int64(c.pos), Detail: fmt.Sprintf("bytes at %s offset %d have sha256 %x, not %x: "+
					"the stored chunk was altered or damaged", obj, r.start+int64(c.pos), got, c.sum)}
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
// retrying as the plan's retry policy says (retry.go: botocore's standard
// mode plus a time budget). A request that runs out of retries ends the
// pull with one error naming the object and how long it was tried.
func (j *job) get(ctx context.Context, r *rng, body []byte) error {
	o := j.p.Objects[r.obj]
	rt := newRetrier(j.policy, j.now, j.rand)
	for {
		err, f := j.getOnce(ctx, o.URL, r.start, body)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			if errors.Is(err, context.Canceled) {
				err = errors.New("cancelled: another range failed first")
			}
			return &fetchError{Kind: "store", Store: storeOf(o.URL), Object: o.Name, Offset: r.start,
				Length: len(body), Detail: err.Error()}
		}
		wait, ok := rt.next(f)
		if !ok {
			detail := err.Error()
			if retryable, _ := classify(f); retryable {
				detail += "; " + rt.gaveUp()
			}
			return &fetchError{Kind: "store", Store: storeOf(o.URL), Object: o.Name, Offset: r.start,
				Length: len(body), Detail: detail}
		}
		j.retries.Add(1)
		j.sleep(ctx, wait)
	}
}

// storeOf is a presigned URL's scheme and host, for messages: never its
// query, which holds the signature.
func storeOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

var xmlField = regexp.MustCompile(`<(Code|Message)>([^<]*)</`)

// getOnce is one try. On failure it says what happened as far as retrying
// cares (retry.go classify).
func (j *job) getOnce(ctx context.Context, rawURL string, start int64, body []byte) (error, failure) {
	// Deadline: the configured timeout plus the time to move the range at 1 MB/s.
	limit := time.Duration(j.p.TimeoutS*float64(time.Second)) + time.Duration(len(body))*time.Microsecond
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	transport := failure{transport: true, retryAfter: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return err, failure{final: true}
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, start+int64(len(body))-1))
	resp, err := j.client.Do(req)
	if err != nil {
		return err, transport
	}
	defer resp.Body.Close()
	whole := resp.StatusCode == http.StatusOK && start == 0
	if resp.StatusCode != http.StatusPartialContent && !whole {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		detail := fmt.Sprintf("HTTP %d", resp.StatusCode)
		f := failure{status: resp.StatusCode, retryAfter: retryAfterHeader(resp.Header)}
		for _, m := range xmlField.FindAllSubmatch(msg, 2) {
			detail += " " + string(m[1]) + ": " + string(m[2])
			if string(m[1]) == "Code" && f.code == "" {
				f.code = string(m[2])
			}
		}
		return errors.New(detail), f
	}
	if resp.ContentLength >= 0 && resp.ContentLength != int64(len(body)) {
		return fmt.Errorf("asked for %d bytes at %d, got %d (the pack does not match its manifest)",
			len(body), start, resp.ContentLength), failure{final: true}
	}
	if n, err := io.ReadFull(resp.Body, body); err != nil {
		return fmt.Errorf("read %d of %d bytes at %d: %v", n, len(body), start, err), transport
	}
	var one [1]byte
	if n, _ := resp.Body.Read(one[:]); n > 0 {
		return fmt.Errorf("asked for %d bytes at %d, got more (the pack does not match its manifest)",
			len(body), start), failure{final: true}
	}
	return nil, failure{}
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
