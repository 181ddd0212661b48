"""Chunking: a runsc image directory -> content-defined chunks, each named by
its SHA-256 and checked by its BLAKE3, gathered into a manifest.

Chunking and hashing run in `thaw-chunk` (go/cmd/thaw-chunk): FastCDC with
normalized chunking over a memory map, SHA-256 and BLAKE3 on every core, in
the one pass that reads the image. Pure Python chunks at a few MB/s; the Go
command at ~1.7 GB/s here (docs/store.md). Nothing after it hashes the image
again on the way to the store: the upload trusts these names, and the
publisher checks with `file_state` that the files did not change meanwhile.
`reference_cuts` is a slow Python twin of the Go cut rule, used by the tests
to pin the boundary format. How chunks are stored (packs, the codec) is
control/images/pack.py's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from control.node.compat import CompatTuple
from control.errors import ImageError, PreconditionError, ThawError
from control.images.manifest import (_NAME, CHECK, MAX_FILES, Chunking, ChunkRef, FileEntry, Manifest,
                              validate_key)

# Twin: go/cmd/thaw-chunk/fastcdc.go Algorithm and gearSeed.
ALGORITHM = "fastcdc-gear-v1"
_GEAR_SEED = 0x7468617763646331

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


def file_state(paths: list[Path]) -> list[tuple]:
    """What changes when a file is written: inode, size, mtime and ctime (a
    write moves ctime, which no user can set back). Equal states before and
    after a step mean the step saw the bytes the chunk names were computed from."""
    out = []
    for p in paths:
        st = p.stat()
        out.append((p.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return out


def chunk_image(directory: Path, key: str, tup: CompatTuple, chunker: Path, avg: int) -> Manifest:
    """Chunk and hash an image directory into a manifest without locations (reads every byte once)."""
    validate_key(key)
    files = image_files(directory)
    before = file_state(files)
    chunking, entries = chunk_files(files, chunker, avg)
    if file_state(files) != before:
        raise ImageError(str(directory), "files changed while being chunked")
    creator = {"host": socket.gethostname(), "thaw": _thaw_version(), "pid": os.getpid(),
               "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "packed_at": round(time.time(), 3)}
    return Manifest(key=key, tuple=tup, chunking=chunking, files=tuple(entries), creator=creator)


def _thaw_version() -> str:
    from control.version import VERSION
    return VERSION


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
