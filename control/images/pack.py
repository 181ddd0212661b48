"""Packs: how chunks lie in the object store.

A pack is one object of about PACK_BYTES holding encoded chunks back to back
(`packs/<name>`, docs/store.md "Store layout"): a fetch reads long ranges of
a few objects instead of one object per chunk. This module owns the pack and
the per-chunk codec: which chunks travel together (`groups`: file order, so
neighbours are fetched together), how each is encoded (zlib only where it
pays), and what a pack is called. Moving packs to and from the store is
control/images/transfer.py's; cutting and hashing chunks is
control/images/chunk.py's.

A pack's name is the SHA-256 of its table of contents (each chunk's SHA-256,
codec and stored length, in order), not of its body: the chunk names already
come from thaw-chunk's pass over the image, so the body is not hashed again.
Two writers that build the same table write bodies in which every chunk sits
at the same offset and length and decodes to the same bytes (checked on every
fetch), so either body serves every manifest that names the pack, even where
two zlib builds encode a chunk differently.

Every pack a publish builds also takes 16 random bytes into its name (`salt`,
issue 33): a pack name is then never written twice, so the store GC
(control/images/gc.py) can delete an old unreferenced pack knowing that no
publish in flight is re-uploading an object of that very name (a re-put landing
between the GC's last look and its delete would otherwise be lost under a
manifest that names it). What dedup loses is nothing it had: two writers of the
same table used to write one object, now two, of which the store keeps the one a
manifest names and the GC removes the other.

A tenant that encrypts (issue 13, control/images/keys.py) seals each encoded
chunk with its own key (`chunk_key(h)`), and its packs are named by an HMAC of
the table under the tenant's key (`name_key`): a pack name computed from chunk
hashes alone would let a reader of the bucket confirm a guess of a pack's
chunks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

from control.images import keys as keysmod
from control.images.manifest import Location

# Pack size, chosen by measurement on SeaweedFS (docs/store.md): ranged GETs of
# 32 MiB objects read fastest, and the object count stays low.
PACK_BYTES = 32 << 20
PACK_WORKERS = 4           # packs built and sent at once (each holds one PACK_BYTES body)

# Codec names stored in each chunk's location (manifest, chunk pointers).
# Twin: control/images/manifest.py CODECS, go/internal/fetch/fetch.go CodecNone, CodecZlib (decoding).
CODEC_NONE = "none"
CODEC_ZLIB = "zlib"
# A chunk is stored compressed only if zlib (level 1) saves at least this
# fraction; a 16 KiB sample (two 8 KiB pieces) is tried first so incompressible chunks (model
# weights, random data: zlib runs at ~45 MB/s on those here) cost ~0.35 ms each.
COMPRESS_MIN_SAVING = 0.10
_SAMPLE = 16 << 10
ZLIB_LEVEL = 1
_NAME_DOMAIN = b"thaw-pack-v1\n"
_SEALED_NAME_DOMAIN = b"thaw/pack-name/v1\0"
SALT_BYTES = 16


def encode(raw: bytes | memoryview, key: bytes | None = None, h: str = "") -> tuple[str, bytes | memoryview]:
    """(codec, stored bytes): zlib where it saves >= COMPRESS_MIN_SAVING, else `raw`
    itself; then, with a chunk key (keys.chunk_key of the tenant's key and the
    chunk's SHA-256 `h`), sealed with AES-256-GCM (keys.seal_chunk). Compression
    comes first: ciphertext does not compress."""
    codec, payload = _compress(raw)
    if key is not None:
        payload = keysmod.seal_chunk(key, h, codec, payload)
    return codec, payload


def _compress(raw: bytes | memoryview) -> tuple[str, bytes | memoryview]:
    n = len(raw)
    if n > 2 * _SAMPLE:
        sample = bytes(raw[:_SAMPLE // 2]) + bytes(raw[n // 2:n // 2 + _SAMPLE // 2])
        if len(zlib.compress(sample, ZLIB_LEVEL)) > len(sample) * (1 - COMPRESS_MIN_SAVING):
            return CODEC_NONE, raw
    z = zlib.compress(raw, ZLIB_LEVEL)
    if len(z) <= n * (1 - COMPRESS_MIN_SAVING):
        return CODEC_ZLIB, z
    return CODEC_NONE, raw


def decode(codec: str, payload: bytes | memoryview, length: int, key: bytes | None = None,
           h: str = "") -> bytes | memoryview:
    """The raw bytes of a stored chunk (opened first with its chunk key when it is
    sealed); ValueError if it cannot be decoded to `length` bytes. The inverse
    of `encode` and build's sealing, in Python: what the tests hold the writer
    to. A pull or a stream reads chunks in Go (go/internal/fetch/verify.go)."""
    if key is not None:
        payload = keysmod.open_chunk(key, h, codec, payload)
    if codec == CODEC_NONE:
        raw = payload
    elif codec == CODEC_ZLIB:
        d = zlib.decompressobj()
        try:
            raw = d.decompress(payload, length + 1)
        except zlib.error as e:
            raise ValueError(f"zlib: {e}") from None
    else:
        raise ValueError(f"unknown codec {codec!r}")
    if len(raw) != length:
        raise ValueError(f"decodes to {len(raw)} bytes, expected {length}")
    return raw


def groups(chunks: Sequence[tuple[str, int]], limit: int = PACK_BYTES) -> list[list[str]]:
    """Split (hash, raw length) pairs, in the order given (file order), into packs
    of at least `limit` raw bytes each (the last one smaller)."""
    out: list[list[str]] = []
    size = 0
    for h, n in chunks:
        if not out or size >= limit:
            out.append([])
            size = 0
        out[-1].append(h)
        size += n
    return out


@dataclass(frozen=True)
class Pack:
    name: str
    body: bytes
    chunks: tuple[tuple[str, Location, int], ...]   # (hash, where in this pack, raw length)

    @property
    def raw_bytes(self) -> int:
        return sum(n for _, _, n in self.chunks)


def name(table: Sequence[tuple[str, str, int]], key: bytes | None = None, salt: bytes = b"") -> str:
    """A pack's name from its table of contents: (chunk SHA-256, codec, stored length) in order,
    after `salt`; with an encrypting tenant's key, an HMAC of it under that key."""
    h = hmac.new(key, _SEALED_NAME_DOMAIN, hashlib.sha256) if key is not None else hashlib.sha256(_NAME_DOMAIN)
    if salt:
        h.update(b"salt " + salt.hex().encode() + b"\n")
    for c, codec, stored in table:
        h.update(f"{c} {codec} {stored}\n".encode())
    return h.hexdigest()


def build(chunks: Sequence[tuple[str, bytes | memoryview]],
          chunk_key: Callable[[str], bytes | None] = lambda h: None, name_key: bytes | None = None,
          salt: bytes | None = None) -> Pack:
    """A pack of (hash, raw bytes) chunks, each encoded (and sealed with `chunk_key(hash)`
    where that is not None). The hashes are trusted: the caller got them from
    thaw-chunk's pass over the same bytes. `salt` (default: SALT_BYTES random
    bytes) goes into the name, so no two builds share one."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    parts: list[bytes | memoryview] = []
    table: list[tuple[str, str, int]] = []
    raw_len: list[int] = []
    for h, raw in chunks:
        codec, payload = encode(raw, chunk_key(h), h)
        parts.append(payload)
        table.append((h, codec, len(payload)))
        raw_len.append(len(raw))
    body = b"".join(parts)
    pname = name(table, name_key, salt)
    placed, off = [], 0
    for (h, codec, stored), n in zip(table, raw_len):
        placed.append((h, Location(pname, off, stored, codec), n))
        off += stored
    return Pack(pname, body, tuple(placed))
