package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"thaw.dev/thaw/go/internal/fetch"
)

// PlanVersion is the plan format this binary executes.
// Twin: control/images/transfer.py GO_PLAN_VERSION.
const PlanVersion = 2

// Codecs a stored chunk may use. Twin: control/images/pack.py CODEC_NONE, CODEC_ZLIB.
const (
	codecNone = "none"
	codecZlib = "zlib"
)

type plan struct {
	Version  int          `json:"version"`
	Workers  int          `json:"workers"`
	Attempts *int         `json:"attempts"` // before "retry": store.retries, botocore's count of retries
	Retry    *retryPolicy `json:"retry"`
	TimeoutS float64      `json:"timeout_s"`
	DirectIO bool         `json:"direct_io"`
	Files    []string     `json:"files"`
	Objects  []object     `json:"objects"`
	Ranges   []rng        `json:"ranges"`
}

type object struct {
	URL  string `json:"url"`
	Name string `json:"name"` // for messages: s3://bucket/key
}

// place is where a chunk's raw bytes go: file index, offset in that file.
type place struct {
	file int
	off  int64
}

type chunk struct {
	sum    [32]byte // SHA-256, the chunk's name: what its bytes are checked against
	raw    int      // decoded length
	pos    int      // offset of its stored bytes in the range
	stored int
	codec  string
	places []place
	key    []byte // AES-256-GCM key of a sealed chunk (crypt.go); nil: stored in the clear
}

type rng struct {
	obj    int
	start  int64
	length int
	chunks []chunk
}

// UnmarshalJSON reads [OBJECT, START, LENGTH, [[HASH, RAW, POS, STORED, CODEC, [[FILE, OFF], ...], CHECK, KEY?], ...]]
// (CHECK: the chunk's BLAKE3-256 or "", accepted and not used: the SHA-256 HASH is checked;
// KEY, only for a sealed chunk: its AES-256-GCM key in hex, crypt.go):
// positional arrays keep a plan for hundreds of thousands of chunks small.
func (r *rng) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) != 4 {
		return fmt.Errorf("a range is [object, start, length, chunks]")
	}
	if err := unmarshalAll(raw[:3], &r.obj, &r.start, &r.length); err != nil {
		return err
	}
	var chunks [][]json.RawMessage
	if err := json.Unmarshal(raw[3], &chunks); err != nil {
		return fmt.Errorf("range chunks: %v", err)
	}
	for _, c := range chunks {
		if len(c) != 7 && len(c) != 8 {
			return fmt.Errorf("a chunk is [hash, raw, pos, stored, codec, places, check] or [..., check, key]")
		}
		var h, check string
		var pl [][2]int64
		var ch chunk
		if err := unmarshalAll(c, &h, &ch.raw, &ch.pos, &ch.stored, &ch.codec, &pl, &check); err != nil {
			return err
		}
		if len(c) == 8 {
			var key string
			if err := json.Unmarshal(c[7], &key); err != nil || len(key) != 64 {
				return fmt.Errorf("a chunk key must be 64 hex digits") // never the key itself in a message
			}
			ch.key = make([]byte, 32)
			if _, err := hex.Decode(ch.key, []byte(key)); err != nil {
				return fmt.Errorf("a chunk key must be 64 hex digits")
			}
		}
		if check != "" { // a schema-2 manifest's BLAKE3: read for compatibility, not used (fetch.go, one)
			var b3 [32]byte
			if _, err := hex.Decode(b3[:], []byte(check)); err != nil || len(check) != 64 {
				return fmt.Errorf("chunk check %q is not 64 hex digits", check)
			}
		}
		if len(h) != 64 {
			return fmt.Errorf("chunk hash %q is not 64 hex digits", h)
		}
		if _, err := hex.Decode(ch.sum[:], []byte(h)); err != nil {
			return fmt.Errorf("chunk hash %q: %v", h, err)
		}
		for _, x := range pl {
			ch.places = append(ch.places, place{int(x[0]), x[1]})
		}
		r.chunks = append(r.chunks, ch)
	}
	return nil
}

func unmarshalAll(raw []json.RawMessage, dst ...any) error {
	for i := range dst {
		if err := json.Unmarshal(raw[i], dst[i]); err != nil {
			return fmt.Errorf("field %d: %v", i, err)
		}
	}
	return nil
}

// retry is the plan's retry policy: its "retry" object, else the defaults
// with max_attempts from the older "attempts" field, which Python filled
// with store.retries, botocore's count of retries (thaw-fetch once read it
// as tries in all, one fewer).
func (p *plan) retry() retryPolicy {
	if p.Retry != nil {
		return *p.Retry
	}
	r := defaultRetry
	if p.Attempts != nil {
		r.MaxAttempts = *p.Attempts
	}
	return r
}

// check refuses a plan that would read or write outside what it names.
func (p *plan) check(sizes []int64) error {
	if p.Version != PlanVersion {
		return fmt.Errorf("plan version %d, this thaw-fetch executes %d: rebuild with `make build`", p.Version, PlanVersion)
	}
	if p.Workers < 1 || p.TimeoutS <= 0 {
		return fmt.Errorf("workers and timeout_s must be positive")
	}
	if err := p.retry().check(); err != nil {
		return err
	}
	for i, r := range p.Ranges {
		if r.obj < 0 || r.obj >= len(p.Objects) || r.start < 0 || r.length <= 0 || r.length > maxRange {
			return fmt.Errorf("range %d: object %d, start %d, length %d out of bounds", i, r.obj, r.start, r.length)
		}
		if len(r.chunks) == 0 {
			return fmt.Errorf("range %d has no chunks", i)
		}
		for _, c := range r.chunks {
			if c.pos < 0 || c.stored <= 0 || c.pos+c.stored > r.length || c.raw <= 0 || c.raw > maxChunk {
				return fmt.Errorf("range %d: a chunk at %d+%d (raw %d) does not fit", i, c.pos, c.stored, c.raw)
			}
			if c.codec != codecNone && c.codec != codecZlib {
				return fmt.Errorf("range %d: unknown codec %q", i, c.codec)
			}
			overhead := 0
			if c.key != nil {
				overhead = fetch.SealedOverhead
				if c.stored <= overhead {
					return fmt.Errorf("range %d: a sealed chunk of %d bytes", i, c.stored)
				}
			}
			if c.codec == codecNone && c.stored != c.raw+overhead {
				return fmt.Errorf("range %d: an uncompressed chunk stores %d bytes for %d", i, c.stored, c.raw)
			}
			if len(c.places) == 0 {
				return fmt.Errorf("range %d: a chunk goes nowhere", i)
			}
			for _, pl := range c.places {
				if pl.file < 0 || pl.file >= len(sizes) || pl.off < 0 || pl.off+int64(c.raw) > sizes[pl.file] {
					return fmt.Errorf("range %d: place %d@%d is outside the files", i, pl.file, pl.off)
				}
			}
		}
	}
	return nil
}

// Bounds on what one worker buffers: a range and a decoded chunk.
const (
	maxRange = 256 << 20
	maxChunk = 64 << 20
)

func fileSizes(paths []string) ([]int64, error) {
	out := make([]int64, len(paths))
	for i, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		out[i] = st.Size()
	}
	return out, nil
}
