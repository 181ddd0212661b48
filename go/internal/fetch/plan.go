package fetch

import (
	"encoding/json"
	"fmt"
	"os"
)

// FillPlanVersion is the plan format Fill executes (thaw-fetch's stdin).
// Twin: control/images/transfer.py GO_PLAN_VERSION.
const FillPlanVersion = 2

// FillPlan is what a pull hands thaw-fetch (control/images/transfer.py
// plans it): files created at full size by the caller, one presigned URL
// per pack, and the ranges to GET with where each chunk in them goes.
//
//	{"version":2, "workers":8, "timeout_s":60, "direct_io":true,
//	 "retry":{"max_attempts":3, "budget_s":30, "base_s":1, "transient_base_s":0.05, "max_backoff_s":20},
//	 "files":["/abs/dir/pages.img", ...],
//	 "objects":[{"url":"https://...presigned...", "name":"packs/<h>"}, ...],
//	 "ranges":[[OBJECT, START, LENGTH, [[HASH, RAW_LEN, POS, STORED, CODEC, [[FILE, OFFSET], ...], CHECK, KEY?], ...]], ...]}
//
// HASH is the chunk's SHA-256, its name, which its bytes must match. CHECK is
// its BLAKE3-256 in hex from a schema-2 manifest, or "": read, not used (the
// name is what the node trusts later; docs/store.md, "Integrity"). KEY, only
// for a sealed chunk: its AES-256-GCM key in hex (crypt.go). "retry"
// (retry.go) may leave fields out, or be left out: the defaults.
type FillPlan struct {
	Version  int          `json:"version"`
	Workers  int          `json:"workers"`
	Retry    *RetryPolicy `json:"retry"`
	TimeoutS float64      `json:"timeout_s"`
	DirectIO bool         `json:"direct_io"`
	Files    []string     `json:"files"`
	Objects  []Object     `json:"objects"`
	Ranges   []Range      `json:"ranges"`
}

// Object is a pack, read through a presigned URL.
type Object struct {
	URL  string `json:"url"`
	Name string `json:"name"` // for messages: s3://bucket/key
}

// Place is where a chunk's raw bytes go: file index, offset in that file.
type Place struct {
	File int
	Off  int64
}

// RangeChunk is one chunk of a range: its stored bytes at Pos in the range.
type RangeChunk struct {
	Chunk
	Pos    int
	Places []Place
}

// Range is one ranged GET: LENGTH bytes of an object from START.
type Range struct {
	Object int
	Start  int64
	Length int
	Chunks []RangeChunk
}

// UnmarshalJSON reads [OBJECT, START, LENGTH, [[HASH, RAW, POS, STORED, CODEC, [[FILE, OFF], ...], CHECK, KEY?], ...]]:
// positional arrays keep a plan for hundreds of thousands of chunks small.
func (r *Range) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) != 4 {
		return fmt.Errorf("a range is [object, start, length, chunks]")
	}
	if err := unmarshalAll(raw[:3], &r.Object, &r.Start, &r.Length); err != nil {
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
		var ch RangeChunk
		if err := unmarshalAll(c, &h, &ch.Raw, &ch.Pos, &ch.Stored, &ch.Codec, &pl, &check); err != nil {
			return err
		}
		if len(c) == 8 {
			var err error
			if ch.Key, err = ParseKey(c[7]); err != nil {
				return err
			}
		}
		if err := ch.parseNames(h, check); err != nil {
			return err
		}
		for _, x := range pl {
			ch.Places = append(ch.Places, Place{int(x[0]), x[1]})
		}
		r.Chunks = append(r.Chunks, ch)
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

// maxRange bounds what one worker buffers for a range.
const maxRange = 256 << 20

// check refuses a plan that would read or write outside what it names.
func (p *FillPlan) check(sizes []int64) error {
	if p.Version != FillPlanVersion {
		return fmt.Errorf("plan version %d, this thaw-fetch executes %d: rebuild with `make build`", p.Version,
			FillPlanVersion)
	}
	if p.Workers < 1 || p.TimeoutS <= 0 {
		return fmt.Errorf("workers and timeout_s must be positive")
	}
	if err := p.Retry.OrDefault().Check(); err != nil {
		return err
	}
	for i, r := range p.Ranges {
		if r.Object < 0 || r.Object >= len(p.Objects) || r.Start < 0 || r.Length <= 0 || r.Length > maxRange {
			return fmt.Errorf("range %d: object %d, start %d, length %d out of bounds", i, r.Object, r.Start, r.Length)
		}
		if len(r.Chunks) == 0 {
			return fmt.Errorf("range %d has no chunks", i)
		}
		for _, c := range r.Chunks {
			if c.Pos < 0 || c.Stored <= 0 || c.Pos+c.Stored > r.Length {
				return fmt.Errorf("range %d: a chunk at %d+%d (raw %d) does not fit", i, c.Pos, c.Stored, c.Raw)
			}
			if err := c.CheckStored(); err != nil {
				return fmt.Errorf("range %d: a chunk at %d: %v", i, c.Pos, err)
			}
			if len(c.Places) == 0 {
				return fmt.Errorf("range %d: a chunk goes nowhere", i)
			}
			for _, pl := range c.Places {
				if pl.File < 0 || pl.File >= len(sizes) || pl.Off < 0 || pl.Off+int64(c.Raw) > sizes[pl.File] {
					return fmt.Errorf("range %d: place %d@%d is outside the files", i, pl.File, pl.Off)
				}
			}
		}
	}
	return nil
}

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
