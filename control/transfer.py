"""Moving chunks: upload an image's chunks to the store, and fill an entry
directory from local copies and the store.

Both run `workers` threads; each holds at most one chunk (raw and encoded) in
memory, so a transfer uses about workers x 2 x max chunk size (8 x 2 x 4 MiB
at the defaults) however large the image. hashlib, zlib, socket reads and
pread/pwrite release the GIL, so the threads overlap on every core.

Filling writes each chunk straight to its offsets in files created at full
size: an all-zero chunk is left as a hole (the file is sparse, reads give
zeros, its hash is known), a chunk already on this node (another entry, or
the directory being pushed) is copied after its hash is checked, and only the
rest is fetched. Every byte written has been hashed against the manifest.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from control import pack
from control.errors import IntegrityError, StoreError
from control.manifest import Manifest
from control.store import Store

Progress = Callable[[int], None]   # called with raw bytes done, from worker threads


@dataclass(frozen=True)
class LocalCopy:
    """A place on this node that may hold a chunk's bytes (checked before use)."""
    path: Path
    offset: int
    owner: str           # a cache entry id, or "source" for a directory being pushed


Sources = Callable[[str], list[LocalCopy]]


@dataclass
class FillStats:
    chunks: int = 0              # distinct chunks in the image
    fetched_chunks: int = 0
    fetched_bytes: int = 0       # bytes received from the store (encoded)
    fetched_raw_bytes: int = 0   # their raw size
    local_chunks: int = 0
    local_bytes: int = 0
    zero_chunks: int = 0
    zero_bytes: int = 0
    written_bytes: int = 0       # bytes written to disk (duplicates counted per place)
    bad_sources: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class UploadStats:
    chunks: int = 0
    present_chunks: int = 0       # already in the store: skipped
    uploaded_chunks: int = 0
    uploaded_bytes: int = 0       # encoded bytes sent
    uploaded_raw_bytes: int = 0
    compressed_chunks: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _run_pool(workers: int, items: list, fn: Callable) -> None:
    """fn(item) for every item on `workers` threads. The first exception stops
    items not yet started and is raised once the running ones have returned."""
    stop = threading.Event()

    def guarded(item) -> None:
        if stop.is_set():
            return
        try:
            fn(item)
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="thaw-transfer") as pool:
        futures = [pool.submit(guarded, item) for item in items]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        stop.set()
        for f in futures:
            if f.done() and f.exception() is not None:
                raise f.exception()


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def read_local(copy: LocalCopy, length: int) -> bytes | None:
    """The bytes at a local copy, or None if it is gone or short."""
    try:
        fd = os.open(copy.path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = _pread_exact(fd, length, copy.offset)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == length else None


def fill(manifest: Manifest, dest: Path, store: Store | None, sources: Sources, *,
         workers: int, progress: Progress | None = None,
         on_bad_source: Callable[[str], None] | None = None) -> FillStats:
    """Write every file of `manifest` into directory `dest` (which must exist), verified.

    Raises IntegrityError when the store serves a chunk that does not hash to
    its name, StoreError when the store fails; `dest` is then incomplete and
    the caller removes it.
    """
    t0 = time.monotonic()
    stats = FillStats()
    lock = threading.Lock()
    places: dict[str, list[tuple[int, int]]] = {}   # hash -> [(fd, offset)]
    lengths: dict[str, int] = {}
    fds: list[int] = []
    try:
        for f in manifest.files:
            fd = os.open(dest / f.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            fds.append(fd)
            os.ftruncate(fd, f.size)
            for off, c in f.placed():
                places.setdefault(c.hash, []).append((fd, off))
                lengths[c.hash] = c.length
        stats.chunks = len(places)

        def done(h: str, raw_len: int) -> None:
            if progress:
                progress(raw_len * len(places[h]))

        def one(h: str) -> None:
            length = lengths[h]
            if h == pack.zero_hash(length):
                with lock:
                    stats.zero_chunks += 1
                    stats.zero_bytes += length
                done(h, length)
                return
            data = None
            for copy in sources(h):
                cand = read_local(copy, length)
                if cand is not None and pack.sha256(cand) == h:
                    data = cand
                    with lock:
                        stats.local_chunks += 1
                        stats.local_bytes += length
                    break
                with lock:
                    stats.bad_sources.append(copy.owner)
                if on_bad_source:
                    on_bad_source(copy.owner)
            if data is None:
                if store is None:
                    raise StoreError("get", h, "chunk is on no local copy and no store is configured")
                obj = store.get_chunk(h)
                try:
                    data = pack.decode(obj.codec, obj.payload, length)
                except ValueError as e:
                    raise IntegrityError("store", h, f"cannot decode {store.chunk_name(h)}: {e}") from None
                got = pack.sha256(data)
                if got != h:
                    raise IntegrityError("store", h, f"{store.chunk_name(h)} hashes to {got}: "
                                                     "the stored chunk was altered or damaged")
                with lock:
                    stats.fetched_chunks += 1
                    stats.fetched_bytes += len(obj.payload)
                    stats.fetched_raw_bytes += length
            for fd, off in places[h]:
                _pwrite_all(fd, data, off)
            with lock:
                stats.written_bytes += length * len(places[h])
            done(h, length)

        _run_pool(workers, list(places), one)
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)
    stats.seconds = time.monotonic() - t0
    return stats


def upload(manifest: Manifest, src: Path, store: Store, *, workers: int,
           progress: Progress | None = None) -> UploadStats:
    """Send every chunk of `manifest` (read from directory `src`) that the store lacks.

    Chunks are re-hashed as they are read, so a file changed after packing is
    refused rather than published under a wrong name.
    """
    t0 = time.monotonic()
    stats = UploadStats()
    lock = threading.Lock()
    first: dict[str, tuple[str, int, int]] = {}
    for f in manifest.files:
        for off, c in f.placed():
            first.setdefault(c.hash, (f.name, off, c.length))
    stats.chunks = len(first)

    def one(h: str) -> None:
        name, off, length = first[h]
        if store.has_chunk(h):
            with lock:
                stats.present_chunks += 1
            if progress:
                progress(length)
            return
        data = read_local(LocalCopy(src / name, off, "source"), length)
        if data is None or pack.sha256(data) != h:
            raise IntegrityError("source", h, f"{src / name} at offset {off} no longer holds this chunk "
                                              "(the image changed after it was packed)")
        codec, payload = pack.encode(data)
        store.put_chunk(h, codec, payload, length)
        with lock:
            stats.uploaded_chunks += 1
            stats.uploaded_bytes += len(payload)
            stats.uploaded_raw_bytes += length
            stats.compressed_chunks += codec != pack.CODEC_NONE
        if progress:
            progress(length)

    _run_pool(workers, list(first), one)
    stats.seconds = time.monotonic() - t0
    return stats


def dir_sources(manifest: Manifest, src: Path) -> Sources:
    """Local copies of every chunk of `manifest` inside directory `src` (a push)."""
    at: dict[str, LocalCopy] = {}
    for f in manifest.files:
        for off, c in f.placed():
            at.setdefault(c.hash, LocalCopy(src / f.name, off, "source"))
    return lambda h: [at[h]] if h in at else []


def chain(*fns: Sources) -> Sources:
    def look(h: str) -> list[LocalCopy]:
        out: list[LocalCopy] = []
        for fn in fns:
            out.extend(fn(h))
        return out
    return look
