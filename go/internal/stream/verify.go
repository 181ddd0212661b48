package stream

// Serving a complete cache entry, every byte checked as it is read (issue 30).
//
// A restore from the node cache used to hand runsc the entry's files: the
// sentry read whatever was on disk, so a byte changed after the install (bit
// rot, a stray write with its mtime put back) restored altered memory with
// exit 0. In verify mode the gofer serves the same files, but each chunk the
// manifest names (the entry's own .thaw-manifest.json, written by thaw at
// install) is hashed with SHA-256 the first time a read touches it, before
// the read completes; a chunk that does not hash to its name fails that read
// and every later one touching it (EIO: the sentry kills the sandbox, the
// caller starts cold), and the first such chunk is reported in the config's
// `corrupt` file, which thaw reads to mark the cache entry corrupt.
//
// Which hash: the chunk's BLAKE3-256 where the manifest carries it (its
// seventh column, computed by thaw-chunk from the same bytes as the SHA-256
// name), else the SHA-256 name. BLAKE3 runs at 3.9 GB/s a core here against
// SHA-256's 1.8 (go/cmd/thaw-fetch hash_bench_test.go): the cost that decides
// a restore's speed on a node with few cores. Either is collision resistant,
// so bytes altered on disk match neither; a BLAKE3 that does not match is
// checked against the SHA-256 name before the chunk is called altered, so a
// manifest whose BLAKE3 column is wrong (docs/store.md "Integrity": nobody
// else reads it) costs a second hash, never a false alarm. (thaw-fetch checks
// the SHA-256 name on the way in for the same reason.)
//
// Cost: one hash of every byte the sentry reads, plus a second read of the
// parts of a chunk that fall outside the read that first touched it (reads
// are MaxReadBytes long, chunks content-defined, so most straddle a read
// boundary). Each chunk is hashed once per gofer (one gofer per restore): a
// later read of a checked chunk is a plain pread. Residual: a write to the
// file between the check and that later pread is not seen; only root can
// write the cache (docs/security.md), and root is trusted.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/zeebo/blake3"
)

// Chunk check states.
const (
	unchecked = iota
	checked
	bad
)

// scratchBytes bounds the buffer a chunk's bytes outside a read are hashed
// through (chunks may be up to 64 MiB: manifest.MAX_CHUNK_BYTES).
const scratchBytes = 256 << 10

var errCorrupt = errors.New("a chunk does not hash to its name")

// chunkTable is one file's chunks, in file order.
type chunkTable struct {
	offs  []int64 // offs[i] is chunk i's start; offs[len(sums)] the file's size
	sums  [][32]byte
	b3    [][32]byte // BLAKE3-256 of each chunk; nil when the manifest has none
	state []atomic.Uint32
	locks []sync.Mutex
}

// find is the chunk holding byte off (0 <= off < size).
func (t *chunkTable) find(off int64) int {
	return sort.Search(len(t.sums), func(i int) bool { return t.offs[i+1] > off })
}

// chunkRef reads a manifest chunk row [SHA256, LEN, PACK, OFFSET, STORED, CODEC(, BLAKE3)]
// (the middle is the chunk's place in the store, which serving does not need).
type chunkRef struct {
	sum   [32]byte
	n     int64
	b3    [32]byte
	hasB3 bool
}

func (c *chunkRef) UnmarshalJSON(b []byte) error {
	// By hand: encoding/json's generic row decode made loading a ~3B image's 24 000 rows
	// take 0.16 s on the H200, before the sentry's first read (docs/benchmarks.md).
	fields, ok := splitRow(b)
	if !ok || len(fields) < 2 {
		return fmt.Errorf("a chunk row is [sha256, length, ...]")
	}
	if !hexField(fields[0], c.sum[:]) {
		return fmt.Errorf("a chunk's sha256 must be 64 hex digits")
	}
	n, ok := intField(fields[1])
	if !ok || n <= 0 || n > fetch64MiB {
		return fmt.Errorf("a chunk's length must be 1 .. %d", fetch64MiB)
	}
	c.n = n
	if len(fields) == 7 {
		if !hexField(fields[6], c.b3[:]) {
			return fmt.Errorf("a chunk's blake3 must be 64 hex digits")
		}
		c.hasB3 = true
	}
	return nil
}

// splitRow splits a JSON array of strings and numbers (a manifest chunk row,
// already checked as valid JSON by the decoder) into its elements' raw bytes.
// ok is false for anything else (nested values, escapes in strings).
func splitRow(b []byte) (fields [][]byte, ok bool) {
	b = bytes.TrimSpace(b)
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return nil, false
	}
	body := b[1 : len(b)-1]
	fields = make([][]byte, 0, 7)
	for i := 0; i < len(body); {
		for i < len(body) && isSpace(body[i]) {
			i++
		}
		if i == len(body) {
			break
		}
		j := i
		if body[i] == '"' {
			j++
			for j < len(body) && body[j] != '"' {
				if body[j] == '\\' {
					return nil, false
				}
				j++
			}
			if j == len(body) {
				return nil, false
			}
			j++
		} else {
			for j < len(body) && body[j] != ',' && !isSpace(body[j]) {
				if body[j] == '[' || body[j] == '{' {
					return nil, false
				}
				j++
			}
		}
		fields = append(fields, body[i:j])
		for j < len(body) && isSpace(body[j]) {
			j++
		}
		if j < len(body) {
			if body[j] != ',' {
				return nil, false
			}
			j++
		}
		i = j
	}
	return fields, true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// hexField decodes a JSON string of len(dst)*2 hex digits into dst.
func hexField(f []byte, dst []byte) bool {
	if len(f) != 2*len(dst)+2 || f[0] != '"' || f[len(f)-1] != '"' {
		return false
	}
	_, err := hex.Decode(dst, f[1:len(f)-1])
	return err == nil
}

// intField is a JSON integer (no sign, fraction or exponent: a length).
func intField(f []byte) (int64, bool) {
	if len(f) == 0 || len(f) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range f {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// fetch64MiB: the largest chunk a manifest may name. Twin: control/images/manifest.py MAX_CHUNK_BYTES.
const fetch64MiB = 64 << 20

// entryManifest is the part of a thaw manifest serving reads (files[].name,
// .size, .chunks[i][0:2]). Twin: control/images/manifest.py Manifest.to_dict.
type entryManifest struct {
	Files []struct {
		Name   string     `json:"name"`
		Size   int64      `json:"size"`
		Chunks []chunkRef `json:"chunks"`
	} `json:"files"`
}

// maxManifestBytes bounds what the gofer reads of a manifest. Twin:
// control/images/manifest.py MAX_MANIFEST_BYTES.
const maxManifestBytes = 64 << 20

// loadChunkTables reads the manifest at path and builds a table for each
// served file, refusing one whose chunks do not add up to the file's size.
func loadChunkTables(path string, files []GoferFile) ([]*chunkTable, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxManifestBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d a manifest may have", path, st.Size(), maxManifestBytes)
	}
	var m entryManifest
	if err := json.NewDecoder(f).Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	out := make([]*chunkTable, len(files))
	for i, gf := range files {
		for _, mf := range m.Files {
			if mf.Name != gf.Name {
				continue
			}
			t := &chunkTable{offs: make([]int64, 0, len(mf.Chunks)+1), sums: make([][32]byte, 0, len(mf.Chunks))}
			var at int64
			every := len(mf.Chunks) > 0
			for _, c := range mf.Chunks {
				t.offs = append(t.offs, at)
				t.sums = append(t.sums, c.sum)
				t.b3 = append(t.b3, c.b3)
				every = every && c.hasB3
				at += c.n
			}
			if !every { // a manifest without checks (schema 1): the SHA-256 names
				t.b3 = nil
			}
			t.offs = append(t.offs, at)
			if at != gf.Size || mf.Size != gf.Size {
				return nil, fmt.Errorf("%s: the chunks of %s add up to %d bytes, the file is %d", path, gf.Name, at, gf.Size)
			}
			t.state = make([]atomic.Uint32, len(t.sums))
			t.locks = make([]sync.Mutex, len(t.sums))
			out[i] = t
		}
		if out[i] == nil {
			return nil, fmt.Errorf("%s names no file %s", path, gf.Name)
		}
	}
	return out, nil
}

// CorruptReport is what the gofer writes to GoferConfig.Corrupt about the
// first chunk that did not hash to its name. Twin: control/images/served.py Served.verdict.
type CorruptReport struct {
	File   string `json:"file"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	Chunk  string `json:"chunk"` // the manifest's SHA-256
	Got    string `json:"got"`   // what the bytes hash to
}

var scratch = sync.Pool{New: func() any { b := make([]byte, scratchBytes); return &b }}

// readVerified fills b with the file's bytes at off, each chunk it touches
// checked against its SHA-256 first (once). errCorrupt for a chunk that does
// not match, whatever its part in b. Runs of checked chunks are read in one pread.
func (g *Gofer) readVerified(file int, b []byte, off int64) error {
	t := g.tables[file]
	end := off + int64(len(b))
	run := off // start of the pending run of checked bytes
	flush := func(to int64) error {
		if to > run {
			if _, err := g.fds[file].ReadAt(b[run-off:to-off], run); err != nil {
				return err
			}
		}
		return nil
	}
	for i, pos := t.find(off), off; pos < end; i++ {
		hi := min(t.offs[i+1], end)
		switch t.state[i].Load() {
		case checked:
			pos = hi
			continue
		case bad:
			return errCorrupt
		}
		if err := flush(pos); err != nil {
			return err
		}
		if err := g.check(file, i, b[pos-off:hi-off], pos); err != nil {
			return err
		}
		pos, run = hi, hi
	}
	return flush(end)
}

// check hashes chunk i of file, reading the part [at, at+len(dst)) into dst
// (the read's own destination: no copy) and the rest through a scratch buffer.
// Two reads touching one chunk hash it once: the second waits for the first.
func (g *Gofer) check(file, i int, dst []byte, at int64) error {
	t := g.tables[file]
	t.locks[i].Lock()
	defer t.locks[i].Unlock()
	fd := g.fds[file]
	switch t.state[i].Load() {
	case checked:
		_, err := fd.ReadAt(dst, at)
		return err
	case bad:
		return errCorrupt
	}
	var h hash.Hash = sha256.New()
	if t.b3 != nil {
		h = blake3.New()
	}
	sp := scratch.Get().(*[]byte)
	defer scratch.Put(sp)
	hashRange := func(from, to int64) error {
		for from < to {
			s := (*sp)[:min(int64(len(*sp)), to-from)]
			if _, err := fd.ReadAt(s, from); err != nil {
				return err
			}
			h.Write(s)
			from += int64(len(s))
		}
		return nil
	}
	cs, ce := t.offs[i], t.offs[i+1]
	if err := hashRange(cs, at); err != nil {
		return err
	}
	if _, err := fd.ReadAt(dst, at); err != nil {
		return err
	}
	h.Write(dst)
	if err := hashRange(at+int64(len(dst)), ce); err != nil {
		return err
	}
	var got [32]byte
	h.Sum(got[:0])
	g.checkedChunks.Add(1)
	g.checkedBytes.Add(ce - cs)
	want := t.sums[i]
	if t.b3 != nil {
		want = t.b3[i]
	}
	if got == want {
		t.state[i].Store(checked)
		return nil
	}
	if t.b3 != nil { // the SHA-256 name decides (the BLAKE3 column may be wrong; nothing else reads it)
		var err error
		if got, err = g.sha256Of(file, cs, ce, sp); err != nil {
			return err
		}
		if got == t.sums[i] {
			g.logf("%s+%d: its BLAKE3 in the manifest is wrong, its SHA-256 name right", g.cfg.Files[file].Name, cs)
			t.state[i].Store(checked)
			return nil
		}
	}
	t.state[i].Store(bad)
	g.reportCorrupt(CorruptReport{File: g.cfg.Files[file].Name, Offset: cs, Length: ce - cs,
		Chunk: hex.EncodeToString(t.sums[i][:]), Got: hex.EncodeToString(got[:])})
	return errCorrupt
}

// sha256Of hashes [from, to) of file through buf.
func (g *Gofer) sha256Of(file int, from, to int64, buf *[]byte) ([32]byte, error) {
	h := sha256.New()
	for from < to {
		s := (*buf)[:min(int64(len(*buf)), to-from)]
		if _, err := g.fds[file].ReadAt(s, from); err != nil {
			return [32]byte{}, err
		}
		h.Write(s)
		from += int64(len(s))
	}
	var out [32]byte
	h.Sum(out[:0])
	return out, nil
}

// reportCorrupt logs every bad chunk and writes the first to cfg.Corrupt
// (a temp file renamed into place: thaw never reads half a report).
func (g *Gofer) reportCorrupt(r CorruptReport) {
	g.logf("corrupt: %s+%d (%d bytes) hashes to %s, its name is %s", r.File, r.Offset, r.Length, r.Got, r.Chunk)
	if g.cfg.Corrupt == "" || !g.reported.CompareAndSwap(false, true) {
		return
	}
	b, _ := json.Marshal(r)
	tmp := filepath.Join(filepath.Dir(g.cfg.Corrupt), "."+filepath.Base(g.cfg.Corrupt)+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		g.logf("writing %s: %v", tmp, err)
		return
	}
	if err := os.Rename(tmp, g.cfg.Corrupt); err != nil {
		g.logf("writing %s: %v", g.cfg.Corrupt, err)
	}
}
