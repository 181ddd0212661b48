package fetch

// Sealed chunks (crypt.go) through the engine: Python's format opens here,
// sealed chunks fill their places, tampering and another key are refused, a
// key is never echoed.

import (
	"bytes"
	"compress/zlib"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// seal is the twin of control/images/keys.py seal_chunk (the nonce is any
// 12 bytes here: only opening has to agree).
func seal(t *testing.T, key []byte, sum [32]byte, codec string, payload []byte) []byte {
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, _ := cipher.NewGCM(block)
	nonce := randBytes(uint64(len(payload)), NonceBytes)
	return gcm.Seal(append([]byte{}, nonce...), nonce, payload, append(append([]byte{}, sum[:]...), codec...))
}

// addSealed appends raw (zlib-coded when compress), sealed under key, to the pack.
func (p *testPack) addSealed(t *testing.T, raw []byte, compress bool, key []byte, places ...Place) RangeChunk {
	payload, codec := raw, CodecNone
	if compress {
		var b bytes.Buffer
		w := zlib.NewWriter(&b)
		w.Write(raw)
		w.Close()
		payload, codec = b.Bytes(), CodecZlib
	}
	sum := sha256.Sum256(raw)
	stored := seal(t, key, sum, codec, payload)
	c := RangeChunk{Chunk: Chunk{Sum: sum, Raw: len(raw), Stored: len(stored), Codec: codec, Key: key},
		Pos: len(p.body), Places: places}
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
	got, err := OpenSealed(key, sha256.Sum256(raw), CodecNone, sealed, nil)
	if err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("open: %v %q", err, got)
	}
	if _, err := OpenSealed(key, sha256.Sum256(raw), CodecZlib, sealed, nil); err == nil {
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
		a := randBytes(3, 3*Align+100)
		z := bytes.Repeat([]byte("tenant "), 20000)
		fs := files(t, int64(len(a)+len(z)), int64(len(a)+11))
		ca := pk.addSealed(t, a, false, key, Place{0, 0}, Place{1, 11})
		cz := pk.addSealed(t, z, true, key, Place{0, int64(len(a))})
		srv, _ := server(t, pk.body, nil)
		p := &FillPlan{Version: FillPlanVersion, Workers: 2, Retry: noRetry, TimeoutS: 5, DirectIO: direct, Files: fs,
			Objects: []Object{{URL: srv.URL + "/pack", Name: "packs/x"}},
			Ranges:  []Range{{Object: 0, Start: 0, Length: len(pk.body), Chunks: []RangeChunk{ca, cz}}}}
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
		a := randBytes(4, 2*Align)
		fs := files(t, int64(len(a)))
		ca := pk.addSealed(t, a, false, key, Place{0, 0})
		if tamper == "byte" {
			pk.body[NonceBytes+10] ^= 1
		} else {
			ca.Key = randBytes(8, 32)
		}
		srv, _ := server(t, pk.body, nil)
		p := &FillPlan{Version: FillPlanVersion, Workers: 1, Retry: noRetry, TimeoutS: 5, Files: fs,
			Objects: []Object{{URL: srv.URL + "/pack", Name: "packs/x"}},
			Ranges:  []Range{{Object: 0, Start: 0, Length: len(pk.body), Chunks: []RangeChunk{ca}}}}
		_, err := run(t, p)
		var fe *Error
		if !errors.As(err, &fe) || fe.Kind != "integrity" || !strings.Contains(fe.Detail, "do not open") ||
			strings.Contains(fe.Detail, hex.EncodeToString(ca.Key)) {
			t.Fatalf("%s: want an integrity error without the key, got %v", tamper, err)
		}
	}
}

// A plan's chunk may carry an eighth element, its key; a malformed key is
// refused without echoing it.
func TestPlanChunkKeyIsParsedAndNeverEchoed(t *testing.T) {
	var r Range
	good := `[0, 0, 128, [["` + strings.Repeat("a", 64) + `", 100, 0, 128, "none", [[0, 0]], "", "` +
		strings.Repeat("0f", 32) + `"]]]`
	if err := json.Unmarshal([]byte(good), &r); err != nil || len(r.Chunks[0].Key) != 32 {
		t.Fatalf("%v %v", err, r.Chunks)
	}
	bad := strings.Replace(good, strings.Repeat("0f", 32), "secret-"+strings.Repeat("z", 57), 1)
	err := json.Unmarshal([]byte(bad), &r)
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("want a refusal without the key, got %v", err)
	}
	p := &FillPlan{Version: FillPlanVersion, Workers: 1, Retry: noRetry, TimeoutS: 1,
		Objects: []Object{{}}, Ranges: []Range{{Object: 0, Start: 0, Length: 128, Chunks: []RangeChunk{
			{Chunk: Chunk{Raw: 100, Stored: 100, Codec: CodecNone, Key: make([]byte, 32)}, Places: []Place{{0, 0}}}}}}}
	if err := p.check([]int64{1000}); err == nil {
		t.Fatal("a sealed uncompressed chunk must store raw + the sealing overhead")
	}
}
