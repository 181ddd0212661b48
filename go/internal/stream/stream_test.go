package stream

// Unit tests of the stream's range bookkeeping and of the gofer's reads,
// with an in-process HTTP server standing in for the store (ranges served by
// net/http's ServeContent). The real store, runsc and sentry are exercised by
// tests/integration/test_stream.py.

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/state/stateio"

	"thaw.dev/thaw/go/internal/fetch"
)

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// -- Extents ----------------------------------------------------------------------

func TestExtentsMatchABitmap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		var e Extents
		bits := make([]bool, 320)
		for k := 0; k < 30; k++ {
			off, n := r.IntN(280), r.IntN(25)
			e.Add(int64(off), int64(n))
			for i := off; i < off+n; i++ {
				bits[i] = true
			}
			for q := 0; q < 20; q++ {
				o, m := r.IntN(290), r.IntN(10)
				want := true
				for i := o; i < o+m; i++ {
					want = want && bits[i]
				}
				if got := e.Covers(int64(o), int64(m)); got != want {
					t.Fatalf("round %d: Covers(%d, %d) = %v, bitmap says %v (extents %v)", round, o, m, got, want, e.List())
				}
			}
		}
		count := int64(0)
		for _, b := range bits {
			if b {
				count++
			}
		}
		if e.Bytes() != count {
			t.Fatalf("Bytes() = %d, bitmap has %d", e.Bytes(), count)
		}
		l := e.List()
		for i := 1; i < len(l); i++ {
			if l[i-1][0]+l[i-1][1] >= l[i][0] {
				t.Fatalf("ranges not merged: %v", l)
			}
		}
	}
}

// -- a store and a plan -----------------------------------------------------------

type image struct {
	dir    string
	files  [][]byte // what each file must hold
	pack   []byte   // pack 0
	packs  [][]byte // every pack, when files go to packs of their own (newImagePacks)
	chunks []Chunk
	ready  [][3]int64
}

// newImage cuts each file into chunks of `size` bytes (every third zlib-coded),
// packs them in file order, and makes empty full-size files to fill.
func newImage(t *testing.T, size int, contents ...[]byte) *image {
	return newImagePacks(t, size, 1, contents...)
}

// newImagePacks puts file f's chunks into pack f % npacks.
func newImagePacks(t *testing.T, size, npacks int, contents ...[]byte) *image {
	im := &image{dir: t.TempDir(), files: contents, packs: make([][]byte, npacks)}
	defer func() { im.pack = im.packs[0] }()
	for f, data := range contents {
		im.pack = im.packs[f%npacks]
		for off := 0; off < len(data); off += size {
			raw := data[off:min(off+size, len(data))]
			stored, codec := raw, fetch.CodecNone
			if (off/size)%3 == 1 {
				var b bytes.Buffer
				w := zlib.NewWriter(&b)
				w.Write(raw)
				w.Close()
				stored, codec = b.Bytes(), fetch.CodecZlib
			}
			c := Chunk{Chunk: fetch.Chunk{Sum: sha256.Sum256(raw), Check: blake3.Sum256(raw), HasCheck: f%2 == 0,
				Raw: len(raw), Stored: len(stored), Codec: codec}, Offset: int64(len(im.pack)),
				Places: []Place{{f, int64(off)}}, Object: f % npacks}
			im.pack = append(im.pack, stored...)
			im.chunks = append(im.chunks, c)
		}
		im.packs[f%npacks] = im.pack
		p := im.path(f)
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		os.Truncate(p, int64(len(data)))
	}
	return im
}

func (im *image) path(f int) string { return filepath.Join(im.dir, "f"+strconv.Itoa(f)) }

func (im *image) plan(url string) *Plan {
	p := &Plan{Version: PlanVersion, Workers: 2, UrgentWorkers: 2, Retry: &quickRetry, TimeoutS: 5, RangeBytes: 1 << 20,
		UrgentAheadBytes: 0, Chunks: im.chunks, Ready: im.ready,
		Listen: filepath.Join(im.dir, "stream.sock"), Complete: filepath.Join(im.dir, "complete")}
	for i := range im.packs {
		p.Objects = append(p.Objects, Object{URL: url + "/p" + strconv.Itoa(i), Name: "packs/p" + strconv.Itoa(i)})
	}
	for f, data := range im.files {
		p.Files = append(p.Files, File{Path: im.path(f), Size: int64(len(data))})
	}
	return p
}

// store serves the pack; before each request, gate (if set) may delay or fail
// it; every requested range is recorded.
type store struct {
	srv    *httptest.Server
	mu     sync.Mutex
	ranges []string
	gate   func(rng string) int // status to fail with, 0 to serve
	rate   int                  // bytes per second the body is sent at (0: unlimited)
}

func newStore(t *testing.T, body []byte, more ...[]byte) *store {
	s := &store{}
	packs := append([][]byte{body}, more...)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/p"))
		body := packs[i]
		rng := r.URL.Path + " " + r.Header.Get("Range")
		s.mu.Lock()
		s.ranges = append(s.ranges, rng)
		gate, rate := s.gate, s.rate
		s.mu.Unlock()
		if gate != nil {
			if code := gate(rng); code != 0 {
				w.WriteHeader(code)
				return
			}
		}
		var src io.ReadSeeker = bytes.NewReader(body)
		if rate > 0 {
			src = &slowReader{ReadSeeker: src, rate: rate}
		}
		http.ServeContent(w, r, "pack", time.Time{}, src)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *store) requested() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ranges...)
}

type slowReader struct {
	io.ReadSeeker
	rate int
}

func (r *slowReader) Read(p []byte) (int, error) {
	p = p[:min(len(p), 16<<10)]
	n, err := r.ReadSeeker.Read(p)
	time.Sleep(time.Duration(n) * time.Second / time.Duration(r.rate))
	return n, err
}

type streamRun struct {
	e    *Engine
	done chan error
}

func startStream(t *testing.T, p *Plan) *streamRun {
	e, err := NewEngine(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	l, err := e.Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	r := &streamRun{e: e, done: make(chan error, 1)}
	go func() { r.done <- e.Run(context.Background(), l) }()
	return r
}

func (r *streamRun) wait(t *testing.T) error {
	select {
	case err := <-r.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the stream did not end")
		return nil
	}
}

// -- the stream ---------------------------------------------------------------------

// Every chunk ends up verified at every place; the marker is written last;
// a gofer that connects after the end still learns everything.
func TestStreamFillsEveryFileAndWritesTheMarker(t *testing.T) {
	im := newImage(t, 64<<10, randBytes(1, 300<<10+17), randBytes(2, 3<<20), bytes.Repeat([]byte("thaw "), 50000))
	st := newStore(t, im.pack)
	p := im.plan(st.srv.URL)
	if CompleteMarker(p.Complete) {
		t.Fatal("marker before the run")
	}
	r := startStream(t, p)
	if err := r.wait(t); err != nil {
		t.Fatal(err)
	}
	for f, want := range im.files {
		got, _ := os.ReadFile(im.path(f))
		if !bytes.Equal(got, want) {
			t.Fatalf("file %d differs", f)
		}
	}
	if !CompleteMarker(p.Complete) {
		t.Fatal("no complete marker")
	}
	s := r.e.Stats()
	if s.FetchedChunks != int64(len(im.chunks)) || s.UrgentChunks != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// The bulk order goes out as ranged GETs of one pack each, of at most
// range_bytes, in the plan's order.
func TestBulkGETsStayWithinOnePackAndRangeBytes(t *testing.T) {
	im := newImagePacks(t, 64<<10, 2, randBytes(12, 3<<20), randBytes(13, 2<<20+5))
	st := newStore(t, im.packs[0], im.packs[1])
	p := im.plan(st.srv.URL)
	p.Workers, p.RangeBytes = 1, 1<<20
	if err := startStream(t, p).wait(t); err != nil {
		t.Fatal(err)
	}
	for f, want := range im.files {
		if got, _ := os.ReadFile(im.path(f)); !bytes.Equal(got, want) {
			t.Fatalf("file %d differs", f)
		}
	}
	reqs := st.requested()
	last := ""
	for _, q := range reqs {
		var path string
		var a, b int64
		if _, err := fmt.Sscanf(q, "%s bytes=%d-%d", &path, &a, &b); err != nil {
			t.Fatalf("request %q: %v", q, err)
		}
		if b-a+1 > 1<<20 {
			t.Fatalf("a GET of %d bytes (%q): more than range_bytes", b-a+1, q)
		}
		if path < last {
			t.Fatalf("requests out of the plan's order: %v", reqs)
		}
		last = path
	}
	if len(reqs) < 5 {
		t.Fatalf("%d GETs for 5 MiB in 1 MiB ranges: %v", len(reqs), reqs)
	}
}

// A changed byte in the store ends the stream with an integrity error naming
// the chunk; no marker; a connected gofer is told at once.
func TestStreamRefusesAnAlteredChunk(t *testing.T) {
	im := newImage(t, 64<<10, randBytes(3, 1<<20))
	bad := append([]byte(nil), im.pack...)
	victim := im.chunks[5]
	bad[victim.Offset+10] ^= 1
	st := newStore(t, bad)
	st.rate = 2 << 20 // slow enough for a gofer to connect first
	p := im.plan(st.srv.URL)
	r := startStream(t, p)
	g := newTestGofer(t, p, im, 5)
	err := r.wait(t)
	var fe *fetch.Error
	if !errors.As(err, &fe) || fe.Kind != "integrity" || fe.Chunk != hex.EncodeToString(victim.Sum[:]) {
		t.Fatalf("want an integrity error for chunk %x, got %v", victim.Sum, err)
	}
	if CompleteMarker(p.Complete) {
		t.Fatal("a failed stream wrote the complete marker")
	}
	// The altered chunk is never served: its read fails now, not after the deadline.
	t0 := time.Now()
	if _, err := g.read(0, victim.Places[0].Off, 4096); !errors.Is(err, unix.EIO) || time.Since(t0) > 2*time.Second {
		t.Fatalf("read after the failure: %v after %v", err, time.Since(t0))
	}
}

// A range asked for is fetched ahead of the bulk order: with one bulk worker
// on a slow store, the last chunk of the file arrives long before the bulk
// would have reached it.
func TestWantJumpsTheBulkQueue(t *testing.T) {
	size := 64 << 10
	im := newImage(t, size, randBytes(4, 4<<20))
	st := newStore(t, im.pack)
	st.rate = 4 << 20 // 4 MiB/s: the bulk needs ~1 s for the file
	p := im.plan(st.srv.URL)
	p.Workers, p.UrgentWorkers, p.RangeBytes = 1, 1, 1<<20
	r := startStream(t, p)
	g := newTestGofer(t, p, im, 5)
	last := im.chunks[len(im.chunks)-1]
	t0 := time.Now()
	got, err := g.readFault(0, last.Places[0].Off, int64(last.Raw))
	waited := time.Since(t0)
	if err != nil || !bytes.Equal(got, im.files[0][last.Places[0].Off:]) {
		t.Fatalf("fault read: %v", err)
	}
	if waited > 400*time.Millisecond {
		t.Fatalf("the faulted chunk took %v: it waited behind the bulk", waited)
	}
	if err := r.wait(t); err != nil {
		t.Fatal(err)
	}
	reqs := st.requested()
	want := "/p0 bytes=" + strconv.FormatInt(last.Offset, 10) + "-"
	idx := -1
	for i, q := range reqs {
		if strings.HasPrefix(q, want) {
			idx = i
			break
		}
	}
	if idx < 0 || idx > 2 {
		t.Fatalf("the urgent range %s... was request %d of %v", want, idx, reqs)
	}
	if s := r.e.Stats(); s.UrgentChunks < 1 || s.Wants < 1 {
		t.Fatalf("stats %+v", s)
	}
	if f := r.e.Faults(); len(f) != 1 || f[0] != [3]int64{0, last.Places[0].Off, int64(last.Raw)} {
		t.Fatalf("recorded faults %v", f)
	}
}

// A chunk is checked against its SHA-256 name, whatever the manifest's
// BLAKE3 column says (docs/store.md "Integrity").
func TestStreamChecksTheSHA256Name(t *testing.T) {
	im := newImage(t, 64<<10, randBytes(14, 256<<10))
	im.chunks[2].Sum[0] ^= 1 // its BLAKE3 still matches the bytes
	st := newStore(t, im.pack)
	err := startStream(t, im.plan(st.srv.URL)).wait(t)
	var fe *fetch.Error
	if !errors.As(err, &fe) || fe.Kind != "integrity" || !strings.Contains(fe.Detail, "sha256") {
		t.Fatalf("want an integrity error on the SHA-256 name, got %v", err)
	}
}

// Ready ranges (zero chunks, local copies) are present from the start; a
// plan whose chunks are all ready completes without a GET.
func TestReadyRangesNeedNoFetch(t *testing.T) {
	im := newImage(t, 64<<10, make([]byte, 256<<10))
	im.chunks = nil
	im.ready = [][3]int64{{0, 0, 256 << 10}}
	st := newStore(t, im.pack)
	r := startStream(t, im.plan(st.srv.URL))
	if err := r.wait(t); err != nil {
		t.Fatal(err)
	}
	if n := len(st.requested()); n != 0 {
		t.Fatalf("%d GETs for a plan with nothing to fetch", n)
	}
}

// seal rewrites im's pack with every chunk sealed as an encrypting tenant
// stores it (issue 13: nonce || AES-256-GCM(payload) || tag, the chunk's
// SHA-256 and codec as associated data; control/images/keys.py seal_chunk),
// each under a key of its own; the plan carries the keys.
func (im *image) seal(t *testing.T, seed uint64) {
	var pack []byte
	for i := range im.chunks {
		c := &im.chunks[i]
		payload := im.pack[c.Offset : c.Offset+int64(c.Stored)]
		c.Key = randBytes(seed+uint64(i), fetch.KeyBytes)
		block, err := aes.NewCipher(c.Key)
		if err != nil {
			t.Fatal(err)
		}
		gcm, _ := cipher.NewGCM(block)
		nonce := randBytes(seed^0xfeed+uint64(i), fetch.NonceBytes)
		aad := append(append([]byte(nil), c.Sum[:]...), c.Codec...)
		sealed := append(nonce, gcm.Seal(nil, nonce, payload, aad)...)
		c.Offset, c.Stored = int64(len(pack)), len(sealed)
		pack = append(pack, sealed...)
	}
	im.pack, im.packs = pack, [][]byte{pack}
}

// An encrypting tenant's image streams as a plaintext one does: each chunk's
// tag is checked and the chunk decrypted (then inflated, then checked against
// its SHA-256 name) before a byte of it is written or served.
func TestStreamOpensSealedChunks(t *testing.T) {
	im := newImage(t, 64<<10, randBytes(21, 700<<10+3), bytes.Repeat([]byte("sealed "), 40000))
	im.seal(t, 100)
	st := newStore(t, im.pack)
	st.rate = 4 << 20 // slow enough for a read to wait
	p := im.plan(st.srv.URL)
	r := startStream(t, p)
	g := newTestGofer(t, p, im, 5)
	last := im.chunks[len(im.chunks)-1]
	got, err := g.readFault(last.Places[0].File, last.Places[0].Off, int64(last.Raw))
	if err != nil || !bytes.Equal(got, im.files[last.Places[0].File][last.Places[0].Off:]) {
		t.Fatalf("a faulted read of a sealed chunk: %v", err)
	}
	if err := r.wait(t); err != nil {
		t.Fatal(err)
	}
	for f, want := range im.files {
		if got, _ := os.ReadFile(im.path(f)); !bytes.Equal(got, want) {
			t.Fatalf("file %d differs", f)
		}
	}
}

// A sealed chunk whose tag does not verify (altered in the store, or sealed
// under another tenant's key) ends the stream with an integrity error naming
// it; nothing of it is served.
func TestStreamRefusesASealedChunkThatDoesNotOpen(t *testing.T) {
	for _, how := range []string{"altered", "other key"} {
		t.Run(how, func(t *testing.T) {
			im := newImage(t, 64<<10, randBytes(22, 1<<20))
			im.seal(t, 200)
			victim := &im.chunks[4]
			if how == "altered" {
				im.pack[victim.Offset+int64(victim.Stored)/2] ^= 1
			} else {
				victim.Key = randBytes(999, fetch.KeyBytes)
			}
			st := newStore(t, im.pack)
			err := startStream(t, im.plan(st.srv.URL)).wait(t)
			var fe *fetch.Error
			if !errors.As(err, &fe) || fe.Kind != "integrity" || fe.Chunk != hex.EncodeToString(victim.Sum[:]) ||
				!strings.Contains(fe.Detail, "do not open") {
				t.Fatalf("want an integrity error for chunk %x, got %v", victim.Sum, err)
			}
			if strings.Contains(err.Error(), hex.EncodeToString(victim.Key)) {
				t.Fatal("the chunk key is in the error")
			}
		})
	}
}

// A plan's chunk key is 64 hex digits, and a sealed chunk stores its
// payload plus the nonce and tag.
func TestPlanChecksSealedChunks(t *testing.T) {
	var c Chunk
	h := strings.Repeat("ab", 32)
	if err := json.Unmarshal([]byte(`["`+h+`", 10, 0, 0, 38, "none", [[0, 0]], "", "`+h+`"]`), &c); err != nil ||
		len(c.Key) != fetch.KeyBytes {
		t.Fatalf("a sealed chunk: %v", err)
	}
	if err := json.Unmarshal([]byte(`["`+h+`", 10, 0, 0, 38, "none", [[0, 0]], "", "abc"]`), &c); err == nil ||
		strings.Contains(err.Error(), "abc") {
		t.Fatalf("a short key: %v", err)
	}
	im := newImage(t, 64<<10, randBytes(23, 128<<10))
	im.seal(t, 300)
	p := im.plan("http://127.0.0.1:1")
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	p.Chunks[0].Stored = p.Chunks[0].Raw // a sealed uncompressed chunk without its overhead
	if p.Chunks[0].Codec == fetch.CodecNone {
		if err := p.Check(); err == nil {
			t.Fatal("a sealed chunk without room for its nonce and tag passed the check")
		}
	}
}

// -- the gofer ------------------------------------------------------------------------

type testGofer struct {
	g  *Gofer
	rs []*reader
	id int
}

func goferConfig(p *Plan, im *image, deadline float64) *GoferConfig {
	cfg := &GoferConfig{Version: GoferConfigVersion, Socket: p.Listen, Done: p.Complete, DeadlineS: deadline,
		MaxParallel: 8, MaxReadBytes: 256 << 10, Log: filepath.Join(im.dir, "gofer.log")}
	for f := range im.files {
		cfg.Files = append(cfg.Files, GoferFile{Name: "f" + strconv.Itoa(f), Path: im.path(f), Size: p.Files[f].Size,
			Pages: f == 0})
	}
	return cfg
}

func newTestGofer(t *testing.T, p *Plan, im *image, deadline float64) *testGofer {
	g, err := NewGofer(goferConfig(p, im, deadline))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Destroy)
	tg := &testGofer{g: g}
	for f := range im.files {
		ar, err := g.OpenRead("f" + strconv.Itoa(f))
		if err != nil {
			t.Fatal(err)
		}
		tg.rs = append(tg.rs, ar.(*reader))
		t.Cleanup(func() { ar.Close() })
	}
	return tg
}

// read is one AddRead + Wait, as stateipc's readerMain does it.
func (tg *testGofer) read(file int, off, n int64) ([]byte, error) {
	return tg.readAs(file, off, n, false)
}

// readFault reads as a task faulting on a page would (far ahead of the sweep).
func (tg *testGofer) readFault(file int, off, n int64) ([]byte, error) {
	return tg.readAs(file, off, n, true)
}

func (tg *testGofer) readAs(file int, off, n int64, fault bool) ([]byte, error) {
	r := tg.rs[file]
	if fault {
		r.window = -1 << 62 // every read is beyond the sweep
	} else {
		r.window = 1 << 62
	}
	dst := make([]byte, n)
	tg.id = (tg.id + 1) % r.MaxParallel()
	r.AddRead(tg.id, off, nil, memmap.FileRange{}, dst)
	cs, err := r.Wait(nil, 1)
	if err != nil {
		return nil, err
	}
	c := cs[0]
	if c.ID != tg.id {
		return nil, errors.New("completion of another read")
	}
	return dst[:c.N], c.Err
}

// fakeStream is the stream's side of the socket, driven by the test.
type fakeStream struct {
	l    net.Listener
	conn chan net.Conn
}

func newFakeStream(t *testing.T, path string) *fakeStream {
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	fs := &fakeStream{l: l, conn: make(chan net.Conn, 1)}
	go func() {
		c, err := l.Accept()
		if err == nil {
			fs.conn <- c
		}
	}()
	return fs
}

func (fs *fakeStream) accept(t *testing.T) net.Conn {
	select {
	case c := <-fs.conn:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("the gofer did not connect")
		return nil
	}
}

func send(t *testing.T, c net.Conn, m message) {
	b, _ := json.Marshal(m)
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}

// goferOnFake writes the image's bytes to disk (as a stream would have) and
// starts a gofer connected to a fake stream.
func goferOnFake(t *testing.T, deadline float64, contents ...[]byte) (*testGofer, net.Conn, *image, *Plan) {
	im := newImage(t, 64<<10, contents...)
	for f, data := range contents {
		os.WriteFile(im.path(f), data, 0o644)
	}
	p := im.plan("http://unused.invalid")
	fs := newFakeStream(t, p.Listen)
	tg := newTestGofer(t, p, im, deadline)
	return tg, fs.accept(t), im, p
}

type result struct {
	data []byte
	err  error
	at   time.Duration
}

func async(f func() ([]byte, error)) chan result {
	ch := make(chan result, 1)
	t0 := time.Now()
	go func() {
		d, err := f()
		ch <- result{d, err, time.Since(t0)}
	}()
	return ch
}

// A read blocks until its whole range is announced: never a short read or
// the zeros of a hole for bytes that are only late.
func TestGoferReadBlocksUntilItsRangeIsVerified(t *testing.T) {
	data := randBytes(5, 1<<20)
	tg, c, _, _ := goferOnFake(t, 10, data)
	ch := async(func() ([]byte, error) { return tg.read(0, 100<<10, 64<<10) })
	send(t, c, message{Have: [][3]int64{{0, 0, 120 << 10}}}) // the first part only
	select {
	case r := <-ch:
		t.Fatalf("read returned %d bytes (%v) before its range was complete", len(r.data), r.err)
	case <-time.After(200 * time.Millisecond):
	}
	send(t, c, message{Have: [][3]int64{{0, 120 << 10, 100 << 10}}})
	r := <-ch
	if r.err != nil || !bytes.Equal(r.data, data[100<<10:164<<10]) {
		t.Fatalf("read: %v", r.err)
	}
}

// Past its deadline a read fails with EIO (the sentry then kills the
// sandbox); so does every waiting read when the stream reports an error or
// goes away without its marker.
func TestGoferFailsLateReadsAtTheDeadlineAndOnStreamFailure(t *testing.T) {
	tg, c, _, _ := goferOnFake(t, 0.3, randBytes(6, 1<<20))
	r := <-async(func() ([]byte, error) { return tg.read(0, 0, 4096) })
	if !errors.Is(r.err, unix.EIO) || r.at < 250*time.Millisecond || r.at > 2*time.Second {
		t.Fatalf("want EIO at the 0.3 s deadline, got %v after %v", r.err, r.at)
	}

	tg2, c2, _, _ := goferOnFake(t, 30, randBytes(7, 1<<20))
	ch := async(func() ([]byte, error) { return tg2.read(0, 0, 4096) })
	time.Sleep(100 * time.Millisecond)
	send(t, c2, message{Error: "integrity chunk ...: altered"})
	if r := <-ch; !errors.Is(r.err, unix.EIO) || r.at > 2*time.Second {
		t.Fatalf("want EIO at once on the stream's error, got %v after %v", r.err, r.at)
	}

	tg3, c3, _, _ := goferOnFake(t, 30, randBytes(8, 1<<20))
	ch = async(func() ([]byte, error) { return tg3.read(0, 0, 4096) })
	time.Sleep(100 * time.Millisecond)
	c3.Close() // killed: no marker
	if r := <-ch; !errors.Is(r.err, unix.EIO) || r.at > 2*time.Second {
		t.Fatalf("want EIO at once when the stream dies, got %v after %v", r.err, r.at)
	}
	_ = c
}

// A stream that exits after writing its marker leaves everything readable,
// whether the gofer was connected or never could connect.
func TestGoferTrustsTheCompleteMarkerOnly(t *testing.T) {
	data := randBytes(9, 512<<10)
	tg, c, _, p := goferOnFake(t, 30, data)
	writeMarker(p.Complete)
	c.Close()
	r := <-async(func() ([]byte, error) { return tg.read(0, 300<<10, 100<<10) })
	if r.err != nil || !bytes.Equal(r.data, data[300<<10:400<<10]) {
		t.Fatalf("after the marker: %v", r.err)
	}

	for _, marker := range []bool{false, true} {
		im := newImage(t, 64<<10, data)
		os.WriteFile(im.path(0), data, 0o644)
		p := im.plan("http://unused.invalid") // nobody listens
		if marker {
			writeMarker(p.Complete)
		}
		tg := newTestGofer(t, p, im, 30)
		r := <-async(func() ([]byte, error) { return tg.read(0, 0, 4096) })
		if marker && (r.err != nil || !bytes.Equal(r.data, data[:4096])) {
			t.Fatalf("unreachable stream with its marker: %v", r.err)
		}
		if !marker && (!errors.Is(r.err, unix.EIO) || r.at > time.Second) {
			t.Fatalf("unreachable stream without a marker: want EIO at once, got %v after %v", r.err, r.at)
		}
	}
}

// Reads past the end behave as on a regular file: the bytes up to the end,
// then io.EOF.
func TestGoferEOFOnlyPastTheEnd(t *testing.T) {
	data := randBytes(10, 100<<10)
	tg, c, _, _ := goferOnFake(t, 5, data)
	send(t, c, message{Have: [][3]int64{{0, 0, 100 << 10}}})
	got, err := tg.read(0, 90<<10, 64<<10)
	if err != io.EOF || !bytes.Equal(got, data[90<<10:]) {
		t.Fatalf("straddling read: %d bytes, %v", len(got), err)
	}
	got, err = tg.read(0, 100<<10, 4096)
	if err != io.EOF || len(got) != 0 {
		t.Fatalf("read at the end: %d bytes, %v", len(got), err)
	}
}

// The loader's sweep reads (front to back, within the window) send nothing;
// a read far beyond it is a fault: asked for with fault=true.
func TestGoferAsksForFaultsAndNotForTheSweep(t *testing.T) {
	data := randBytes(11, 1<<20)
	tg, c, _, _ := goferOnFake(t, 5, data)
	send(t, c, message{Have: [][3]int64{{0, 0, 1 << 20}}})
	r := tg.rs[0]
	r.window = 128 << 10
	for off := int64(0); off < 256<<10; off += 64 << 10 { // the sweep
		dst := make([]byte, 64<<10)
		r.AddRead(0, off, nil, memmap.FileRange{}, dst)
		if cs, _ := r.Wait(nil, 1); cs[0].Err != nil {
			t.Fatal(cs[0].Err)
		}
	}
	dst := make([]byte, 4096)
	r.AddRead(0, 900<<10, nil, memmap.FileRange{}, dst) // far ahead
	r.Wait(nil, 1)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var m message
	json.Unmarshal(line, &m)
	if m.Want == nil || *m.Want != [3]int64{0, 900 << 10, 4096} || !m.Fault {
		t.Fatalf("want a fault for 0+%d, got %s", 900<<10, line)
	}
}

var _ = stateio.Completion{}
