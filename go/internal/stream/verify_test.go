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

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
)

// entryOnDisk writes files cut into chunks of the given sizes (cycled), and a
// manifest naming them as control/images/manifest.py writes one (schema 2:
// each row ends in the chunk's BLAKE3).
func entryOnDisk(t testing.TB, sizes []int, contents ...[]byte) (*GoferConfig, string) {
	return entryWith(t, sizes, func(c []byte) string { s := blake3.Sum256(c); return hex.EncodeToString(s[:]) }, contents...)
}

// entryWith is entryOnDisk with each row's last column from check ("": a schema-1 row without it).
func entryWith(t testing.TB, sizes []int, check func([]byte) string, contents ...[]byte) (*GoferConfig, string) {
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
			// [sha256, length, pack index, offset in pack, stored, codec(, blake3)]: serving reads 0, 1 and 6.
			row := []any{hex.EncodeToString(s[:]), n, 0, off, n, "none"}
			if c := check(data[off : off+n]); c != "" {
				row = append(row, c)
			}
			fe.Chunks = append(fe.Chunks, row)
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

// Which hash checks: BLAKE3 where every row has one, the SHA-256 name where not
// (schema 1), and a wrong BLAKE3 column over intact bytes is no alarm: the
// SHA-256 name decides. Altered bytes fail under each.
func TestEachCheckColumnCatchesAlteredBytesAndAWrongBlake3IsNoAlarm(t *testing.T) {
	data := randBytes(35, 1<<20)
	for name, check := range map[string]func([]byte) string{
		"blake3":       func(c []byte) string { s := blake3.Sum256(c); return hex.EncodeToString(s[:]) },
		"sha256 only":  func([]byte) string { return "" },
		"wrong blake3": func([]byte) string { return strings.Repeat("0", 64) },
	} {
		cfg, _ := entryWith(t, []int{128 << 10}, check, data)
		tg := verifyingGofer(t, cfg)
		if got, err := tg.read(0, 0, 1<<20); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: intact bytes: %v", name, err)
		}
		if (tg.g.tables[0].b3 == nil) != (name == "sha256 only") {
			t.Fatalf("%s: checked with the wrong hash", name)
		}
		bad := append([]byte(nil), data...)
		bad[300<<10] ^= 1
		os.WriteFile(cfg.Files[0].Path, bad, 0o600)
		tg2 := verifyingGofer(t, cfg)
		if _, err := tg2.read(0, 256<<10, 128<<10); !errors.Is(err, unix.EIO) {
			t.Fatalf("%s: altered bytes: want EIO, got %v", name, err)
		}
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

// The gofer's own cost of serving 256 MiB in the loader's sweep (256 KiB reads, 8 at once),
// from the page cache: plain preads against verify mode (each chunk hashed once).
// `go test -run - -bench Serve ./internal/stream` (docs/benchmarks.md).
func benchmarkServe(b *testing.B, verify bool) {
	data := randBytes(40, 256<<20)
	cfg, _ := entryOnDisk(b, []int{200 << 10, 260 << 10, 310 << 10, 250 << 10}, data)
	if !verify {
		cfg.Verify = ""
		cfg.Socket, cfg.Done = "/nonexistent", filepath.Join(filepath.Dir(cfg.Corrupt), "complete")
		writeMarker(cfg.Done)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		g, err := NewGofer(cfg)
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		next := make(chan int64, 64)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 256<<10)
				for off := range next {
					if err := g.readAt(0, buf[:min(int64(len(buf)), int64(len(data))-off)], off); err != nil {
						b.Error(err)
					}
				}
			}()
		}
		for off := int64(0); off < int64(len(data)); off += 256 << 10 {
			next <- off
		}
		close(next)
		wg.Wait()
		g.Destroy()
	}
}

func BenchmarkServePlain(b *testing.B)    { benchmarkServe(b, false) }
func BenchmarkServeVerified(b *testing.B) { benchmarkServe(b, true) }
