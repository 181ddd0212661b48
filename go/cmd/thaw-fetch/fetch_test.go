package main

// Unit tests of the fetch engine against an in-process HTTP server standing in
// for S3 (ranges served by net/http's ServeContent). The real store is
// exercised by tests/integration/test_store.py against SeaweedFS.

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeebo/blake3"
)

type testPack struct {
	body   []byte
	chunks []chunk // pos/stored relative to the pack
}

// addChunk appends raw (zlib-coded when compress) to the pack and returns its chunk.
func (p *testPack) addChunk(t *testing.T, raw []byte, compress, withCheck bool, places ...place) chunk {
	stored, codec := raw, codecNone
	if compress {
		var b bytes.Buffer
		w := zlib.NewWriter(&b)
		w.Write(raw)
		w.Close()
		stored, codec = b.Bytes(), codecZlib
	}
	c := chunk{sum: sha256.Sum256(raw), raw: len(raw), pos: len(p.body), stored: len(stored), codec: codec,
		places: places}
	if withCheck {
		c.check, c.hasCheck = blake3.Sum256(raw), true
	}
	p.body = append(p.body, stored...)
	p.chunks = append(p.chunks, c)
	return c
}

// server serves the pack at /pack; fail decides per request whether to answer
// with an error status instead (0: serve).
func server(t *testing.T, body []byte, fail func(n int64) int) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if fail != nil {
			if code := fail(i); code != 0 {
				w.WriteHeader(code)
				w.Write([]byte("<Error><Code>Injected</Code><Message>test says no</Message></Error>"))
				return
			}
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

func run(t *testing.T, p *plan) (*job, error) {
	t.Helper()
	j, err := newJob(p)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	return j, j.run(context.Background())
}

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
// and without O_DIRECT, checked by BLAKE3 or by SHA-256.
func TestFillPlacesEveryChunk(t *testing.T) {
	for _, direct := range []bool{false, true} {
		for _, withCheck := range []bool{false, true} {
			var pk testPack
			a := randBytes(1, 3*align+100)
			z := bytes.Repeat([]byte("thaw "), 20000)
			c := randBytes(2, 5*align+7)
			fs := files(t, int64(len(a)+len(z)+len(c)), int64(len(a)+11))
			ca := pk.addChunk(t, a, false, withCheck, place{0, 0}, place{1, 11})
			cz := pk.addChunk(t, z, true, withCheck, place{0, int64(len(a))})
			cc := pk.addChunk(t, c, false, withCheck, place{0, int64(len(a) + len(z))})
			srv, _ := server(t, pk.body, nil)
			split := cc.pos
			cc.pos = 0
			p := &plan{Version: PlanVersion, Workers: 2, Attempts: 1, TimeoutS: 5, DirectIO: direct, Files: fs,
				Objects: []object{{URL: srv.URL + "/pack", Name: "packs/x"}},
				Ranges:  []rng{{0, 0, split, []chunk{ca, cz}}, {0, int64(split), len(c), []chunk{cc}}}}
			j, err := run(t, p)
			if err != nil {
				t.Fatalf("direct=%v check=%v: %v", direct, withCheck, err)
			}
			want0 := append(append(append([]byte{}, a...), z...), c...)
			if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, want0) {
				t.Fatalf("direct=%v: file 0 differs", direct)
			}
			if got, _ := os.ReadFile(fs[1]); !bytes.Equal(got, append(make([]byte, 11), a...)) {
				t.Fatalf("direct=%v: file 1 differs", direct)
			}
			if st := j.stats(); st["fetched_chunks"].(int64) != 3 || st["written_bytes"].(int64) != int64(len(want0)+len(a)) {
				t.Fatalf("stats %v", st)
			}
			if d := j.directBytes.Load(); d%align != 0 || (d > 0) != direct {
				t.Fatalf("direct=%v: %d bytes went out with O_DIRECT", direct, d)
			}
		}
	}
}

func onePackPlan(t *testing.T, url string, raw []byte, withCheck bool) (*plan, []string) {
	var pk testPack
	fs := files(t, int64(len(raw)))
	c := pk.addChunk(t, raw, false, withCheck, place{0, 0})
	return &plan{Version: PlanVersion, Workers: 1, Attempts: 3, TimeoutS: 5, Files: fs,
		Objects: []object{{URL: url, Name: "packs/p"}},
		Ranges:  []rng{{0, 0, len(raw), []chunk{c}}}}, fs
}

func TestRetriesWhatBotocoreRetries(t *testing.T) {
	raw := randBytes(3, 10000)
	srv, n := server(t, raw, func(i int64) int {
		if i <= 2 {
			return []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}[i-1]
		}
		return 0
	})
	p, fs := onePackPlan(t, srv.URL+"/pack", raw, true)
	j, err := run(t, p)
	if err != nil || j.retries.Load() != 2 || n.Load() != 3 {
		t.Fatalf("err %v, retries %d, requests %d", err, j.retries.Load(), n.Load())
	}
	if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, raw) {
		t.Fatal("content differs after retries")
	}
}

func TestClientErrorsAreNotRetriedAndNameTheObject(t *testing.T) {
	raw := randBytes(4, 1000)
	srv, n := server(t, raw, func(int64) int { return http.StatusForbidden })
	p, _ := onePackPlan(t, srv.URL+"/pack", raw, true)
	_, err := run(t, p)
	var fe *fetchError
	if !errors.As(err, &fe) || fe.Kind != "store" || fe.Object != "packs/p" || n.Load() != 1 ||
		!strings.Contains(fe.Detail, "HTTP 403 Code: Injected Message: test says no") {
		t.Fatalf("%#v after %d requests", err, n.Load())
	}
}

func TestGivesUpAfterAttempts(t *testing.T) {
	raw := randBytes(5, 1000)
	srv, n := server(t, raw, func(int64) int { return http.StatusInternalServerError })
	p, _ := onePackPlan(t, srv.URL+"/pack", raw, false)
	_, err := run(t, p)
	var fe *fetchError
	if !errors.As(err, &fe) || fe.Kind != "store" || n.Load() != 3 {
		t.Fatalf("%v after %d requests", err, n.Load())
	}
}

func TestAlteredBytesAreRefusedBeforeAnyWrite(t *testing.T) {
	for _, withCheck := range []bool{false, true} {
		raw := randBytes(6, 8192)
		altered := append([]byte{}, raw...)
		altered[4000] ^= 0x5a
		srv, _ := server(t, altered, nil)
		p, fs := onePackPlan(t, srv.URL+"/pack", raw, withCheck)
		_, err := run(t, p)
		var fe *fetchError
		algo := map[bool]string{false: "sha256", true: "blake3"}[withCheck]
		if !errors.As(err, &fe) || fe.Kind != "integrity" || !strings.Contains(fe.Detail, algo) ||
			!strings.Contains(fe.Detail, "altered") {
			t.Fatalf("check=%v: %v", withCheck, err)
		}
		if got, _ := os.ReadFile(fs[0]); !bytes.Equal(got, make([]byte, len(raw))) {
			t.Fatal("bytes of a bad chunk were written")
		}
	}
}

func TestShortObjectIsAStoreError(t *testing.T) {
	raw := randBytes(7, 5000)
	srv, _ := server(t, raw[:100], nil)
	p, _ := onePackPlan(t, srv.URL+"/pack", raw, true)
	_, err := run(t, p)
	var fe *fetchError
	if !errors.As(err, &fe) || fe.Kind != "store" || !strings.Contains(fe.Detail, "does not match its manifest") {
		t.Fatalf("%v", err)
	}
}

func TestPlanCheckRefusesWritesOutsideTheFiles(t *testing.T) {
	raw := randBytes(8, 100)
	p, _ := onePackPlan(t, "http://127.0.0.1:1/pack", raw, false)
	p.Ranges[0].chunks[0].places[0].off = 1
	if _, err := newJob(p); err == nil || !strings.Contains(err.Error(), "outside the files") {
		t.Fatalf("%v", err)
	}
	p.Ranges[0].chunks[0].places[0].off = 0
	p.Version = 1
	if _, err := newJob(p); err == nil || !strings.Contains(err.Error(), "plan version") {
		t.Fatalf("%v", err)
	}
}

// seal is the twin of control/images/keys.py seal_chunk (the nonce is any
// 12 bytes here: only opening has to agree).
func seal(t *testing.T, key []byte, sum [32]byte, codec string, payload []byte) []byte {
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, _ := cipher.NewGCM(block)
	nonce := randBytes(uint64(len(payload)), nonceBytes)
	return gcm.Seal(append([]byte{}, nonce...), nonce, payload, append(append([]byte{}, sum[:]...), codec...))
}

// addSealed appends raw (zlib-coded when compress), sealed under key, to the pack.
func (p *testPack) addSealed(t *testing.T, raw []byte, compress bool, key []byte, places ...place) chunk {
	payload, codec := raw, codecNone
	if compress {
		var b bytes.Buffer
		w := zlib.NewWriter(&b)
		w.Write(raw)
		w.Close()
		payload, codec = b.Bytes(), codecZlib
	}
	sum := sha256.Sum256(raw)
	stored := seal(t, key, sum, codec, payload)
	c := chunk{sum: sum, raw: len(raw), pos: len(p.body), stored: len(stored), codec: codec, places: places,
		key: key}
	p.body = append(p.body, stored...)
	p.chunks = append(p.chunks, c)
	return c
}

// A chunk sealed by Python's keys.seal_chunk opens here to the same bytes
// (the twin's format: nonce || ciphertext || tag, SHA-256 || codec as
// associated data).
func TestOpenChunkReadsPythonsSealedFormat(t *testing.T) {
	key, _ := hex.DecodeString("8b9ad72d0056d284fc5841856e7f00dcf98d8230b3771065b25eca5fddccecb6")
	sealed, _ := hex.DecodeString("0e1bcf2ea391b8c4f81dc3564138147de9d98c4965669c9964699f76afc9eecdfda7b1a1853bd3ac" +
		"5b8a9ce0391f6647213adbb6c3478cd1c0eb3a31a53de290b983584bf3d9e76f4cf7aeb6627213f247a36c148f2f8362b50dd61a" +
		"21c141dbd7b831c206965f5e289596e80b7b97039db08e0d6812")
	raw := bytes.Repeat([]byte("thaw sealed chunk twin vector\n"), 3)
	got, err := openChunk(key, sha256.Sum256(raw), codecNone, sealed, nil)
	if err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("open: %v %q", err, got)
	}
	if _, err := openChunk(key, sha256.Sum256(raw), codecZlib, sealed, nil); err == nil {
		t.Fatal("another codec in the associated data must not open")
	}
}

// Sealed chunks, uncompressed (placed twice, O_DIRECT from the opened
// buffer) and zlib-coded, land where they belong; a flipped byte or another
// key is an integrity error naming the chunk, never the key.
func TestSealedChunksFillAndRefuseTampering(t *testing.T) {
	key := randBytes(7, 32)
	for _, direct := range []bool{false, true} {
		var pk testPack
		a := randBytes(3, 3*align+100)
		z := bytes.Repeat([]byte("tenant "), 20000)
		fs := files(t, int64(len(a)+len(z)), int64(len(a)+11))
		ca := pk.addSealed(t, a, false, key, place{0, 0}, place{1, 11})
		cz := pk.addSealed(t, z, true, key, place{0, int64(len(a))})
		srv, _ := server(t, pk.body, nil)
		p := &plan{Version: PlanVersion, Workers: 2, Attempts: 1, TimeoutS: 5, DirectIO: direct, Files: fs,
			Objects: []object{{URL: srv.URL + "/pack", Name: "packs/x"}},
			Ranges: []rng{{obj: 0, start: 0, length: len(pk.body), chunks: []chunk{ca, cz}}}}
		if _, err := run(t, p); err != nil {
			t.Fatalf("direct=%v: %v", direct, err)
		}
		f0, _ := os.ReadFile(fs[0])
		f1, _ := os.ReadFile(fs[1])
		if !bytes.Equal(f0, append(append([]byte{}, a...), z...)) || !bytes.Equal(f1[11:], a) {
			t.Fatalf("direct=%v: files differ", direct)
		}
	}
	for _, tamper := range []string{"byte", "key"} {
		var pk testPack
		a := randBytes(4, 2*align)
		fs := files(t, int64(len(a)))
		ca := pk.addSealed(t, a, false, key, place{0, 0})
		if tamper == "byte" {
			pk.body[nonceBytes+10] ^= 1
		} else {
			ca.key = randBytes(8, 32)
		}
		srv, _ := server(t, pk.body, nil)
		p := &plan{Version: PlanVersion, Workers: 1, Attempts: 1, TimeoutS: 5, Files: fs,
			Objects: []object{{URL: srv.URL + "/pack", Name: "packs/x"}},
			Ranges: []rng{{obj: 0, start: 0, length: len(pk.body), chunks: []chunk{ca}}}}
		_, err := run(t, p)
		var fe *fetchError
		if !errors.As(err, &fe) || fe.Kind != "integrity" || !strings.Contains(fe.Detail, "do not open") ||
			strings.Contains(fe.Detail, hex.EncodeToString(ca.key)) {
			t.Fatalf("%s: want an integrity error without the key, got %v", tamper, err)
		}
	}
}

// A plan's chunk may carry an eighth element, its key; a malformed key is
// refused without echoing it.
func TestPlanChunkKeyIsParsedAndNeverEchoed(t *testing.T) {
	var r rng
	good := `[0, 0, 128, [["` + strings.Repeat("a", 64) + `", 100, 0, 128, "none", [[0, 0]], "", "` +
		strings.Repeat("0f", 32) + `"]]]`
	if err := json.Unmarshal([]byte(good), &r); err != nil || len(r.chunks[0].key) != 32 {
		t.Fatalf("%v %v", err, r.chunks)
	}
	bad := strings.Replace(good, strings.Repeat("0f", 32), "secret-"+strings.Repeat("z", 57), 1)
	err := json.Unmarshal([]byte(bad), &r)
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("want a refusal without the key, got %v", err)
	}
	p := &plan{Version: PlanVersion, Workers: 1, Attempts: 1, TimeoutS: 1,
		Objects: []object{{}}, Ranges: []rng{{obj: 0, start: 0, length: 128, chunks: []chunk{
			{raw: 100, stored: 100, codec: codecNone, places: []place{{0, 0}}, key: make([]byte, 32)}}}}}
	if err := p.check([]int64{1000}); err == nil {
		t.Fatal("a sealed uncompressed chunk must store raw + the sealing overhead")
	}
}
