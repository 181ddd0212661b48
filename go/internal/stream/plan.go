package stream

import (
	"encoding/json"
	"fmt"
	"os"

	"thaw.dev/thaw/go/internal/fetch"
)

// PlanVersion is the stream plan format `thaw-gofer stream` executes
// (2: "retry", the one retry policy of go/internal/fetch, replaced
// "attempts"). Twin: control/images/stream.py PLAN_VERSION.
const PlanVersion = 2

// Plan is what `thaw-gofer stream` reads on stdin (written by
// control/images/stream.py): the files of a cache partial entry, created at
// full size by the caller, which chunks go where, and in which order to
// fetch them. Policy (the order: checkpoint.img and pages_meta.img first,
// then the ranges learned from earlier restores, then the rest by offset)
// is the caller's; this executes it.
//
//	{"version":2, "workers":4, "urgent_workers":2, "timeout_s":30,
//	 "retry":{"max_attempts":3, "budget_s":30},   as thaw-fetch's (go/internal/fetch/retry.go)
//	 "range_bytes":8388608, "urgent_ahead_bytes":524288,
//	 "files":[{"path":"/abs/partial/checkpoint.img","size":N}, ...],
//	 "objects":[{"url":"https://...presigned...","name":"packs/<h>"}, ...],
//	 "chunks":[[HASH, RAW, OBJECT, OFFSET, STORED, CODEC, [[FILE, OFF], ...], CHECK, KEY?], ...],   in fetch order
//	 "ready":[[FILE, OFF, LEN], ...],   verified on disk already (all-zero chunks, local copies)
//	 "listen":"/abs/stream.sock", "complete":"/abs/complete"}
type Plan struct {
	Version          int        `json:"version"`
	Workers          int        `json:"workers"`
	UrgentWorkers    int        `json:"urgent_workers"`
	TimeoutS         float64    `json:"timeout_s"`
	RangeBytes       int        `json:"range_bytes"`
	UrgentAheadBytes int64      `json:"urgent_ahead_bytes"`
	Files            []File     `json:"files"`
	Objects          []Object   `json:"objects"`
	Chunks           []Chunk    `json:"chunks"`
	Ready            [][3]int64 `json:"ready"`
	Listen           string     `json:"listen"`
	Complete         string     `json:"complete"`

	Retry *fetch.RetryPolicy `json:"retry"` // the GETs' retry policy; nil: fetch.DefaultRetry
}

// File is one file of the entry being filled.
type File struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// Object is a pack, read through a presigned URL.
type Object struct {
	URL  string `json:"url"`
	Name string `json:"name"` // for messages
}

// Place is where a chunk's raw bytes go.
type Place struct {
	File int
	Off  int64
}

// Chunk is one chunk to fetch: where it lies in the store, where it goes.
type Chunk struct {
	fetch.Chunk
	Object int
	Offset int64 // of its stored bytes in the object
	Places []Place
}

// UnmarshalJSON reads [HASH, RAW, OBJECT, OFFSET, STORED, CODEC, [[FILE, OFF], ...], CHECK]
// (CHECK: BLAKE3-256 hex, or "" to check SHA-256), and KEY after CHECK for a
// chunk sealed with its tenant's key (issue 13: the chunk's own AES-256-GCM
// key in hex, go/internal/fetch/crypt.go; never put in a message):
// positional, so a plan of a 17 GB image (~70 000 chunks) stays a few MB.
func (c *Chunk) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || (len(raw) != 8 && len(raw) != 9) {
		return fmt.Errorf("a chunk is [hash, raw, object, offset, stored, codec, places, check] or [..., check, key]")
	}
	if len(raw) == 9 {
		var err error
		if c.Key, err = fetch.ParseKey(raw[8]); err != nil {
			return err
		}
		raw = raw[:8]
	}
	var h, check string
	var pl [][2]int64
	dst := []any{&h, &c.Raw, &c.Object, &c.Offset, &c.Stored, &c.Codec, &pl, &check}
	for i := range dst {
		if err := json.Unmarshal(raw[i], dst[i]); err != nil {
			return fmt.Errorf("chunk field %d: %v", i, err)
		}
	}
	var err error
	if c.Sum, err = fetch.ParseHex(h); err != nil {
		return fmt.Errorf("chunk hash %v", err)
	}
	if check != "" {
		if c.Check, err = fetch.ParseHex(check); err != nil {
			return fmt.Errorf("chunk check %v", err)
		}
		c.HasCheck = true
	}
	for _, x := range pl {
		c.Places = append(c.Places, Place{int(x[0]), x[1]})
	}
	return nil
}

// Check refuses a plan that would read or write outside what it names, or
// that could not make progress.
func (p *Plan) Check() error {
	if p.Version != PlanVersion {
		return fmt.Errorf("stream plan version %d, this thaw-gofer executes %d: rebuild with `make build`",
			p.Version, PlanVersion)
	}
	if p.Workers < 1 || p.UrgentWorkers < 1 || p.TimeoutS <= 0 {
		return fmt.Errorf("workers, urgent_workers and timeout_s must be positive")
	}
	if err := p.Retry.OrDefault().Check(); err != nil {
		return err
	}
	if p.RangeBytes < 1<<20 || p.RangeBytes > 256<<20 || p.UrgentAheadBytes < 0 {
		return fmt.Errorf("range_bytes must be 1 MiB .. 256 MiB, urgent_ahead_bytes >= 0")
	}
	if p.Listen == "" || p.Complete == "" {
		return fmt.Errorf("listen and complete paths are required")
	}
	for i, f := range p.Files {
		st, err := os.Stat(f.Path)
		if err != nil {
			return err
		}
		if st.Size() != f.Size {
			return fmt.Errorf("file %d (%s) is %d bytes, the plan says %d", i, f.Path, st.Size(), f.Size)
		}
	}
	inFile := func(file int, off, n int64) bool {
		return file >= 0 && file < len(p.Files) && off >= 0 && n >= 0 && off+n <= p.Files[file].Size
	}
	for i, c := range p.Chunks {
		if c.Object < 0 || c.Object >= len(p.Objects) || c.Offset < 0 {
			return fmt.Errorf("chunk %d: object %d, offset %d out of bounds", i, c.Object, c.Offset)
		}
		if err := c.CheckStored(); err != nil { // the same check as a pull's (go/internal/fetch)
			return fmt.Errorf("chunk %d: %v", i, err)
		}
		if len(c.Places) == 0 {
			return fmt.Errorf("chunk %d goes nowhere", i)
		}
		for _, pl := range c.Places {
			if !inFile(pl.File, pl.Off, int64(c.Raw)) {
				return fmt.Errorf("chunk %d: place %d@%d is outside the files", i, pl.File, pl.Off)
			}
		}
	}
	for _, r := range p.Ready {
		if !inFile(int(r[0]), r[1], r[2]) {
			return fmt.Errorf("ready range %v is outside the files", r)
		}
	}
	return nil
}
