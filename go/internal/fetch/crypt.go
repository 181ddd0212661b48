package fetch

import (
	"crypto/aes"
	"crypto/cipher"
	"fmt"
)

// Sealed chunks (issue 13): a tenant that encrypts stores each chunk as
// nonce || AES-256-GCM(payload) || tag, with the chunk's SHA-256 and codec
// as associated data. A plan carries each chunk's own key (derived in Python
// from the tenant's key: control/images/keys.py chunk_key), never the
// tenant's; neither thaw-gofer nor thaw-fetch logs or prints it.
// Twins: control/images/keys.py NONCE_BYTES, SEALED_OVERHEAD, seal_chunk.
// thaw-fetch (a pull) and thaw-gofer (a stream) both open chunks here.
const (
	NonceBytes     = 12
	SealedOverhead = NonceBytes + 16
	KeyBytes       = 32
)

// OpenSealed authenticates and decrypts a sealed chunk into dst (which must
// not overlap sealed) and returns the payload.
func OpenSealed(key []byte, sum [32]byte, codec string, sealed, dst []byte) ([]byte, error) {
	if len(sealed) < SealedOverhead {
		return nil, fmt.Errorf("%d bytes is shorter than a sealed chunk", len(sealed))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	aad := make([]byte, 0, len(sum)+len(codec))
	aad = append(append(aad, sum[:]...), codec...)
	out, err := gcm.Open(dst, sealed[:NonceBytes], sealed[NonceBytes:], aad)
	if err != nil {
		return nil, fmt.Errorf("AES-GCM tag does not verify (altered, or sealed with another tenant's key)")
	}
	return out, nil
}
