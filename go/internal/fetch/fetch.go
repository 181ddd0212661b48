// Package fetch is the store side of a fetch: ranged GETs of pack objects
// through presigned URLs, retried the way botocore's standard mode retries,
// and the check of every chunk against the manifest before a byte of it is
// used (decode, then its SHA-256 name).
//
// It is the engine of thaw-gofer's stream (go/internal/stream). thaw-fetch
// (go/cmd/thaw-fetch) holds the same logic as package main; it moves onto
// this package once the branches that edit it now (tenancy's sealed chunks,
// go-fetch-robust's retry budget) are merged, so that those edits are not
// lost in a file move.
package fetch

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
	"regexp"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zlib" // inflates ~1.25x faster than compress/zlib (docs/store.md)
)

// Codecs a stored chunk may use. Twin: control/images/chunk.py CODEC_NONE, CODEC_ZLIB.
const (
	CodecNone = "none"
	CodecZlib = "zlib"
)

// MaxChunk bounds a decoded chunk (twin: control/images/manifest.py MAX_CHUNK_BYTES).
const MaxChunk = 64 << 20

// Chunk is what the manifest says about one chunk: its names and how it is stored.
type Chunk struct {
	Sum      [32]byte // SHA-256 of the raw bytes: the chunk's name
	Check    [32]byte // BLAKE3-256 of the raw bytes (schema-2 manifests; passed on, not checked)
	HasCheck bool
	Raw      int    // decoded length
	Stored   int    // stored (encoded, and sealed when Key is set) length
	Codec    string // CodecNone or CodecZlib
	Key      []byte // AES-256-GCM key of a sealed chunk (crypt.go); nil: stored in the clear
}

// ParseHex reads a 64-digit lowercase hex digest.
func ParseHex(s string) ([32]byte, error) {
	var out [32]byte
	if len(s) != 64 {
		return out, fmt.Errorf("%q is not 64 hex digits", s)
	}
	if _, err := hex.Decode(out[:], []byte(s)); err != nil {
		return out, fmt.Errorf("%q: %v", s, err)
	}
	return out, nil
}

// Error is a failed fetch, as the caller reports it (JSON: the same fields as
// thaw-fetch's error line, so control/images turns it into the same errors).
type Error struct {
	Kind   string `json:"kind"` // integrity | store | io
	Chunk  string `json:"chunk,omitempty"`
	Object string `json:"object,omitempty"`
	Offset int64  `json:"offset"`
	Length int    `json:"length,omitempty"`
	Detail string `json:"detail"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s %s@%d: %s", e.Kind, e.Chunk, e.Object, e.Offset, e.Detail)
}

// Getter GETs byte ranges of objects.
type Getter struct {
	client   *http.Client
	attempts int
	timeout  time.Duration
	Retries  atomic.Int64
}

// NewGetter makes a Getter keeping up to conns idle connections, trying each
// GET up to attempts times; timeout bounds connecting and waiting for headers.
func NewGetter(conns, attempts int, timeout time.Duration) *Getter {
	return &Getter{attempts: max(attempts, 1), timeout: timeout, client: &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment, // as botocore honours HTTP(S)_PROXY
		DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   conns,
		DisableCompression:    true, // a ranged GET must come back as the stored bytes
		ResponseHeaderTimeout: timeout,
		ReadBufferSize:        256 << 10,
	}}}
}

// GetInto fills body with the object's bytes from start on. progress, when
// not nil, is called with how many leading bytes of body have arrived each
// time more did (so a caller can use whole chunks before the range ends); a
// retry resumes after them. Failures are *Error of kind "store".
func (g *Getter) GetInto(ctx context.Context, url, name string, start int64, body []byte, progress func(have int) error) error {
	got := 0
	var last error
	for attempt := 1; ; attempt++ {
		err, retry := g.getOnce(ctx, url, start, body, &got, progress)
		if err == nil {
			return nil
		}
		var stop *stopError
		if errors.As(err, &stop) {
			return stop.err
		}
		last = err
		if !retry || attempt >= g.attempts || ctx.Err() != nil {
			break
		}
		g.Retries.Add(1)
		backoff := time.Duration(rand.Float64() * float64(min(20*time.Second, (250*time.Millisecond)<<attempt)))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil && errors.Is(last, context.Canceled) {
		last = errors.New("cancelled")
	}
	return &Error{Kind: "store", Object: name, Offset: start, Length: len(body), Detail: last.Error()}
}

// stopError carries an error of the progress callback: not retried.
type stopError struct{ err error }

func (s *stopError) Error() string { return s.err.Error() }

var xmlField = regexp.MustCompile(`<(Code|Message)>([^<]*)</`)

func (g *Getter) getOnce(ctx context.Context, url string, start int64, body []byte, got *int,
	progress func(int) error) (error, bool) {
	rest := body[*got:]
	from := start + int64(*got)
	// Deadline: the configured timeout plus the time to move the rest at 1 MB/s.
	ctx, cancel := context.WithTimeout(ctx, g.timeout+time.Duration(len(rest))*time.Microsecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err, false
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", from, from+int64(len(rest))-1))
	resp, err := g.client.Do(req)
	if err != nil {
		return err, true
	}
	defer resp.Body.Close()
	whole := resp.StatusCode == http.StatusOK && from == 0
	if resp.StatusCode != http.StatusPartialContent && !whole {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		detail := fmt.Sprintf("HTTP %d", resp.StatusCode)
		for _, m := range xmlField.FindAllSubmatch(msg, 2) {
			detail += " " + string(m[1]) + ": " + string(m[2])
		}
		s := resp.StatusCode
		return errors.New(detail), s == 408 || s == 429 || s >= 500
	}
	if resp.ContentLength >= 0 && resp.ContentLength != int64(len(rest)) {
		return fmt.Errorf("asked for %d bytes at %d, got %d (the pack does not match its manifest)",
			len(rest), from, resp.ContentLength), false
	}
	// Read in pieces of up to 256 KiB (a chunk's average) so that progress
	// sees chunks as they complete.
	for len(rest) > 0 {
		n, err := io.ReadAtLeast(resp.Body, rest[:min(len(rest), 256<<10)], 1)
		*got += n
		rest = rest[n:]
		if n > 0 && progress != nil {
			if perr := progress(*got); perr != nil {
				return &stopError{perr}, false
			}
		}
		if err != nil && len(rest) > 0 {
			return fmt.Errorf("read %d of %d bytes at %d: %v", len(body)-len(rest), len(body), start, err), true
		}
	}
	var one [1]byte
	if n, _ := resp.Body.Read(one[:]); n > 0 {
		return fmt.Errorf("asked for %d bytes at %d, got more (the pack does not match its manifest)",
			len(body), start), false
	}
	return nil, false
}

// Verifier opens, decodes and checks chunks; one per goroutine (it reuses
// its inflater and buffers).
type Verifier struct {
	r       io.ReadCloser
	src     bytes.Reader
	scratch []byte
	opened  []byte // where sealed chunks are decrypted to
}

// Open returns the raw bytes of chunk c given its stored bytes, checked
// against the manifest: a sealed chunk's AES-GCM tag first (the tenant's
// chunk key), then its codec, then its SHA-256 name. A decoded or decrypted
// chunk lives in the Verifier's buffers until the next call. The error names
// the chunk and says where it came from.
func (v *Verifier) Open(c *Chunk, stored []byte, object string, offset int64) ([]byte, error) {
	data := stored
	if c.Key != nil {
		if cap(v.opened) < len(stored) {
			v.opened = make([]byte, len(stored))
		}
		var err error
		if data, err = OpenSealed(c.Key, c.Sum, c.Codec, stored, v.opened[:0]); err != nil {
			return nil, &Error{Kind: "integrity", Chunk: hex.EncodeToString(c.Sum[:]), Object: object, Offset: offset,
				Detail: fmt.Sprintf("bytes at %s offset %d do not open (%v): the stored chunk was altered or damaged",
					object, offset, err)}
		}
	}
	if c.Codec == CodecZlib {
		if cap(v.scratch) < c.Raw {
			v.scratch = make([]byte, c.Raw)
		}
		var err error
		if data, err = v.inflate(data, v.scratch[:c.Raw]); err != nil {
			return nil, &Error{Kind: "integrity", Chunk: hex.EncodeToString(c.Sum[:]), Object: object, Offset: offset,
				Detail: fmt.Sprintf("bytes at %s offset %d do not decode (%v): the stored chunk was altered or damaged",
					object, offset, err)}
		}
	} else if len(data) != c.Raw {
		return nil, &Error{Kind: "integrity", Chunk: hex.EncodeToString(c.Sum[:]), Object: object, Offset: offset,
			Detail: fmt.Sprintf("%d stored bytes for a %d-byte uncompressed chunk", len(data), c.Raw)}
	}
	// The SHA-256 name, the one the node trusts later (its chunk index, local
	// copies, `thaw verify`); the manifest's BLAKE3 column is not checked:
	// docs/store.md "Integrity" (issue 14 item 6), as thaw-fetch.
	if got := sha256.Sum256(data); got != c.Sum {
		return nil, &Error{Kind: "integrity", Chunk: hex.EncodeToString(c.Sum[:]), Object: object, Offset: offset,
			Detail: fmt.Sprintf("bytes at %s offset %d have sha256 %x, not %x: the stored chunk was altered or damaged",
				object, offset, got, c.Sum)}
	}
	return data, nil
}

func (v *Verifier) inflate(payload, dst []byte) ([]byte, error) {
	v.src.Reset(payload)
	if v.r == nil {
		r, err := zlib.NewReader(&v.src)
		if err != nil {
			return nil, fmt.Errorf("zlib: %v", err)
		}
		v.r = r
	} else if err := v.r.(zlib.Resetter).Reset(&v.src, nil); err != nil {
		return nil, fmt.Errorf("zlib: %v", err)
	}
	n, err := io.ReadFull(v.r, dst)
	if err != nil {
		return nil, fmt.Errorf("decodes to %d bytes, expected %d (%v)", n, len(dst), err)
	}
	var one [1]byte
	if m, err := v.r.Read(one[:]); m > 0 {
		return nil, fmt.Errorf("decodes to more than %d bytes", len(dst))
	} else if err != io.EOF {
		return nil, fmt.Errorf("zlib: %v", err) // includes a bad Adler-32
	}
	return dst, nil
}
