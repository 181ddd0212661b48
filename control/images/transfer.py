"""Moving chunks: upload an image's new chunks to the store in packs, and fill
an entry directory from local copies and ranged reads of the store's packs.

Both run `workers` threads. A fill reads ranges of at most RANGE_BYTES
(coalescing neighbouring chunks of one pack across gaps up to GAP_BYTES), so
it holds at most workers x RANGE_BYTES (8 x 16 MiB) plus one decoded chunk
per worker in memory, however large the image. An upload reads each pack's
chunks (control/images/pack.py: PACK_BYTES, file order) in long preads and
sends one pack per thread on at most PACK_WORKERS threads; it does not hash
them again (their names come from thaw-chunk). hashlib, zlib, socket reads
and pread/pwrite release the GIL, so threads overlap on every core.

Filling writes each chunk straight to its offsets in files created at full
size, with the extents it will write allocated up front (see _preallocate): an
all-zero chunk is left as a hole (the file is sparse, reads give
zeros, its hash is known), a chunk already on this node (another cache
entry) is copied after its hash is checked, and only the rest is fetched.
Every byte written has been checked against the manifest.

The fetched rest goes to thaw-fetch (go/cmd/thaw-fetch, `store.fetcher`) when
the store has one: this module plans the ranges, presigns one URL per pack
and hands both over (_fetch_with); the Go side GETs, checks each chunk
against its SHA-256 name and writes. Without a fetcher the same plan runs
here, in threads (from_store in fill). docs/store.md, "Why the fetch is in Go".

With `direct_io` (cache.direct_io, on by default), a fetched range is read
into a page-aligned buffer placed so that its bytes sit at their file offset
modulo ALIGN; runs of uncompressed chunks that are contiguous in the pack and
in the file then go to disk with O_DIRECT for their whole pages, and only the
partial pages at their ends (and decoded or local chunks) through the page
cache. A page written with O_DIRECT is covered by that one run, so no
buffered write ever touches it. It saves the page-cache copy, reclaim and
writeback, and leaves the node's page cache alone (docs/store.md, "Writing a
fill").
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from control import metrics
from control.images import chunk
from control.images import pack
from control.errors import ImageError, IntegrityError, PreconditionError, StoreError, ThawError
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
    engine: str = ""             # who fetched: "thaw-fetch" (store.fetcher) or "python"
    direct_bytes: int = 0        # of written_bytes, written with O_DIRECT (thaw-fetch counts them)
    retries: int = 0             # GETs retried under the store's retry policy (either engine)
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


_IOV_MAX = 1024


def _write_runs(writes: list[tuple[int, int, bytes | memoryview]]) -> None:
    """Write (fd, offset, data) items, merging neighbours into one pwritev each
    (a range's chunks are mostly contiguous in the file: one syscall, no copy)."""
    writes.sort(key=lambda w: (w[0], w[1]))
    i = 0
    while i < len(writes):
        fd, start, first = writes[i]
        bufs = [first]
        end = start + len(first)
        j = i + 1
        while j < len(writes) and writes[j][0] == fd and writes[j][1] == end and len(bufs) < _IOV_MAX:
            bufs.append(writes[j][2])
            end += len(writes[j][2])
            j += 1
        done = os.pwritev(fd, bufs, start) if len(bufs) > 1 else 0
        if done < end - start:   # a short pwritev (or a single buffer): finish buffer by buffer
            off = start
            for b in bufs:
                n = len(b)
                if off + n > start + done:
                    skip = max(0, start + done - off)
                    _pwrite_all(fd, memoryview(b)[skip:], off + skip)
                off += n
        i = j


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


ALIGN = 4096     # O_DIRECT offset, length and address alignment (the page size covers every block size)


def _open_direct(path: Path) -> int | None:
    """A second descriptor of `path` with O_DIRECT, None where the file system refuses it."""
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError:
        return None


def _write_segment(fd: int, dfd: int | None, buf: memoryview, pos: int, off: int, n: int) -> bool:
    """Write buf[pos:pos+n] at file offset `off`: whole pages through `dfd`
    (O_DIRECT) where buf (page-aligned) holds them at a congruent position,
    the rest through `fd`. False if O_DIRECT failed (the segment was then
    written buffered; the caller stops using O_DIRECT)."""
    head = min(n, -off % ALIGN)
    mid = (n - head) // ALIGN * ALIGN
    ok = True
    if dfd is not None and mid and (pos - off) % ALIGN == 0:
        try:
            _pwrite_all(dfd, buf[pos + head:pos + head + mid], off + head)
        except OSError:
            ok = False
            mid = 0
    else:
        mid = 0
    if mid:
        if head:
            _pwrite_all(fd, buf[pos:pos + head], off)
        tail = n - head - mid
        if tail:
            _pwrite_all(fd, buf[pos + head + mid:pos + n], off + head + mid)
    else:
        _pwrite_all(fd, buf[pos:pos + n], off)
    return ok


class _Buffers(threading.local):
    """One reusable page-aligned read buffer per worker thread."""
    buf: mmap.mmap | None = None

    def get(self, size: int) -> memoryview:
        if self.buf is None or len(self.buf) < size:
            if self.buf is not None:
                self.buf.close()
            self.buf = mmap.mmap(-1, max(size, RANGE_BYTES + 2 * ALIGN))
        return memoryview(self.buf)


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

    Raises IntegrityError when the store serves a chunk that does not hash to
    its name, StoreError when the store fails; `dest` is then incomplete and
    the caller removes it. A manifest whose chunks are sealed (its
    "encryption") is opened with `store`'s tenant key: the caller checked that
    they agree (image.pull).
    """
    t0 = time.monotonic()
    stats = FillStats()
    sealed = bool(manifest.encryption)
    fetcher: Path | None = getattr(store, "fetcher", None)
    stats.engine = "thaw-fetch" if fetcher is not None else "python"
    if fetcher is not None and not fetcher.is_file():
        raise PreconditionError(f"thaw-fetch not found at {fetcher}: run `make build`, or set THAW_STORE_FETCHER "
                                "(empty: fetch in-process)", path=str(fetcher))
    lock = threading.Lock()
    places: dict[str, list[tuple[int, int]]] = {}   # hash -> [(fd, offset)]
    lengths: dict[str, int] = {}
    checks: dict[str, str] = {}                     # hash -> BLAKE3 (schema 2), for thaw-fetch
    fds: list[int] = []
    direct: dict[int, int | None] = {}   # buffered fd -> its O_DIRECT twin
    file_index: dict[int, int] = {}      # buffered fd -> index in manifest.files
    try:
        for i, f in enumerate(manifest.files):
            fd = os.open(dest / f.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)   # memory: owner-only
            fds.append(fd)
            file_index[fd] = i
            os.ftruncate(fd, f.size)
            direct[fd] = _open_direct(dest / f.name) if direct_io and fetcher is None else None
            if direct[fd] is not None:
                fds.append(direct[fd])
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
        extents: dict[int, list[tuple[int, int]]] = {fd: [] for fd in direct}
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

        buffers = _Buffers()
        use_direct = [any(v is not None for v in direct.values())]

        def from_store(r: _Range) -> None:
            # Place the body so that the first uncompressed chunk's bytes sit at its file
            # offset modulo ALIGN (decoded chunks are copies: their place in the body is moot).
            h0, loc0 = next(((h, loc) for h, loc in r.chunks if loc.codec == pack.CODEC_NONE and not sealed),
                            r.chunks[0])
            pad = (places[h0][0][1] - (loc0.offset - r.start)) % ALIGN
            buf = buffers.get(pad + r.length)
            body = buf[pad:pad + r.length]
            store.get_range_into(r.pack, r.start, body)
            writes: list[tuple[int, int, bytes | memoryview]] = []
            segments: list[list[int]] = []   # [fd, file offset, body position, length]
            for h, loc in r.chunks:
                pos = loc.offset - r.start
                payload = body[pos:pos + loc.stored]
                try:
                    data = pack.decode(loc.codec, payload, lengths[h], store.chunk_key(h) if sealed else None, h)
                except ValueError as e:
                    raise IntegrityError("store", h, f"bytes at {store.pack_name(r.pack)} offset {loc.offset} "
                                                     f"do not decode ({e}): the stored chunk was altered or "
                                                     "damaged") from None
                got = chunk.sha256(data)
                if got != h:
                    raise IntegrityError("store", h, f"bytes at {store.pack_name(r.pack)} offset {loc.offset} "
                                                     f"hash to {got}: the stored chunk was altered or damaged")
                rest = places[h]
                if loc.codec == pack.CODEC_NONE and not sealed:   # its stored bytes are its raw bytes
                    fd, off = rest[0]
                    last = segments[-1] if segments else None
                    if last and last[0] == fd and last[1] + last[3] == off and last[2] + last[3] == pos:
                        last[3] += loc.stored
                    else:
                        segments.append([fd, off, pos, loc.stored])
                    rest = rest[1:]
                writes += [(fd, off, data) for fd, off in rest]
                with lock:
                    stats.fetched_chunks += 1
                    stats.fetched_bytes += loc.stored
                    stats.fetched_raw_bytes += lengths[h]
            for fd, off, pos, n in segments:
                if not _write_segment(fd, direct[fd] if use_direct[0] else None, buf, pad + pos, off, n):
                    use_direct[0] = False
            _write_runs(writes)
            n = sum(len(w[2]) for w in writes) + sum(seg[3] for seg in segments)
            with lock:
                stats.written_bytes += n
            if progress:
                progress(n)

        if remote and fetcher is not None:
            files = [os.path.abspath(dest / f.name) for f in manifest.files]
            _fetch_with(fetcher, store, plan_ranges(manifest, remote), files,
                        {h: [(file_index[fd], off) for fd, off in places[h]] for h in remote}, lengths, checks,
                        workers=workers, direct_io=direct_io, progress=progress, stats=stats, sealed=sealed)
        elif remote:
            before = getattr(store, "retried", 0)
            _run_pool(workers, plan_ranges(manifest, remote), from_store)
            stats.retries += getattr(store, "retried", 0) - before
        for fd in direct:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)
    stats.seconds = time.monotonic() - t0
    return stats


# Twin: go/cmd/thaw-fetch/plan.go PlanVersion.
GO_PLAN_VERSION = 2


def _fetch_with(fetcher: Path, store: Store, ranges: list[_Range], files: list[str],
                places: dict[str, list[tuple[int, int]]], lengths: dict[str, int], checks: dict[str, str], *,
                workers: int,
                direct_io: bool, progress: Progress | None, stats: FillStats, sealed: bool = False) -> None:
    """Run `ranges` through thaw-fetch (go/cmd/thaw-fetch): ranged GETs of
    presigned pack URLs, every chunk checked against its SHA-256 name (`checks`,
    the manifest's BLAKE3, travel in the plan and are not used), writes to
    `places` (file index, offset), O_DIRECT where `direct_io`, retries as the
    store's retry policy says (docs/store.md, "Retry policy"). Same errors as
    the in-process path.

    `sealed`: each chunk's entry carries an eighth element, its AES-256-GCM key
    in hex (keys.chunk_key: one chunk's key, never the tenant's). The plan goes
    to thaw-fetch's stdin only: no argv, no file, no log holds a key."""
    objects: list[dict] = []
    index: dict[str, int] = {}

    def obj(p: str) -> int:
        if p not in index:
            index[p] = len(objects)
            objects.append({"url": store.presign_get(p), "name": store.pack_name(p)})
        return index[p]

    # Fields left out of "retry" take thaw-fetch's defaults (base_s 1, transient_base_s 0.05,
    # max_backoff_s 20: botocore's). Twin: control/images/retry.py RetryPolicy.
    plan = {"version": GO_PLAN_VERSION, "workers": workers,
            "retry": {"max_attempts": store.retries, "budget_s": store.retry_budget_s},
            "timeout_s": store.timeout_s, "direct_io": direct_io, "files": files, "objects": objects,
            "ranges": [[obj(r.pack), r.start, r.length,
                        [[h, lengths[h], loc.offset - r.start, loc.stored, loc.codec, places[h], checks.get(h, "")]
                         + ([store.chunk_key(h).hex()] if sealed else [])
                         for h, loc in r.chunks]] for r in ranges]}
    env = dict(os.environ)
    if env.get("AWS_CA_BUNDLE") and not env.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = env["AWS_CA_BUNDLE"]   # boto3's CA bundle, for Go's TLS
    result: dict = {}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([str(fetcher)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                env=env)
        try:
            try:
                proc.stdin.write(json.dumps(plan, separators=(",", ":")).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass   # it refused the plan: its exit status and stderr say why
            done = 0
            for line in proc.stdout:
                msg = json.loads(line)
                if "done" in msg:
                    if progress and msg["done"] > done:
                        progress(msg["done"] - done)
                    done = msg["done"]
                else:
                    result = msg
            rc = proc.wait()
        finally:
            if proc.poll() is None:   # interrupted: stop its GETs and writes before the caller removes dest
                proc.kill()
                proc.wait()
            proc.stdout.close()
        err.seek(0)
        stderr = err.read().decode(errors="replace").strip()
    if "stats" in result and rc == 0:
        st = result["stats"]
        stats.fetched_chunks += st["fetched_chunks"]
        stats.fetched_bytes += st["fetched_bytes"]
        stats.fetched_raw_bytes += st["fetched_raw_bytes"]
        stats.written_bytes += st["written_bytes"]
        stats.direct_bytes += st["direct_bytes"]
        stats.retries += st["retries"]
        return
    e = result.get("error")
    if e and e.get("kind") == "integrity":
        raise IntegrityError("store", e["chunk"], e["detail"])
    if e and e.get("kind") == "store":
        metrics.inc("thaw_store_errors_total", op="get")
        raise StoreError("get", f"{store.uri(e['object'])} bytes {e['offset']}+{e['length']}", e["detail"],
                         store.endpoint)
    if e:
        raise ThawError(f"writing {e['object']} at offset {e['offset']}: {e['detail']}")
    raise ThawError(f"thaw-fetch failed (exit {rc}): {stderr[-2000:] or 'no message'}")


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
