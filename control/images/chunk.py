"""Packing: a runsc image directory -> content-defined chunks and a manifest;
and the per-chunk codec (compress only where it pays).

Chunking and hashing run in `thaw-chunk` (go/cmd/thaw-chunk): FastCDC with
normalized chunking over a memory map, SHA-256 on every core. Pure Python
chunks at a few MB/s; the Go command at ~1.7 GB/s here (docs/store.md).
`reference_cuts` is a slow Python twin of the Go cut rule, used by the tests
to pin the boundary format.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import subprocess
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path

from control.node.compat import CompatTuple
from control.errors import ImageError, PreconditionError, ThawError
from control.images import keys as keysmod
from control.images.manifest import (_NAME, CHECK, MAX_FILES, Chunking, ChunkRef, FileEntry, Manifest,
                              validate_key)

# Twin: go/cmd/thaw-chunk/fastcdc.go Algorithm and gearSeed.
ALGORITHM = "fastcdc-gear-v1"
_GEAR_SEED = 0x7468617763646331

# Codec names stored in each chunk object's metadata (control/store.py).
CODEC_NONE = "none"
CODEC_ZLIB = "zlib"
# A chunk is stored compressed only if zlib (level 1) saves at least this
# fraction; a 16 KiB sample (two 8 KiB pieces) is tried first so incompressible chunks (model
# weights, random data: zlib runs at ~45 MB/s on those here) cost ~0.35 ms each.
COMPRESS_MIN_SAVING = 0.10
_SAMPLE = 16 << 10
ZLIB_LEVEL = 1


def chunk_params(avg: int) -> tuple[int, int, int]:
    """(min, avg, max): min = avg/4, max = 4*avg (FastCDC's usual spread)."""
    return avg // 4, avg, avg * 4


def image_files(directory: Path) -> list[Path]:
    """The files of a runsc image directory, sorted; checkpoint.img must be there."""
    if not directory.is_dir():
        raise ImageError(str(directory), "not a directory")
    files = []
    for p in sorted(directory.iterdir()):
        if p.is_symlink() or not p.is_file():
            raise ImageError(str(p), "image directories hold regular files only")
        if not _NAME.match(p.name):
            raise ImageError(str(p), "file name is not a plain name of A-Z a-z 0-9 . _ -")
        files.append(p)
    if not any(p.name == "checkpoint.img" for p in files):
        raise ImageError(str(directory), "no checkpoint.img (not a runsc checkpoint image directory)")
    if len(files) > MAX_FILES:
        raise ImageError(str(directory), f"{len(files)} files; at most {MAX_FILES}")
    return files


def chunk_files(paths: list[Path], chunker: Path, avg: int) -> tuple[Chunking, list[FileEntry]]:
    """Run thaw-chunk over `paths`; the chunk list of each file."""
    if not chunker.is_file():
        raise PreconditionError(f"thaw-chunk not found at {chunker}: run `make build` "
                                "or set THAW_PACK_CHUNKER", path=str(chunker))
    mn, av, mx = chunk_params(avg)
    argv = [str(chunker), f"-min={mn}", f"-avg={av}", f"-max={mx}", *map(str, paths)]
    proc = subprocess.run(argv, capture_output=True, timeout=3600)
    if proc.returncode != 0:
        raise ThawError(f"thaw-chunk failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace').strip()}",
                        argv=argv)
    lines = proc.stdout.decode().splitlines()
    head = json.loads(lines[0])
    if head.get("algorithm") != ALGORITHM or head.get("hash") != "sha256" or head.get("check") != CHECK:
        raise ThawError(f"thaw-chunk speaks {head}, thaw expects {ALGORITHM}/sha256/{CHECK}: "
                        "rebuild with `make build`")
    chunks: list[list[ChunkRef]] = [[] for _ in paths]
    sizes: dict[int, int] = {}
    for line in lines[1:]:
        rec = json.loads(line)
        if "size" in rec:
            sizes[rec["f"]] = rec["size"]
        else:
            chunks[rec["f"]].append(ChunkRef(rec["h"], rec["n"], rec["b"]))
    entries = []
    for i, p in enumerate(paths):
        if i not in sizes or sum(c.length for c in chunks[i]) != sizes[i]:
            raise ThawError(f"thaw-chunk output for {p} is incomplete")
        entries.append(FileEntry(p.name, sizes[i], tuple(chunks[i])))
    return Chunking(ALGORITHM, mn, av, mx, check=CHECK), entries


def pack(directory: Path, key: str, tup: CompatTuple, chunker: Path, avg: int) -> Manifest:
    """Chunk and hash an image directory into a manifest (reads every byte once)."""
    validate_key(key)
    files = image_files(directory)
    before = [(p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    chunking, entries = chunk_files(files, chunker, avg)
    after = [(p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    if before != after:
        raise ImageError(str(directory), "files changed while being packed")
    creator = {"host": socket.gethostname(), "thaw": _thaw_version(), "pid": os.getpid(),
               "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "packed_at": round(time.time(), 3)}
    return Manifest(key=key, tuple=tup, chunking=chunking, files=tuple(entries), creator=creator)


def _thaw_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("thaw")
    except PackageNotFoundError:
        return "unknown"


# -- the chunk codec -----------------------------------------------------------

def encode(raw: bytes, key: bytes | None = None, h: str = "") -> tuple[str, bytes]:
    """(codec, stored bytes): zlib where it saves >= COMPRESS_MIN_SAVING, else raw;
    then, with a chunk key (keys.chunk_key of the tenant's key and the chunk's
    SHA-256 `h`), sealed with AES-256-GCM (keys.seal_chunk). Compression comes
    first: ciphertext does not compress."""
    codec, payload = _compress(raw)
    if key is not None:
        payload = keysmod.seal_chunk(key, h, codec, payload)
    return codec, payload


def _compress(raw: bytes) -> tuple[str, bytes]:
    if len(raw) > 2 * _SAMPLE:
        sample = raw[:_SAMPLE // 2] + raw[len(raw) // 2:len(raw) // 2 + _SAMPLE // 2]
        if len(zlib.compress(sample, ZLIB_LEVEL)) > len(sample) * (1 - COMPRESS_MIN_SAVING):
            return CODEC_NONE, raw
    z = zlib.compress(raw, ZLIB_LEVEL)
    if len(z) <= len(raw) * (1 - COMPRESS_MIN_SAVING):
        return CODEC_ZLIB, z
    return CODEC_NONE, raw


def decode(codec: str, payload: bytes | memoryview, length: int, key: bytes | None = None, h: str = "") -> bytes:
    """The raw bytes of a stored chunk (opened first with its chunk key when it
    is sealed); ValueError if it cannot be decoded to `length` bytes."""
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


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=64)
def zero_hash(length: int) -> str:
    """SHA-256 of `length` zero bytes: such a chunk is a hole in a sparse file."""
    return hashlib.sha256(bytes(length)).hexdigest()


# -- the reference cut rule (tests) ----------------------------------------------

def _gear() -> list[int]:
    m = (1 << 64) - 1
    s, out = _GEAR_SEED, []
    for _ in range(256):
        s = (s + 0x9E3779B97F4A7C15) & m
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        out.append(z ^ (z >> 31))
    return out


def reference_cuts(data: bytes, mn: int, avg: int, mx: int) -> list[int]:
    """Chunk lengths by the same rule as thaw-chunk (slow: tests only)."""
    gear, m = _gear(), (1 << 64) - 1
    b = avg.bit_length() - 1
    mask_s = (m << (64 - (b + 2))) & m
    mask_l = (m << (64 - (b - 2))) & m
    out, off = [], 0
    while off < len(data):
        n = len(data) - off
        if n <= mn:
            out.append(n)
            break
        n = min(n, mx)
        normal = min(avg, n)
        h, i, cut = 0, mn, n
        while i < n:
            h = ((h << 1) + gear[data[off + i]]) & m
            if h & (mask_s if i < normal else mask_l) == 0:
                cut = i + 1
                break
            i += 1
        out.append(cut)
        off += cut
    return out
