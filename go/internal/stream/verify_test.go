package stream

// Unit tests of verify mode (verify.go): a complete cache entry served with
// every chunk checked against its SHA-256 as reads touch it. The real runsc
// and sentry are exercised by tests/integration/test_cache_integrity.py.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
)

// entryOnDisk writes files cut into chunks of the given sizes (cycled), and a
// manifest naming them as control/images/manifest.py writes one.
func entryOnDisk(t *testing.T, sizes []int, contents ...[]byte) (*GoferConfig, string) {
	t.Helper()
	dir := t.TempDir()
	type file struct {
		Name   string `json:"name"`
		Size   int    `json:"size"`
		Chunks []any  `json:"chunks"`
	}
	var files []file
	cfg := &GoferConfig{Version: GoferConfigVersion, DeadlineS: 30, MaxParallel: 8, MaxReadBytes: 256 << 10,
		Verify: filepath.Join(dir, ".thaw-manifest.json"), Corrupt: filepath.Join(dir, "corrupt.json"),
		Log: filepath.Join(dir, "gofer.log")}
	for f, data := range contents {
		name := fmt.Sprintf("f%d", f)
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		fe := file{Name: name, Size: len(data)}
		for off, k := 0, 0; off < len(data); k++ {
			n := min(sizes[k%len(sizes)], len(data)-off)
			s := sha256.Sum256(data[off : off+n])
			// [sha256, length, pack index, offset in pack, stored, codec, blake3]: serving reads the first two.
			fe.Chunks = append(fe.Chunks, []any{hex.EncodeToString(s[:]), n, 0, off, n, "none", strings.Repeat("0", 64)})
			off += n
		}
		files = append(files, fe)
		cfg.Files = append(cfg.Files, GoferFile{Name: name, Path: path, Size: int64(len(data)), Pages: f == 0})
	}
	b, _ := json.Marshal(map[string]any{"schema": "thaw.manifest", "files": files, "key": "k"})
	if err := os.WriteFile(cfg.Verify, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg, dir
}

func verifyingGofer(t *testing.T, cfg *GoferConfig) *testGofer {
	t.Helper()
	g, err := NewGofer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Destroy)
	tg := &testGofer{g: g}
	for _, f := range cfg.Files {
		ar, err := g.OpenRead(f.Name)
		if err != nil {
			t.Fatal(err)
		}
		tg.rs = append(tg.rs, ar.(*reader))
		t.Cleanup(func() { ar.Close() })
	}
	return tg
}

// Reads of every size and offset return the file's bytes, and each chunk is
// hashed exactly once however many reads touch it.
func TestVerifiedReadsReturnTheFileAndHashEachChunkOnce(t *testing.T) {
	data := randBytes(30, 3<<20+12345)
	cfg, _ := entryOnDisk(t, []int{100 << 10, 300 << 10, 7, 1 << 20}, data)
	tg := verifyingGofer(t, cfg)
	r := rand.New(rand.NewPCG(3, 4))
	for k := 0; k < 300; k++ {
		off := int64(r.IntN(len(data)))
		n := int64(1 + r.IntN(256<<10))
		got, err := tg.read(0, off, n)
		want := data[off:min(off+n, int64(len(data)))]
		if (err != nil && off+n <= int64(len(data))) || !bytes.Equal(got, want) {
			t.Fatalf("read %d+%d: %d bytes, %v", off, n, len(got), err)
		}
	}
	chunks := int64(len(tg.g.tables[0].sums))
	if c := tg.g.checkedChunks.Load(); c > chunks {
		t.Fatalf("%d chunk checks for %d chunks", c, chunks)
	}
	if _, err := os.Stat(cfg.Corrupt); !os.IsNotExist(err) {
		t.Fatalf("a corrupt report for an intact entry: %v", err)
	}
}

// Parallel reads that share chunks: every read right, no chunk hashed twice.
func TestParallelVerifiedReadsShareTheirChecks(t *testing.T) {
	data := randBytes(31, 4<<20)
	cfg, _ := entryOnDisk(t, []int{192 << 10, 320 << 10}, data)
	g, err := NewGofer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for off := int64(w) * 4096; off < int64(len(data)); off += 64 << 10 {
				b := make([]byte, min(256<<10, int64(len(data))-off))
				if err := g.readAt(0, b, off); err != nil || !bytes.Equal(b, data[off:off+int64(len(b))]) {
					errs <- fmt.Errorf("read %d: %v", off, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if c, n := g.checkedChunks.Load(), len(g.tables[0].sums); c != int64(n) {
		t.Fatalf("%d chunk checks for %d chunks", c, n)
	}
}

// One flipped byte fails every read that touches its chunk (EIO, what makes
// the sentry give up), reads elsewhere still work, and the chunk is reported.
func TestAFlippedByteFailsItsChunksReadsAndIsReported(t *testing.T) {
	data := randBytes(32, 2<<20)
	cfg, _ := entryOnDisk(t, []int{256 << 10}, data)
	bad := append([]byte(nil), data...)
	bad[700<<10] ^= 0x5a
	if err := os.WriteFile(cfg.Files[0].Path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	tg := verifyingGofer(t, cfg)
	if got, err := tg.read(0, 0, 256<<10); err != nil || !bytes.Equal(got, data[:256<<10]) {
		t.Fatalf("a read of an intact chunk: %v", err)
	}
	for _, off := range []int64{700<<10 - 100, 768<<10 - 4096} { // the chunk is [512K, 768K)
		if _, err := tg.read(0, off, 4096); !errors.Is(err, unix.EIO) {
			t.Fatalf("a read of the altered chunk at %d: want EIO, got %v", off, err)
		}
	}
	var rep CorruptReport
	b, err := os.ReadFile(cfg.Corrupt)
	if err != nil || json.Unmarshal(b, &rep) != nil {
		t.Fatalf("no corrupt report: %v %s", err, b)
	}
	want := sha256.Sum256(data[512<<10 : 768<<10])
	if rep.File != "f0" || rep.Offset != 512<<10 || rep.Length != 256<<10 || rep.Chunk != hex.EncodeToString(want[:]) {
		t.Fatalf("report %+v", rep)
	}
	if got, err := tg.read(0, 1<<20, 4096); err != nil || !bytes.Equal(got, data[1<<20:1<<20+4096]) {
		t.Fatalf("a read after the altered chunk: %v", err)
	}
}

// A hole (sparse file) where the manifest names data is caught like any change.
func TestAHolePunchedIntoAnEntryIsCaught(t *testing.T) {
	data := randBytes(33, 1<<20)
	cfg, _ := entryOnDisk(t, []int{128 << 10}, data)
	f, err := os.OpenFile(cfg.Files[0].Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 256<<10, 128<<10); err != nil {
		t.Skipf("the test file system punches no holes: %v", err)
	}
	f.Close()
	tg := verifyingGofer(t, cfg)
	if _, err := tg.read(0, 300<<10, 4096); !errors.Is(err, unix.EIO) {
		t.Fatalf("want EIO, got %v", err)
	}
}

// The manifest must describe the files served: a wrong size or a missing
// file stops the gofer before it serves a byte.
func TestVerifyRefusesAManifestThatDoesNotFit(t *testing.T) {
	data := randBytes(34, 300<<10)
	cfg, _ := entryOnDisk(t, []int{100 << 10}, data)
	cfg.Files[0].Size = 299 << 10
	os.Truncate(cfg.Files[0].Path, 299<<10)
	if _, err := NewGofer(cfg); err == nil || !strings.Contains(err.Error(), "add up") {
		t.Fatalf("want a refusal, got %v", err)
	}
	cfg2, _ := entryOnDisk(t, []int{100 << 10}, data)
	cfg2.Files[0].Name = "other"
	if _, err := NewGofer(cfg2); err == nil || !strings.Contains(err.Error(), "names no file") {
		t.Fatalf("want a refusal, got %v", err)
	}
}

// A verify-mode config needs no stream; a stream config still needs one.
func TestGoferConfigVersions(t *testing.T) {
	for _, tc := range []struct {
		doc string
		ok  bool
	}{
		{`{"version":2,"socket":"","complete":"","files":[{"name":"a","path":"/a","size":1,"pages":false}],` +
			`"deadline_s":30,"boost_s":0,"max_parallel":8,"max_read_bytes":262144,"log":"","verify":"/m"}`, true},
		{`{"version":2,"socket":"","complete":"","files":[{"name":"a","path":"/a","size":1,"pages":false}],` +
			`"deadline_s":30,"boost_s":0,"max_parallel":8,"max_read_bytes":262144,"log":""}`, false},
		{`{"version":1,"socket":"/s","complete":"/c","files":[{"name":"a","path":"/a","size":1,"pages":false}],` +
			`"deadline_s":30,"boost_s":0,"max_parallel":8,"max_read_bytes":262144,"log":""}`, false},
	} {
		_, err := ReadGoferConfig(strings.NewReader(tc.doc))
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.doc, err)
		}
	}
}

var _ = memmap.FileRange{}
