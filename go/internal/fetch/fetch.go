// Package fetch is thaw's one fetch engine: the store side of a pull and of a
// stream.
//
//   - get.go: ranged GETs of pack objects through presigned URLs (Getter),
//     each retried under one policy;
//   - retry.go: that policy, botocore's "standard" retry mode plus a time
//     budget (RetryPolicy; docs/store.md "Retry policy");
//   - verify.go: every chunk opened (a sealed one's AES-GCM tag, crypt.go),
//     decoded and checked against its SHA-256 name before a byte of it is
//     written or served (Verifier);
//   - fill.go, plan.go: a pull's fill of an entry's files from a plan
//     (Fill): ranges on a fixed set of workers, each with buffers sized once
//     (memory bounded by workers x the largest range), whole pages written
//     with O_DIRECT.
//
// Two commands use it: thaw-fetch (go/cmd/thaw-fetch, a thin CLI over Fill:
// `thaw pull`, thawd's pulls) and thaw-gofer's stream (go/internal/stream,
// which schedules its own GETs, the plan's order with faults first, over
// Getter and Verifier). control/images/fetcher.py starts both.
package fetch

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// Codecs a stored chunk may use. Twin: control/images/pack.py CODEC_NONE, CODEC_ZLIB.
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

// CheckStored refuses a chunk whose stored form cannot be what it says: an
// unknown codec, a size out of bounds, an uncompressed chunk whose stored
// length is not its raw length (plus the sealing overhead when sealed).
func (c *Chunk) CheckStored() error {
	if c.Raw <= 0 || c.Raw > MaxChunk || c.Stored <= 0 || c.Stored > MaxChunk+(1<<20) {
		return fmt.Errorf("stored %d, raw %d out of bounds", c.Stored, c.Raw)
	}
	if c.Codec != CodecNone && c.Codec != CodecZlib {
		return fmt.Errorf("unknown codec %q", c.Codec)
	}
	overhead := 0
	if c.Key != nil {
		overhead = SealedOverhead
		if c.Stored <= overhead {
			return fmt.Errorf("a sealed chunk of %d bytes", c.Stored)
		}
	}
	if c.Codec == CodecNone && c.Stored != c.Raw+overhead {
		return fmt.Errorf("an uncompressed chunk stores %d bytes for %d", c.Stored, c.Raw)
	}
	return nil
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

// parseNames sets c.Sum from h and, when check is not "", c.Check: the
// chunk's SHA-256 name and its BLAKE3 from a schema-2 manifest (read, not
// used: the name is what the node trusts; docs/store.md, "Integrity").
func (c *Chunk) parseNames(h, check string) error {
	var err error
	if c.Sum, err = ParseHex(h); err != nil {
		return fmt.Errorf("chunk hash %v", err)
	}
	if check != "" {
		if c.Check, err = ParseHex(check); err != nil {
			return fmt.Errorf("chunk check %v", err)
		}
		c.HasCheck = true
	}
	return nil
}

// ParseKey reads a plan's chunk key: the chunk's own AES-256-GCM key in hex
// (control/images/keys.py chunk_key). A malformed one is refused without
// echoing it: no message ever holds a key.
func ParseKey(raw json.RawMessage) ([]byte, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || len(s) != 2*KeyBytes {
		return nil, fmt.Errorf("a chunk key must be %d hex digits", 2*KeyBytes)
	}
	key := make([]byte, KeyBytes)
	if _, err := hex.Decode(key, []byte(s)); err != nil {
		return nil, fmt.Errorf("a chunk key must be %d hex digits", 2*KeyBytes)
	}
	return key, nil
}

// Error is a failed fetch, as the caller reports it: one JSON object on the
// helper's error line, which control/images/fetcher.py turns into
// IntegrityError (integrity), StoreError (store) or ThawError (io).
type Error struct {
	Kind   string `json:"kind"`            // integrity | store | io
	Store  string `json:"store,omitempty"` // scheme://host of the store, for a store error
	Chunk  string `json:"chunk,omitempty"`
	Object string `json:"object,omitempty"`
	Offset int64  `json:"offset"`
	Length int    `json:"length,omitempty"`
	Detail string `json:"detail"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s %s@%d: %s", e.Kind, e.Chunk, e.Object, e.Offset, e.Detail)
}
