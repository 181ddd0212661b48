package fetch

// What each way of checking a fetched chunk costs on one core, on 256 KiB
// chunks (the average chunk, pack.avg_chunk_bytes): SHA-256 alone (the name
// the node trusts later), BLAKE3 alone (what thaw-fetch checked before issue
// 14 item 6), both. `go test -run - -bench Check ./internal/fetch`; the
// figures behind verify()'s choice are in docs/store.md, "Integrity".

import (
	"crypto/sha256"
	"testing"

	"github.com/zeebo/blake3"
)

func benchCheck(b *testing.B, f func([]byte)) {
	chunk := randBytes(9, 256<<10)
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		f(chunk)
	}
}

func BenchmarkCheckSHA256(b *testing.B) {
	benchCheck(b, func(c []byte) { sha256.Sum256(c) })
}

func BenchmarkCheckBLAKE3(b *testing.B) {
	benchCheck(b, func(c []byte) { blake3.Sum256(c) })
}

func BenchmarkCheckBoth(b *testing.B) {
	benchCheck(b, func(c []byte) { sha256.Sum256(c); blake3.Sum256(c) })
}
