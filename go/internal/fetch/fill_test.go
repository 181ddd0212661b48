package fetch

// Unit tests of the fetch engine against an in-process HTTP server standing in
// for S3 (ranges served by net/http's ServeContent). The real store is
// exercised by tests/integration/test_store.py against SeaweedFS.

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeebo/blake3"
)

type testPack struct {
	body   []byte
	chunks []RangeChunk // Pos/Stored relative to the pack
}

// addChunk appends raw (zlib-coded when compress) to the pack and returns its chunk.
func (p *testPack) addChunk(t *testing.T, raw []byte, compress bool, places ...Place) RangeChunk {
	stored, codec := raw, CodecNone
	if compress {
		var b bytes.Buffer
		w := zlib.NewWriter(&b)
		w.Write(raw)
		w.Close()
		stored, codec = b.Bytes(), CodecZlib
	}
	c := RangeChunk{Chunk: Chunk{Sum: sha256.Sum256(raw), Raw: len(raw), Stored: len(stored), Codec: codec},
		Pos: len(p.body), Places: places}
	p.body = append(p.body, stored...)
	p.chunks = append(p.chunks, c)
	return c
}

// server serves the pack at /pack; fail decides per request whether to answer
// with an error status instead (0: serve).
func server(t *testing.T, body []byte, fail func(n int64) int) (*httptest.Server, *atomic.Int64) {
	return serverWith(t, body, func(n int64) (int, string) {
		if fail == nil {
			return 0, ""
		}
		return fail(n), "Injected"
	})
}

// serverWith is server whose failures carry an S3 error code of their own.
func serverWith(t *testing.T, body []byte, fail func(n int64) (int, string)) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if code, s3code := fail(i); code != 0 {
			w.WriteHeader(code)
			w.Write([]byte("<Error><Code>" + s3code + "</Code><Message>test says no</Message></Error>"))
			return
		}
		http.ServeContent(w, r, "pack", time.Time{}, bytes.NewReader(body))
	}))
	t.Cleanup(s.Close)
	return s, &n
}

func files(t *testing.T, sizes ...int64) []string {
	dir := t.TempDir()
	var out []string
	for i, n := range sizes {
		p := filepath.Join(dir, string(rune('a'+i)))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, n); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func run(t *testing.T, p *FillPlan, setup ...func(*Fill)) (*Fill, error) {
	t.Helper()
	j, err := NewFill(p)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, f := range setup {
		f(j)
	}
	return j, j.Run(context.Background())
}

// noRetry is a policy that tries once.
var noRetry = &RetryPolicy{MaxAttempts: 0, BudgetS: 0, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// One pack holding: an uncompressed chunk placed twice (two files), a
// compressible chunk stored with zlib, and an unaligned uncompressed chunk;
// ranges split the pack in two. Every byte must land where it belongs, with
// and without O_DIRECT.
func TestFillPlacesEveryChunk(t *testing.T) {
	for _, direct := range []bool{false, true} {
		{
			var pk testPack
			a := randBytes(1, 3*Align+100)
			z := bytes.Repeat([]byte("thaw "), 20000)
			c := randBytes(2, 5*Align+7)
			fs := files(t, int64(len(a)+len(z)+len(c)), int64(len(a)+11))
			ca := pk.addChunk(t, a, false, Place{0, 0}, Place{1, 11})
			cz := pk.addChunk(t, z, true, Place{0, int64(len(a))})
			cc := pk.addChunk(t, c, false, Place{0, int64(len(a) + len(z))})
			srv, _ := server(t, pk.body, nil)
			split := cc.Pos
			cc.Pos = 0
			p := &FillPlan{Version: FillPlanVersion, Workers: 2, Retry: noRetry, TimeoutS: 5, DirectIO: direct, Files: fs,
				Objects: []Object{{URL: srv.URL + "/pack", Name: "packs/x"}},
				Ranges:  []Range{{0, 0, split, []RangeChunk{ca, cz}}, {0, int64(split), len(c), []RangeChunk{cc}}}}
			j, err := run(t, p)
			if err != nil {
				t.Fatalf("direct=%v: %v", direct, err)
			}
			want0 := append(append(append([]byte{}, a...), z...), c...)
			if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, want0) {
				t.Fatalf("direct=%v: file 0 differs", direct)
			}
			if got, _ := os.ReadFile(fs[1]); !bytes.Equal(got, append(make([]byte, 11), a...)) {
				t.Fatalf("direct=%v: file 1 differs", direct)
			}
			if st := j.Stats(); st.FetchedChunks != 3 || st.WrittenBytes != int64(len(want0)+len(a)) {
				t.Fatalf("stats %v", st)
			}
			if d := j.directBytes.Load(); d%Align != 0 || (d > 0) != direct {
				t.Fatalf("direct=%v: %d bytes went out with O_DIRECT", direct, d)
			}
		}
	}
}

func onePackPlan(t *testing.T, url string, raw []byte) (*FillPlan, []string) {
	var pk testPack
	fs := files(t, int64(len(raw)))
	c := pk.addChunk(t, raw, false, Place{0, 0})
	return &FillPlan{Version: FillPlanVersion, Workers: 1, TimeoutS: 5, Files: fs,
		Objects: []Object{{URL: url, Name: "packs/p"}},
		Ranges:  []Range{{0, 0, len(raw), []RangeChunk{c}}}}, fs
}

// fakeClock stands in for time in the retry policy: sleeping advances it at
// once, so a unit test rides out "10 s" windows in milliseconds. The HTTP
// stand-in for S3 reads the same clock to decide when its window ends.
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	waits []time.Duration
	rnd   *rand.Rand
}

func newFakeClock(seed uint64) *fakeClock {
	return &fakeClock{t: time.Unix(1_000_000, 0), rnd: rand.New(rand.NewPCG(seed, 14))}
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) sleep(_ context.Context, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	c.waits = append(c.waits, d)
}

func (c *fakeClock) rand() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rnd.Float64()
}

func (c *fakeClock) install(f *Fill) {
	f.getter.Clock = Clock{Now: c.now, Sleep: c.sleep, Rand: c.rand}
}

// Every failure botocore's standard mode retries is retried, and nothing else
// is: a sequence of retryable failures then the object; each non-retryable one
// alone ends the fetch after one request.
func TestRetriesWhatBotocoreRetries(t *testing.T) {
	raw := randBytes(3, 10000)
	type answer struct {
		status int
		code   string
	}
	retried := []answer{{503, "SlowDown"}, {429, ""}, {500, "InternalError"}, {502, ""}, {504, ""},
		{400, "RequestTimeout"}, {503, "ServiceUnavailable"}, {400, "Throttling"}}
	srv, n := serverWith(t, raw, func(i int64) (int, string) {
		if int(i) <= len(retried) {
			return retried[i-1].status, retried[i-1].code
		}
		return 0, ""
	})
	p, fs := onePackPlan(t, srv.URL+"/pack", raw)
	clock := newFakeClock(1)
	j, err := run(t, p, clock.install)
	if err != nil || j.getter.Retries.Load() != int64(len(retried)) || n.Load() != int64(len(retried)+1) {
		t.Fatalf("err %v, retries %d, requests %d", err, j.getter.Retries.Load(), n.Load())
	}
	if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, raw) {
		t.Fatal("content differs after retries")
	}
	for _, no := range []answer{{403, "AccessDenied"}, {404, "NoSuchKey"}, {408, ""}, {501, "NotImplemented"},
		{400, "InvalidRange"}} {
		srv, n := serverWith(t, raw, func(int64) (int, string) { return no.status, no.code })
		p, _ := onePackPlan(t, srv.URL+"/pack", raw)
		j, err := run(t, p, newFakeClock(2).install)
		var fe *Error
		if !errors.As(err, &fe) || fe.Kind != "store" || n.Load() != 1 || j.getter.Retries.Load() != 0 ||
			strings.Contains(fe.Detail, "gave up") {
			t.Fatalf("HTTP %d %s: %v after %d requests", no.status, no.code, err, n.Load())
		}
	}
}

// A connection that breaks mid-body (botocore: HTTPClientError) is retried.
func TestBrokenBodyIsRetried(t *testing.T) {
	raw := randBytes(10, 100000)
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", len(raw)-1, len(raw)))
			w.Header().Set("Content-Length", fmt.Sprint(len(raw)))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(raw[:1000])
			panic(http.ErrAbortHandler) // closes the connection mid-body
		}
		http.ServeContent(w, r, "pack", time.Time{}, bytes.NewReader(raw))
	}))
	t.Cleanup(srv.Close)
	p, fs := onePackPlan(t, srv.URL+"/pack", raw)
	j, err := run(t, p, newFakeClock(3).install)
	if err != nil || j.getter.Retries.Load() != 1 || n.Load() != 2 {
		t.Fatalf("err %v, retries %d, requests %d", err, j.getter.Retries.Load(), n.Load())
	}
	if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, raw) {
		t.Fatal("content differs after a broken body")
	}
}

func TestClientErrorsAreNotRetriedAndNameTheObject(t *testing.T) {
	raw := randBytes(4, 1000)
	srv, n := server(t, raw, func(int64) int { return http.StatusForbidden })
	p, _ := onePackPlan(t, srv.URL+"/pack", raw)
	_, err := run(t, p)
	var fe *Error
	if !errors.As(err, &fe) || fe.Kind != "store" || fe.Object != "packs/p" || n.Load() != 1 ||
		fe.Store != srv.URL || !strings.Contains(fe.Detail, "HTTP 403 Code: Injected Message: test says no") {
		t.Fatalf("%#v after %d requests", err, n.Load())
	}
}

// window answers 503 SlowDown (or status) to every request that arrives
// within d of the first one, on the fake clock; then serves the pack.
func window(t *testing.T, raw []byte, clock *fakeClock, d time.Duration, status int, code string) (*httptest.Server, *atomic.Int64) {
	var once sync.Once
	var start time.Time
	return serverWith(t, raw, func(int64) (int, string) {
		now := clock.now()
		once.Do(func() { start = now })
		if now.Sub(start) < d {
			return status, code
		}
		return 0, ""
	})
}

// Issue 14 item 1: with the default policy a fetch rides out a 10 s window of
// 503 SlowDown, and of 502 (a transient error: botocore's 50 ms scale, so many
// more retries), whatever the jitter draws (20 seeds each).
func TestSurvivesATenSecondWindowWithDefaults(t *testing.T) {
	for _, w := range []struct {
		status int
		code   string
	}{{503, "SlowDown"}, {502, ""}, {500, "InternalError"}} {
		for seed := uint64(0); seed < 20; seed++ {
			raw := randBytes(seed, 5000)
			clock := newFakeClock(seed)
			srv, n := window(t, raw, clock, 10*time.Second, w.status, w.code)
			p, fs := onePackPlan(t, srv.URL+"/pack", raw)
			p.Retry = nil // the defaults
			j, err := run(t, p, clock.install)
			if err != nil {
				t.Fatalf("HTTP %d %s, seed %d: %v (after %d requests)", w.status, w.code, seed, err, n.Load())
			}
			if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, raw) {
				t.Fatal("content differs")
			}
			if j.getter.Retries.Load() < 4 { // it did meet the window: more than botocore's 3 retries
				t.Fatalf("seed %d: only %d retries", seed, j.getter.Retries.Load())
			}
		}
	}
}

// Before the budget, the same 10 s window ended the fetch: with the budget
// off (botocore's standard mode as such) a 10 s SlowDown window is not
// survived on most draws. This is what the budget buys.
func TestWithoutTheBudgetTheWindowIsNotSurvived(t *testing.T) {
	failed := 0
	for seed := uint64(0); seed < 20; seed++ {
		raw := randBytes(seed, 100)
		clock := newFakeClock(seed)
		srv, _ := window(t, raw, clock, 10*time.Second, 503, "SlowDown")
		p, _ := onePackPlan(t, srv.URL+"/pack", raw)
		p.Retry = &RetryPolicy{MaxAttempts: 3, BudgetS: 0, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}
		if _, err := run(t, p, clock.install); err != nil {
			failed++
		}
	}
	if failed != 20 { // 4 tries span at most 1+2+4 = 7 s
		t.Fatalf("%d of 20 fetches failed", failed)
	}
}

// An outage longer than the budget ends the fetch with one error, from the
// range that ran out first, naming the store, the object, the last answer and
// how long it was tried; the other ranges stop without errors of their own.
func TestLongOutageEndsInOneError(t *testing.T) {
	raw := randBytes(11, 30000)
	clock := newFakeClock(5)
	srv, n := window(t, raw, clock, time.Hour, 503, "SlowDown")
	var pk testPack
	fs := files(t, int64(len(raw)))
	var rs []Range
	for i := 0; i < 3; i++ {
		c := pk.addChunk(t, raw[i*10000:(i+1)*10000], false, Place{0, int64(i * 10000)})
		c.Pos = 0
		rs = append(rs, Range{0, int64(i * 10000), 10000, []RangeChunk{c}})
	}
	p := &FillPlan{Version: FillPlanVersion, Workers: 3, TimeoutS: 5, Files: fs,
		Objects: []Object{{URL: srv.URL + "/pack", Name: "packs/p"}}, Ranges: rs}
	j, err := run(t, p, clock.install)
	var fe *Error
	if !errors.As(err, &fe) || fe.Kind != "store" || fe.Object != "packs/p" || fe.Store != srv.URL ||
		!strings.Contains(fe.Detail, "HTTP 503 Code: SlowDown") ||
		!regexp.MustCompile(`; gave up after \d+ tries in 3\d\.\d s \(retry policy: 3 retries or 30 s\)$`).MatchString(fe.Detail) {
		t.Fatalf("%v", err)
	}
	// Each range that started made one first try; the rest were retries.
	if j.written.Load() != 0 || n.Load() < j.getter.Retries.Load()+1 || n.Load() > j.getter.Retries.Load()+3 {
		t.Fatalf("written %d, requests %d, retries %d", j.written.Load(), n.Load(), j.getter.Retries.Load())
	}
}

// A plan's "retry" object may leave fields out (they keep their defaults),
// or be left out (the defaults); an unknown field is refused.
func TestRetryFieldsDefault(t *testing.T) {
	var q FillPlan
	if err := json.Unmarshal([]byte(`{"retry":{"max_attempts":5}}`), &q); err != nil {
		t.Fatal(err)
	}
	if pol := q.Retry.OrDefault(); pol.MaxAttempts != 5 || pol.BudgetS != 30 || pol.BaseS != 1 ||
		pol.TransientBaseS != 0.05 || pol.MaxBackoffS != 20 {
		t.Fatalf("fields left out of \"retry\" must keep their defaults: %+v", pol)
	}
	var none FillPlan
	if pol := none.Retry.OrDefault(); pol != DefaultRetry {
		t.Fatalf("no \"retry\": %+v", pol)
	}
	if err := json.Unmarshal([]byte(`{"retry":{"max_attempt":5}}`), &q); err == nil {
		t.Fatal("an unknown retry field was accepted")
	}
	dec := json.NewDecoder(strings.NewReader(`{"attempts":3}`))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err == nil {
		t.Fatal(`the old "attempts" field was accepted: "retry" replaced it`)
	}
}

func TestAlteredBytesAreRefusedBeforeAnyWrite(t *testing.T) {
	raw := randBytes(6, 8192)
	altered := append([]byte{}, raw...)
	altered[4000] ^= 0x5a
	srv, _ := server(t, altered, nil)
	p, fs := onePackPlan(t, srv.URL+"/pack", raw)
	_, err := run(t, p)
	var fe *Error
	if !errors.As(err, &fe) || fe.Kind != "integrity" || !strings.Contains(fe.Detail, "sha256") ||
		!strings.Contains(fe.Detail, "altered") {
		t.Fatalf("%v", err)
	}
	if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, make([]byte, len(raw))) {
		t.Fatal("bytes of a bad chunk were written")
	}
}

// Issue 14 item 6: a plan row whose BLAKE3 check matches the bytes but whose
// SHA-256 name does not (a manifest that disagrees with itself) is refused,
// naming the chunk; thaw-fetch once installed it and `thaw verify` later
// called the entry corrupt. A row whose name matches is accepted whatever
// its BLAKE3 column says: the name is what the node trusts.
func TestChunkIsCheckedAgainstItsSHA256Name(t *testing.T) {
	raw := randBytes(12, 8192)
	srv, _ := server(t, raw, nil)
	for _, tc := range []struct {
		name, hash, check string
		ok                bool
	}{
		{"right blake3, wrong name", hexSum(sha256.Sum256(append(raw, 0))), hexSum(blake3.Sum256(raw)), false},
		{"right name, wrong blake3", hexSum(sha256.Sum256(raw)), strings.Repeat("0", 64), true},
		{"right name, no blake3", hexSum(sha256.Sum256(raw)), "", true},
	} {
		fs := files(t, int64(len(raw)))
		body := fmt.Sprintf(`{"version":%d,"workers":1,"timeout_s":5,"files":[%q],`+
			`"objects":[{"url":%q,"name":"packs/p"}],"ranges":[[0,0,%d,[[%q,%d,0,%d,"none",[[0,0]],%q]]]]}`,
			FillPlanVersion, fs[0], srv.URL+"/pack", len(raw), tc.hash, len(raw), len(raw), tc.check)
		var p FillPlan
		dec := json.NewDecoder(strings.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		_, err := run(t, &p)
		got, _ := os.ReadFile(fs[0])
		if tc.ok {
			if err != nil || !bytes.Equal(got, raw) {
				t.Fatalf("%s: %v", tc.name, err)
			}
			continue
		}
		var fe *Error
		if !errors.As(err, &fe) || fe.Kind != "integrity" || fe.Chunk != tc.hash || !strings.Contains(fe.Detail, "sha256") {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !bytes.Equal(got, make([]byte, len(raw))) {
			t.Fatalf("%s: bytes were written", tc.name)
		}
	}
}

func hexSum(b [32]byte) string { return hex.EncodeToString(b[:]) }

func TestShortObjectIsAStoreError(t *testing.T) {
	raw := randBytes(7, 5000)
	srv, n := server(t, raw[:100], nil)
	p, _ := onePackPlan(t, srv.URL+"/pack", raw)
	_, err := run(t, p)
	var fe *Error
	if !errors.As(err, &fe) || fe.Kind != "store" || !strings.Contains(fe.Detail, "does not match its manifest") ||
		n.Load() != 1 {
		t.Fatalf("%v after %d requests", err, n.Load())
	}
}

func TestPlanCheckRefusesWritesOutsideTheFiles(t *testing.T) {
	raw := randBytes(8, 100)
	p, _ := onePackPlan(t, "http://127.0.0.1:1/pack", raw)
	p.Ranges[0].Chunks[0].Places[0].Off = 1
	if _, err := NewFill(p); err == nil || !strings.Contains(err.Error(), "outside the files") {
		t.Fatalf("%v", err)
	}
	p.Ranges[0].Chunks[0].Places[0].Off = 0
	p.Version = 1
	if _, err := NewFill(p); err == nil || !strings.Contains(err.Error(), "plan version") {
		t.Fatalf("%v", err)
	}
	p.Version = FillPlanVersion
	p.Retry = &RetryPolicy{MaxAttempts: -1, BaseS: 1, TransientBaseS: 1, MaxBackoffS: 1}
	if _, err := NewFill(p); err == nil || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("%v", err)
	}
}

// A file system that takes O_DIRECT opens but refuses the writes (EINVAL
// here: a descriptor that cannot write stands in for it): the first refused
// write is done again buffered, and O_DIRECT is not tried again.
func TestDirectWriteRefusedFallsBackToBuffered(t *testing.T) {
	var pk testPack
	a := randBytes(13, 5*Align)
	b := randBytes(14, 3*Align)
	fs := files(t, int64(len(a)+len(b)))
	ca := pk.addChunk(t, a, false, Place{0, 0})
	cb := pk.addChunk(t, b, false, Place{0, int64(len(a))})
	srv, _ := server(t, pk.body, nil)
	cb.Pos = 0
	p := &FillPlan{Version: FillPlanVersion, Workers: 1, Retry: noRetry, TimeoutS: 5, DirectIO: true, Files: fs,
		Objects: []Object{{URL: srv.URL + "/pack", Name: "packs/x"}},
		Ranges:  []Range{{0, 0, len(a), []RangeChunk{ca}}, {0, int64(len(a)), len(b), []RangeChunk{cb}}}}
	refuse := func(f *Fill) {
		if f.dfds[0] == nil {
			t.Fatal("the test's file system refuses O_DIRECT")
		}
		f.dfds[0].Close()
		ro, err := os.Open(fs[0]) // read-only: every write through it fails
		if err != nil {
			t.Fatal(err)
		}
		f.dfds[0] = ro
	}
	f, err := run(t, p, refuse)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, append(append([]byte{}, a...), b...)) {
		t.Fatal("the file differs")
	}
	if f.direct.Load() || f.directBytes.Load() != 0 || f.written.Load() != int64(len(a)+len(b)) {
		t.Fatalf("direct %v, %d bytes with O_DIRECT, %d written", f.direct.Load(), f.directBytes.Load(), f.written.Load())
	}
}
