"""Moving chunks: upload an image's new chunks to the store in packs, and fill
an entry directory from local copies and ranged reads of the store's packs.

An upload runs `workers` threads: it reads each pack's chunks
(control/images/pack.py: PACK_BYTES, file order) in long preads and sends one
pack per thread on at most PACK_WORKERS threads; it does not hash them again
(their names come from thaw-chunk). hashlib, zlib, socket reads and
pread/pwrite release the GIL, so threads overlap on every core.

Filling writes each chunk straight to its offsets in files created at full
size, with the extents it will write allocated up front (see _preallocate): an
all-zero chunk is left as a hole (the file is sparse, reads give
zeros, its hash is known), a chunk already on this node (another cache
entry) is copied after its hash is checked, and only the rest is fetched.
Every byte written has been checked against the manifest.

The fetched rest goes to thaw-fetch (go/cmd/thaw-fetch over go/internal/fetch,
the one fetch engine; `store.fetcher`): this module plans the ranges (of at
most RANGE_BYTES, neighbouring chunks of one pack coalesced across gaps up to
GAP_BYTES), presigns one URL per pack and hands both over (fetch_plan,
control/images/fetcher.py); the Go side GETs on `workers` connections, each
holding one range in memory, checks each chunk against its SHA-256 name and
writes it, whole pages with O_DIRECT where `direct_io` (cache.direct_io, on by
default) and the file system allow. docs/store.md, "Why the fetch is in Go".
(An in-process engine of the same plan, boto3 in threads, was removed once
every door used thaw-fetch: issue 27 item 5.)
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from control import metrics
from control.images import chunk
from control.images import fetcher
from control.images import pack
from control.errors import ImageError, StoreError
from control.images.manifest import Location, Manifest
from control.images.store import Store

Progress = Callable[[int], None]   # called with raw bytes done, from worker threads


@dataclass(frozen=True)
class LocalCopy:
    """A place on this node that may hold a chunk's bytes (checked before use)."""
    path: Path
    offset: int
    owner: str           # the cache entry id


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
    engine: str = ""             # who fetched: "thaw-fetch" (store.fetcher); "" when nothing was fetched
    direct_bytes: int = 0        # of written_bytes, written with O_DIRECT
    retries: int = 0             # GETs retried under the store's retry policy
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
    packs: int = 0
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


_libc = None


def _fallocate(fd: int, offset: int, length: int) -> bool:
    """fallocate(2) mode 0; False where the filesystem cannot (no emulation:
    glibc's posix_fallocate fallback would write every block once more)."""
    global _libc
    if _libc is None:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return _libc.fallocate(fd, 0, offset, length) == 0


def _preallocate(fd: int, extents: list[tuple[int, int]]) -> None:
    """Allocate the (offset, length) extents a fill is about to write.

    Measured here (ext4, 2 GiB by 8 threads in 16 MiB pwrites into a sparse
    file): the writes spent 15-31 s summed inside pwrite, 2.9-4.8 CPU-s, as
    every writer allocated blocks under the inode lock; with the extents
    allocated first, 0.7 s and 1.1 CPU-s (docs/store.md, "Writing a fill").
    Zero chunks stay holes; failure only costs that speed, so it is ignored.
    """
    extents.sort()
    merged: list[list[int]] = []
    for off, n in extents:
        if merged and off <= merged[-1][0] + merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], off + n - merged[-1][0])
        else:
            merged.append([off, n])
    for off, n in merged:
        if not _fallocate(fd, off, n):
            return


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


# Fetch sizes, chosen by measurement on SeaweedFS (docs/store.md): 8-16 MiB
# ranges read fastest. Pack sizes: control/images/pack.py.
RANGE_BYTES = 16 << 20
GAP_BYTES = 1 << 20        # read through a gap this small rather than issue another GET


@dataclass(frozen=True)
class _Range:
    pack: str
    start: int
    length: int
    chunks: tuple[tuple[str, Location], ...]


def plan_ranges(manifest: Manifest, hashes: list[str], range_bytes: int = RANGE_BYTES,
                gap_bytes: int = GAP_BYTES) -> list[_Range]:
    """Ranged GETs that cover `hashes`: per pack, by offset, neighbours merged
    while the range stays within range_bytes and gaps within gap_bytes."""
    by_pack: dict[str, list[tuple[str, Location]]] = {}
    for h in hashes:
        loc = manifest.locations[h]
        by_pack.setdefault(loc.pack, []).append((h, loc))
    out: list[_Range] = []
    for pack_name, items in by_pack.items():
        items.sort(key=lambda x: x[1].offset)
        cur: list[tuple[str, Location]] = []
        start = end = 0
        for h, loc in items:
            if cur and (loc.offset - end > gap_bytes or loc.offset + loc.stored - start > range_bytes
                        or loc.offset < end):
                out.append(_Range(pack_name, start, end - start, tuple(cur)))
                cur = []
            if not cur:
                start = loc.offset
            cur.append((h, loc))
            end = max(end, loc.offset + loc.stored)
        if cur:
            out.append(_Range(pack_name, start, end - start, tuple(cur)))
    return out


def fill(manifest: Manifest, dest: Path, store: Store | None, sources: Sources, *,
         workers: int, progress: Progress | None = None,
         on_bad_source: Callable[[str], None] | None = None, direct_io: bool = False) -> FillStats:
    """Write every file of `manifest` into directory `dest` (which must exist), verified.

    direct_io: write fetched pages with O_DIRECT where the file system allows
    (they then do not stay in the page cache).

    Raises PreconditionError when `store`'s fetcher (thaw-fetch, store.fetcher)
    is missing, before a file is made; IntegrityError when the store serves a
    chunk that does not hash to its name, StoreError when the store fails;
    `dest` is then incomplete and the caller removes it. A manifest whose
    chunks are sealed (its "encryption") is opened with `store`'s tenant key:
    the caller checked that they agree (image.pull).
    """
    t0 = time.monotonic()
    stats = FillStats()
    if store is not None:
        fetcher.require(store.fetcher, "thaw-fetch", "store.fetcher", "THAW_STORE_FETCHER")
        stats.engine = "thaw-fetch"
    lock = threading.Lock()
    places: dict[str, list[tuple[int, int]]] = {}   # hash -> [(fd, offset)]
    lengths: dict[str, int] = {}
    checks: dict[str, str] = {}                     # hash -> BLAKE3 (schema 2), for thaw-fetch
    fds: list[int] = []
    file_index: dict[int, int] = {}      # fd -> index in manifest.files
    try:
        for i, f in enumerate(manifest.files):
            fd = os.open(dest / f.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)   # memory: owner-only
            fds.append(fd)
            file_index[fd] = i
            os.ftruncate(fd, f.size)
            for off, c in f.placed():
                places.setdefault(c.hash, []).append((fd, off))
                lengths[c.hash] = c.length
                if c.check:
                    checks[c.hash] = c.check
        stats.chunks = len(places)
        # An all-zero run is cut into max-size chunks (the gear hash of zeros
        # never meets the mask), except where a file ends; only those lengths
        # are worth comparing with the hash of zeros.
        zero_lengths = {manifest.chunking.max} | {f.chunks[-1].length for f in manifest.files if f.chunks}
        zeros = {chunk.zero_hash(n): n for n in zero_lengths}

        def put(h: str, data: bytes | memoryview) -> None:
            for fd, off in places[h]:
                _pwrite_all(fd, data, off)
            with lock:
                stats.written_bytes += lengths[h] * len(places[h])
            if progress:
                progress(lengths[h] * len(places[h]))

        local, remote = [], []
        extents: dict[int, list[tuple[int, int]]] = {fd: [] for fd in fds}
        for h, length in lengths.items():
            if zeros.get(h) == length:
                stats.zero_chunks += 1
                stats.zero_bytes += length
                if progress:
                    progress(length * len(places[h]))
                continue
            for fd, off in places[h]:
                extents[fd].append((off, length))
            if sources(h):
                local.append(h)
            else:
                remote.append(h)
        for fd, ext in extents.items():
            _preallocate(fd, ext)
        missed: list[str] = []

        def from_local(h: str) -> None:
            length = lengths[h]
            for copy in sources(h):
                data = read_local(copy, length)
                if data is not None and chunk.sha256(data) == h:
                    put(h, data)
                    with lock:
                        stats.local_chunks += 1
                        stats.local_bytes += length
                    return
                with lock:
                    stats.bad_sources.append(copy.owner)
                if on_bad_source:
                    on_bad_source(copy.owner)
            with lock:
                missed.append(h)

        _run_pool(workers, local, from_local)
        remote += missed
        if remote and store is None:
            raise StoreError("get", remote[0], "chunk is on no local copy and no store is configured")
        if remote:
            files = [os.path.abspath(dest / f.name) for f in manifest.files]
            plan = fetch_plan(store, plan_ranges(manifest, remote), files,
                              {h: [(file_index[fd], off) for fd, off in places[h]] for h in remote}, lengths,
                              checks, workers=workers, direct_io=direct_io, sealed=bool(manifest.encryption))
            st = fetcher.run([str(store.fetcher)], plan, store, progress=progress)["stats"]
            stats.fetched_chunks += st["fetched_chunks"]
            stats.fetched_bytes += st["fetched_bytes"]
            stats.fetched_raw_bytes += st["fetched_raw_bytes"]
            stats.written_bytes += st["written_bytes"]
            stats.direct_bytes += st["direct_bytes"]
            stats.retries += st["retries"]
        for fd in fds:   # thaw-fetch's writes (O_DIRECT pages too) and the local copies, durable
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)
    stats.seconds = time.monotonic() - t0
    return stats


# Twin: go/internal/fetch/plan.go FillPlanVersion.
GO_PLAN_VERSION = 2


def fetch_plan(store: Store, ranges: list[_Range], files: list[str], places: dict[str, list[tuple[int, int]]],
               lengths: dict[str, int], checks: dict[str, str], *, workers: int, direct_io: bool,
               sealed: bool = False) -> dict:
    """thaw-fetch's plan (go/internal/fetch/plan.go FillPlan) for `ranges`:
    one presigned URL per pack, each chunk's length, position in its range,
    stored form and `places` (file index, offset) and its BLAKE3 from
    `checks` (travels, is not used: the SHA-256 name is checked), and the
    store's retry policy (docs/store.md, "Retry policy").

    `sealed`: each chunk's entry carries an eighth element, its AES-256-GCM key
    in hex (keys.chunk_key: one chunk's key, never the tenant's). The plan goes
    to thaw-fetch's stdin only (fetcher.run): no argv, no file, no log holds a key."""
    objects: list[dict] = []
    index: dict[str, int] = {}

    def obj(p: str) -> int:
        if p not in index:
            index[p] = len(objects)
            objects.append({"url": store.presign_get(p), "name": store.pack_name(p)})
        return index[p]

    return {"version": GO_PLAN_VERSION, "workers": workers, "retry": store.policy.plan(),
            "timeout_s": store.timeout_s, "direct_io": direct_io, "files": files, "objects": objects,
            "ranges": [[obj(r.pack), r.start, r.length,
                        [[h, lengths[h], loc.offset - r.start, loc.stored, loc.codec, places[h], checks.get(h, "")]
                         + ([store.chunk_key(h).hex()] if sealed else [])
                         for h, loc in r.chunks]] for r in ranges]}


def upload(layout: Manifest, src: Path, store: Store, *, workers: int,
           progress: Progress | None = None) -> tuple[dict[str, Location], UploadStats]:
    """Send every chunk of `layout` (read from directory `src`) that the store
    lacks, in packs, then the chunks' pointers; where every chunk now lies.

    The chunks are not hashed again: their names come from thaw-chunk's pass
    over these files, and the caller checks (chunk.file_state) that the files
    did not change between that pass and the manifest's publication. A file
    found shorter than the layout says is refused here.
    """
    t0 = time.monotonic()
    stats = UploadStats()
    lock = threading.Lock()
    first: dict[str, tuple[str, int, int]] = {}
    for f in layout.files:
        for off, c in f.placed():
            first.setdefault(c.hash, (f.name, off, c.length))
    stats.chunks = len(first)
    locations: dict[str, Location] = {}

    def probe(h: str) -> None:
        loc = store.chunk_location(h)
        if loc is not None:
            with lock:
                locations[h] = loc
                stats.present_chunks += 1
            if progress:
                progress(first[h][2])

    _run_pool(workers, list(first), probe)
    missing = [h for h in first if h not in locations]   # file order: packs hold neighbours

    def send(group: list[str]) -> None:
        # Sealed with the tenant's chunk keys when it encrypts (store.chunk_key; pack.build).
        p = pack.build(_read_chunks(src, [(h, *first[h]) for h in group]),
                       chunk_key=store.chunk_key, name_key=store.tenant_key)
        store.put_pack(p.name, p.body)
        with lock:
            for h, loc, n in p.chunks:
                locations[h] = loc
                stats.uploaded_chunks += 1
                stats.uploaded_bytes += loc.stored
                stats.uploaded_raw_bytes += n
                stats.compressed_chunks += loc.codec != pack.CODEC_NONE
            stats.packs += 1
        if progress:
            progress(p.raw_bytes)

    _run_pool(min(workers, pack.PACK_WORKERS), pack.groups([(h, first[h][2]) for h in missing]), send)
    _run_pool(workers, missing, lambda h: store.put_chunk_pointer(h, locations[h], first[h][2]))
    stats.seconds = time.monotonic() - t0
    return locations, stats


def _read_chunks(src: Path, chunks: list[tuple[str, str, int, int]]) -> list[tuple[str, memoryview]]:
    """The bytes of (hash, file name, offset, length) chunks: runs that are
    contiguous in one file are read with one pread each (a pack is mostly one run)."""
    out: list[tuple[str, memoryview]] = []
    i = 0
    while i < len(chunks):
        name, start = chunks[i][1], chunks[i][2]
        end, j = start, i
        while j < len(chunks) and chunks[j][1] == name and chunks[j][2] == end:
            end += chunks[j][3]
            j += 1
        path = src / name
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                data = _pread_exact(fd, end - start, start)
            finally:
                os.close(fd)
        except OSError as e:
            raise ImageError(str(path), f"cannot read it again to upload ({e})") from None
        if len(data) != end - start:
            raise ImageError(str(path), f"is shorter than when it was chunked (no bytes at {start + len(data)}): "
                                        "the image changed after it was chunked")
        view = memoryview(data)
        for h, _, off, n in chunks[i:j]:
            out.append((h, view[off - start:off - start + n]))
        i = j
    return out
