"""Restore while the image streams in from the store (issue 18).

A node that does not hold an image pulls it whole before `runsc restore`
starts. A stream lets runsc restore at once instead: the sentry reads the
image through runsc's checkpoint-gofer sidecar, which is thaw-gofer
(go/cmd/thaw-gofer; go/internal/stream says how its two roles work), and
each read waits until its bytes have arrived and were checked. Why this
transport and what runsc does at the pin: docs/notes/2026-11-30-stream-restore.md
and docs/store.md "Streaming restore".

`open_image` is `image.pull` for a streamed restore. Under the key's lock, as
a pull, and for the stream's whole length:
  - a ready cache entry: its lease (a hit; nothing streams);
  - else the store's manifest for this node; space reserved; a partial entry;
    the files runsc does not read (thaw.json) filled first by transfer.fill;
    checkpoint.img, pages_meta.img and pages.img created at full size, with
    all-zero chunks left as holes and chunks found in other entries copied
    (both checked: "ready"); the rest handed to `thaw-gofer stream` in fetch
    order: checkpoint.img and pages_meta.img (the sentry reads them first,
    whole), then the ranges earlier restores faulted on (the learned order,
    an object beside the manifest), then pages.img by offset (the sentry's
    loader sweeps it front to back);
  - the directory runsc restores from (<cache>/streams/<entry>.<pid>-<start>/)
    holds hard links of the partial's files (valid after the install by
    rename), thaw.json and gcs_opts.json, which makes runsc start its
    checkpoint-gofer: thaw-gofer, found through GVISOR_SIDECAR_BINARIES_DIR
    set for that one `runsc restore` (the node's runsc install is untouched);
  - once every chunk is verified and fsynced, the entry is installed by
    rename and leased, exactly as a pull leaves it; on any failure the
    partial is removed: no half entry. The ranges the sandbox faulted on are
    merged into the image's order object for the next node.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from control import metrics
from control.config import Settings
from control.errors import IntegrityError, ThawError
from control.files import Owner, write_bytes_atomic
from control.images import chunk
from control.images import fetcher
from control.images import image as images
from control.images import manifest as manifestmod
from control.images import transfer
from control.images.cache import Cache, Lease
from control.images.manifest import Manifest
from control.images.store import Store
from control.node.compat import CompatTuple
from control.logfields import fields
from control.images.order import read_order, record_order  # noqa: F401 - a stream's learned order

log = logging.getLogger(__name__)

# Twin: go/internal/stream/plan.go PlanVersion.
PLAN_VERSION = 2
# Twin: go/internal/stream/gofer.go GoferConfigVersion (2: verify mode, control/images/served.py).
GOFER_CONFIG_VERSION = 2
# runsc starts its checkpoint-gofer when the image directory holds this file,
# and hands it over unread (runsc/sandbox/sandbox.go checkpointGCSOptsFileName).
GOFER_CONFIG = "gcs_opts.json"
# runsc looks for the sidecar under this name in $GVISOR_SIDECAR_BINARIES_DIR,
# else in gvisor-bin/ beside itself (runsc/gvisorbinaries checkpointGoferName,
# sidecarBinariesDirEnv, binDirName).
SIDECAR = "checkpointgofer"
SIDECAR_ENV = "GVISOR_SIDECAR_BINARIES_DIR"
NODE_SIDECARS = "gvisor-bin"
# The files the sentry reads through the gofer, in the order it reads them
# (runsc/boot/controller.go getRestoreReadersForCheckpointGofer). Twin:
# runsc_hooks/runsc.py IMAGE_FILES.
RUNSC_FILES = ("checkpoint.img", "pages_meta.img", "pages.img")
HEAD_FILES = ("checkpoint.img", "pages_meta.img")
PAGES = "pages.img"
STREAMS_DIR = "streams"          # under the cache root: one image directory per stream
COMPLETE = "complete"            # the stream's marker: every byte verified and fsynced

# What the gofer tells the sentry (stateio.AsyncReader): reads of 256 KiB as
# runsc's own file reader makes them (stateio/pagesfile.go), 32 at once
# rather than its 128, so that a page a task waits on gets a slot sooner
# (docs/notes/2026-11-30-stream-restore.md, "Limits to design around").
MAX_PARALLEL = 32
MAX_READ_BYTES = 256 << 10
# A sweep read waiting this long is asked for like a fault: a safety net for a
# bulk order that does not match the sweep, not a scheduler (the bulk order is
# the sweep's; boosting every slow sweep read turned a stream into small GETs).
BOOST_S = 5.0
# The stream: GETs of up to 8 MiB (chunks are used as their bytes arrive, so
# size costs no latency), two workers kept for faulted ranges, which bring
# the next 512 KiB with them (faults come in runs).
RANGE_BYTES = 8 << 20
URGENT_WORKERS = 2
URGENT_AHEAD_BYTES = 512 << 10

# How long a failed restore waits to hear whether its stream failed (Stream.verdict):
# the stream's end follows the gofer's failed reads within milliseconds.
VERDICT_S = 2.0

def failure_reason(err: ThawError) -> str:
    """The reason a restore gives when its stream failed (the gofer failed the sentry's
    reads, so runsc gave up): thawd's for a container or pod, the CLI's for a cold fallback.
    A cache entry whose verified read found an altered chunk (control/images/served.py)
    is `corrupt: ...` (issue 30; the metrics label is the part before the colon)."""
    if isinstance(err, IntegrityError) and err.where == "cache":
        return f"corrupt: {err.message}"
    return f"{type(err).__name__}: the image's stream failed: {getattr(err, 'message', err)}"


class Stream:
    """An image streaming into the node cache while a sandbox restores from it.

    `path` is the image directory to restore from, `env()` what `runsc
    restore` needs in its environment. The stream goes on after the restore
    returned (the sentry loads pages in the background); `wait()` for its
    end, `release()` when the sandbox is gone or loaded (a released stream
    still completes and installs its entry: the next start hits the cache).
    """
    hit = False
    streamed = True
    checked = True

    def __init__(self, key: str, path: Path, sidecar_dir: Path) -> None:
        self.key = key
        self.path = self.source = path
        self.sidecar_dir = sidecar_dir
        self.entry_id: str | None = None       # once installed
        self.error: ThawError | None = None     # why it failed
        self.stats: dict = {}
        self.faults: dict[str, list[list[int]]] = {}
        self.learned_ranges = 0                 # ranges of the learned order fetched first
        self.started = time.monotonic()
        self.seconds = 0.0
        self._done = threading.Event()
        self._mu = threading.Lock()
        self._released = False
        self._lease: Lease | None = None
        self._holder = ""                   # describe(): said to the lease once installed
        self._callbacks: list[Callable[[Stream], None]] = []

    def env(self) -> dict[str, str]:
        return {SIDECAR_ENV: str(self.sidecar_dir)}

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the stream ended (installed or failed); False on timeout."""
        return self._done.wait(timeout)

    def verdict(self, wait_s: float = VERDICT_S) -> ThawError | None:
        """Why the stream failed, waiting up to `wait_s` for a running one to end; None
        if it did not. A restore that failed asks: when a stream fails, the gofer fails
        the sentry's reads and runsc kills the sandbox, so the stream's error (NoSpace,
        IntegrityError, StoreError) is the reason, and a healthy stream goes on."""
        self._done.wait(wait_s)
        return self.error

    def add_done_callback(self, fn: Callable[["Stream"], None]) -> None:
        with self._mu:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def release(self) -> None:
        with self._mu:
            if self._released:
                return
            self._released = True
            lease, self._lease = self._lease, None
            ended = self._done.is_set()
        if lease is not None:
            lease.release()
        if ended:
            shutil.rmtree(self.path, ignore_errors=True)

    def describe(self, holder: str) -> None:
        """Who holds this image (Lease.describe): said to the cache lease the stream
        installs, now if it is in already, else when it is."""
        with self._mu:
            self._holder = holder
            lease = self._lease
        if lease is not None:
            lease.describe(holder)

    def _finish(self, lease: Lease | None) -> None:
        with self._mu:
            self.seconds = time.monotonic() - self.started
            released = self._released
            if not released:
                self._lease = lease
            holder = self._holder
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        if released:
            if lease is not None:
                lease.release()
            shutil.rmtree(self.path, ignore_errors=True)
        elif lease is not None and holder:
            lease.describe(holder)
        for fn in callbacks:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a caller's bookkeeping must not break the stream
                log.exception("stream %s: done callback", self.key, extra=fields(key=self.key))

    def to_dict(self) -> dict:
        return {"key": self.key, "path": str(self.path), "entry": self.entry_id, "done": self.done,
                "error": str(self.error) if self.error else None, "seconds": round(self.seconds, 3),
                "stats": self.stats, "faults": sum(len(v) for v in self.faults.values()),
                "learned_ranges": self.learned_ranges}


def why_not(settings: Settings, store: Store) -> str:
    """Why a miss is pulled whole rather than streamed on this node for `store`'s
    tenant; "" when it streams. Both doors (thawd's image source, `thaw restore
    --from-store`) ask this and log the answer."""
    if not settings.store_stream:
        return "store.stream is off"
    gofer = Path(settings.store_gofer)
    if not gofer.is_file():
        return f"thaw-gofer is not at {gofer} (store.gofer; `thaw provision` installs it)"
    return ""


def open_image(cache: Cache, store: Store, settings: Settings, key: str, node: CompatTuple, *,
               progress: transfer.Progress | None = None,
               lock_timeout_s: float | None = None) -> Lease | Stream:
    """A leased cache entry of `key` if this node holds one (a hit, as
    `image.pull`), else a Stream filling a new entry, ready for runsc to
    restore from. Raises what a pull raises (NotFound, TupleMismatch,
    StoreError, ManifestError, CacheFull, UserError for another tenant's key,
    Timeout for the key's lock) when nothing could start; failures after that
    are the Stream's `error`."""
    manifestmod.validate_key(key)
    images.check_tenant(store, key)   # a hit too: another tenant's cached entry is not this one's
    gofer = fetcher.require(Path(settings.store_gofer), "thaw-gofer", "store.gofer", "THAW_STORE_GOFER")
    sidecars = sidecar_dir(settings)
    job = _Job(cache, store, settings, key, node, gofer, sidecars, progress, lock_timeout_s)
    t = threading.Thread(target=job.run, name=f"thaw-stream-{key}", daemon=True)
    t.start()
    job.ready.wait()
    if job.failed_early is not None:
        raise job.failed_early
    return job.result


def sidecar_dir(settings: Settings) -> Path:
    """A directory runsc takes its sidecars from for a streamed restore: thaw-gofer
    as `checkpointgofer`, and every other sidecar of the node's own runsc install
    (gvisor-bin/ beside it) mirrored, so that setting GVISOR_SIDECAR_BINARIES_DIR
    changes nothing else runsc starts (runsc/gvisorbinaries resolveDir)."""
    d = settings.state_dir / "gvisor-sidecars"
    d.mkdir(parents=True, exist_ok=True)
    want = {SIDECAR: Path(settings.store_gofer).resolve()}
    runsc = Path(settings.runsc_path)
    for node_dir in (runsc.parent / NODE_SIDECARS, runsc.resolve().parent / NODE_SIDECARS):
        if node_dir.is_dir():
            for p in node_dir.iterdir():
                want.setdefault(p.name, p.resolve())
    for name, target in want.items():
        link = d / name
        if os.path.islink(link) and os.readlink(link) == str(target):
            continue
        tmp = d / f".{name}.{secrets.token_hex(4)}"
        os.symlink(target, tmp)
        os.replace(tmp, link)
    return d


class _Job:
    """One stream, start to end, on its own thread: it holds the key's lock
    (filelock's locks belong to the thread that took them) and is the thread
    thaw-gofer's PDEATHSIG watches."""

    def __init__(self, cache: Cache, store: Store, settings: Settings, key: str, node: CompatTuple, gofer: Path,
                 sidecars: Path, progress, lock_timeout_s) -> None:
        self.cache, self.store, self.s, self.key, self.node = cache, store, settings, key, node
        self.gofer, self.sidecars, self.progress, self.lock_timeout_s = gofer, sidecars, progress, lock_timeout_s
        self.ready = threading.Event()
        self.result: Lease | Stream | None = None
        self.failed_early: BaseException | None = None
        self.stream: Stream | None = None

    def run(self) -> None:
        lease = None
        faults: dict[str, list[list[int]]] = {}
        manifest = None
        try:
            with self.cache.key_lock(self.key, self.lock_timeout_s):
                for p in self.cache.recover_locked(self.key):
                    log.info("stream %s: recovered: removed %s", self.key, p, extra=fields(key=self.key, path=str(p)))
                remove_leftovers(self.cache)
                entry, reasons = self.cache.find_locked(self.key, self.node)
                if entry is not None:
                    why = self.cache.check_entry(entry)
                    if why is None:
                        hit = self.cache.lease(entry.id, hit=True)
                        if hit is not None:
                            self.result = hit
                            self.ready.set()
                            return
                    else:
                        log.warning("stream %s: cached entry %s is corrupt (%s): streaming", self.key, entry.id, why,
                                    extra=fields(key=self.key, entry=entry.id, reason=why))
                        self.cache.mark_corrupt(entry.id)
                manifest = images.remote_manifest(self.store, self.key, self.node, reasons)
                rid = self.cache.reserve(self.key, manifest.size)
                try:
                    eid, partial = self.cache.new_partial(manifest.key, manifest.tuple_hash)
                    try:
                        metrics.add("thaw_streams_in_flight", 1)
                        try:
                            faults = self._stream(manifest, eid, partial)
                        finally:
                            metrics.add("thaw_streams_in_flight", -1)
                        self.cache.install_locked(eid, partial, manifest)
                    except BaseException:
                        shutil.rmtree(partial, ignore_errors=True)
                        # The stream directory's hard links would keep the partial's blocks:
                        # on a full file system the cache's index could not even drop the
                        # reservation. A doomed sandbox's gofer keeps the files it opened;
                        # thaw.json stays for a cold start from the image's spec (warm_start).
                        if self.stream is not None:
                            for name in RUNSC_FILES:
                                (self.stream.path / name).unlink(missing_ok=True)
                        raise
                finally:
                    self.cache.unreserve(rid)
                self.stream.entry_id = eid
                lease = self.cache.lease(eid)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, or kept on the Stream
            # A full cache file system (a pwrite here, thaw-gofer's writes or fsync, the
            # install) is NoSpace, as a pull reports it; the partial is gone already.
            e = images.no_space(self.cache, manifest, e) or e
            if not self.ready.is_set():
                if self.stream is not None:   # nobody will release it
                    shutil.rmtree(self.stream.path, ignore_errors=True)
                    self.stream = None
                self.failed_early = e
                self.ready.set()
                return
            self.stream.error = e if isinstance(e, ThawError) else ThawError(f"{type(e).__name__}: {e}")
            # Said once, by whoever waits for it: thawd's image source logs it, the CLI
            # raises it (one line, as for a pull).
            log.info("stream %s failed: %s", self.key, self.stream.error,
                     extra=fields(key=self.key, decision="stream-failed", reason=str(self.stream.error)))
        finally:
            if self.stream is not None:
                self.stream._finish(lease)
        if manifest is not None and any(faults.values()) and self.stream.error is None:
            try:
                record_order(self.store, manifest, faults)
            except ThawError as e:  # a hint: the next restore only loses its head start
                log.warning("stream %s: recording the learned order: %s", self.key, e, extra=fields(key=self.key, reason=str(e)))

    def _stream(self, m: Manifest, eid: str, partial: Path) -> dict[str, list[list[int]]]:
        """Fill `partial` through thaw-gofer stream; hand the Stream to the caller
        once gofers can connect; return the faulted ranges. Precondition: key lock held."""
        me = Owner.me()
        sdir = self.cache.root / STREAMS_DIR / f"{eid}.{me.pid}-{me.start}"
        sdir.mkdir(parents=True, mode=0o700)
        sockdir = None
        sock = sdir / "s.sock"
        if len(str(sock).encode()) > 100:   # sun_path holds 108 bytes
            sockdir = Path(tempfile.mkdtemp(prefix="thaw-stream-"))
            sock = sockdir / "s.sock"
        self.stream = Stream(self.key, sdir, self.sidecars)
        try:
            # Local copies from this tenant's entries only, as a pull (issue 13).
            sources = self.cache.sources(m.unique_chunks(), tenant=getattr(self.store, "tenant", ""))
            bad = self.cache.mark_corrupt
            others = tuple(f for f in m.files if f.name not in RUNSC_FILES)
            if others:   # thaw.json: the CLI reads it before runsc starts
                transfer.fill(dataclasses.replace(m, files=others), partial, self.store, sources,
                              workers=self.s.store_workers, on_bad_source=bad)
            order = read_order(self.store, m)
            self.stream.learned_ranges = sum(len(v) for v in order.values())
            plan, gofer_files = build_plan(m, partial, sdir, self.store, sources, order, on_bad_source=bad,
                                           workers=self.s.store_workers, timeout_s=self.s.store_timeout_s,
                                           sock=sock)
            for f in m.files:
                os.link(partial / f.name, sdir / f.name)
            cfg = {"version": GOFER_CONFIG_VERSION, "socket": str(sock), "complete": str(sdir / COMPLETE),
                   "files": gofer_files, "deadline_s": self.s.store_stream_deadline_s, "boost_s": BOOST_S,
                   "max_parallel": MAX_PARALLEL, "max_read_bytes": MAX_READ_BYTES, "log": str(self._log_path(eid))}
            write_bytes_atomic(sdir / GOFER_CONFIG, json.dumps(cfg).encode())
            result = self._run_gofer(plan, [f["name"] for f in gofer_files])
        finally:
            if sockdir is not None:
                shutil.rmtree(sockdir, ignore_errors=True)
        self.stream.stats = result.get("stats", {})
        metrics.inc("thaw_store_fetched_bytes_total", self.stream.stats.get("fetched_bytes", 0))
        metrics.inc("thaw_store_retries_total", self.stream.stats.get("retries", 0))
        return self.stream.faults

    def _log_path(self, eid: str) -> Path:
        """The gofer's log: it outlives the stream's directory (reads, waits, faults, failures).
        Each stream's is a new file (a new entry id), so the oldest beyond
        store.stream_logs_keep go first: unbounded, a node's cache misses grew this directory
        by a file each for ever (tests/integration/test_soak.py found it)."""
        d = self.s.log_dir / "streams"
        d.mkdir(parents=True, exist_ok=True)
        prune_logs(d, "*.gofer.log", self.s.store_stream_logs_keep - 1)
        return d / f"{eid}.gofer.log"

    def _run_gofer(self, plan: dict, names: list[str]) -> dict:
        def seen(msg: dict) -> None:
            if "listening" in msg:   # gofers may connect: runsc may restore from the stream now
                self.result = self.stream
                self.ready.set()
                return
            # The last line: faults and stats, also when the stream failed (to_dict shows them).
            self.stream.faults = {}
            for fi, off, n in msg.get("faults") or []:
                if 0 <= fi < len(names):
                    self.stream.faults.setdefault(names[fi], []).append([off, n])
            self.stream.stats = msg.get("stats", {})

        return fetcher.run([str(self.gofer), "stream"], plan, self.store, progress=self.progress, on_message=seen)


def prune_logs(directory: Path, pattern: str, keep: int) -> list[Path]:
    """Remove the files matching `pattern` in `directory` but the `keep` newest (by mtime);
    one another stream removed first is fine. What was removed."""
    def mtime(p: Path) -> int:
        try:
            return p.stat().st_mtime_ns
        except FileNotFoundError:
            return 0
    logs = sorted(directory.glob(pattern), key=mtime, reverse=True)
    gone = []
    for p in logs[keep:]:
        try:
            p.unlink()
            gone.append(p)
        except FileNotFoundError:
            pass
    return gone


def build_plan(m: Manifest, partial: Path, sdir: Path, store: Store, sources: transfer.Sources,
               order: dict[str, list[list[int]]], *, on_bad_source, workers: int, timeout_s: float,
               sock: Path) -> tuple[dict, list[dict]]:
    """Create the runsc files of `m` in `partial` at full size, put in what is
    already on this node (all-zero chunks as holes, local copies, each checked),
    and plan the rest in fetch order, its GETs retried under `store`'s policy as
    a pull's are (go/internal/fetch/retry.go). (plan, the gofer's file list)."""
    rank = {name: i for i, name in enumerate(RUNSC_FILES)}
    files = sorted((f for f in m.files if f.name in RUNSC_FILES), key=lambda f: rank[f.name])
    zero_lengths = {m.chunking.max} | {f.chunks[-1].length for f in m.files if f.chunks}
    zeros = {chunk.zero_hash(n): n for n in zero_lengths}
    places: dict[str, list[tuple[int, int]]] = {}
    lengths: dict[str, int] = {}
    checks: dict[str, str] = {}
    fds: list[int] = []
    ready: list[list[int]] = []
    try:
        for i, f in enumerate(files):
            fd = os.open(partial / f.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)   # memory: owner-only
            fds.append(fd)
            os.ftruncate(fd, f.size)
            for off, c in f.placed():
                places.setdefault(c.hash, []).append((i, off))
                lengths[c.hash] = c.length
                if c.check:
                    checks[c.hash] = c.check
        remote: list[str] = []
        for h, n in lengths.items():
            if zeros.get(h) == n:
                ready += [[fi, off, n] for fi, off in places[h]]
                continue
            data = None
            for copy in sources(h):
                got = transfer.read_local(copy, n)
                if got is not None and chunk.sha256(got) == h:
                    data = got
                    break
                on_bad_source(copy.owner)
            if data is None:
                remote.append(h)
                continue
            for fi, off in places[h]:
                view = memoryview(data)
                at = off
                while view:
                    k = os.pwrite(fds[fi], view, at)
                    view, at = view[k:], at + k
                ready.append([fi, off, n])
    finally:
        for fd in fds:
            os.close(fd)
    learned = {name: (sorted((o, o + n, k) for k, (o, n) in enumerate(rs))) for name, rs in order.items()}

    def priority(h: str) -> tuple:
        best = None
        for fi, off in places[h]:
            name = files[fi].name
            if name in HEAD_FILES:
                key = (0, fi, off)
            else:
                k = _first_overlap(learned.get(name, []), off, off + lengths[h])
                key = (1, k, off) if k is not None else (2, fi, off)
            best = key if best is None or key < best else best
        return best

    remote.sort(key=priority)
    objects: list[dict] = []
    obj_index: dict[str, int] = {}

    def obj(pack: str) -> int:
        if pack not in obj_index:
            obj_index[pack] = len(objects)
            objects.append({"url": store.presign_get(pack), "name": store.pack_name(pack)})
        return obj_index[pack]

    chunks = []
    for h in remote:
        loc = m.locations[h]
        # An encrypting tenant's chunk (issue 13) carries its own AES-256-GCM key, in
        # hex, never the tenant's: thaw-gofer opens it before a byte is written or
        # served (go/internal/fetch/crypt.go), as thaw-fetch does for a pull.
        chunks.append([h, lengths[h], obj(loc.pack), loc.offset, loc.stored, loc.codec,
                       [[fi, off] for fi, off in places[h]], checks.get(h, "")]
                      + ([store.chunk_key(h).hex()] if m.encryption else []))
    plan = {"version": PLAN_VERSION, "workers": workers, "urgent_workers": URGENT_WORKERS,
            "retry": store.policy.plan(), "timeout_s": timeout_s, "range_bytes": RANGE_BYTES, "urgent_ahead_bytes": URGENT_AHEAD_BYTES,
            "files": [{"path": str(partial / f.name), "size": f.size} for f in files],
            "objects": objects, "chunks": chunks, "ready": ready, "listen": str(sock),
            "complete": str(sdir / COMPLETE)}
    gofer_files = [{"name": f.name, "path": str(sdir / f.name), "size": f.size, "pages": f.name == PAGES}
                   for f in files]
    return plan, gofer_files


def _first_overlap(ranges: list[tuple[int, int, int]], start: int, end: int) -> int | None:
    """The smallest recorded rank among `ranges` ((start, end, rank), sorted) overlapping [start, end)."""
    i = bisect.bisect_left(ranges, (start,)) - 1
    best = None
    for s, e, k in ranges[max(i, 0):]:
        if s >= end:
            break
        if e > start:
            best = k if best is None else min(best, k)
    return best


# -- the learned order -------------------------------------------------------------

def remove_leftovers(cache: Cache) -> list[str]:
    """Remove image directories of streams whose process is gone (their hard
    links would keep evicted entries' space). What was removed."""
    root = cache.root / STREAMS_DIR
    removed = []
    if not root.is_dir():
        return removed
    for p in root.iterdir():
        tail = p.name.rsplit(".", 1)[-1]
        pid, _, start = tail.partition("-")
        if pid.isdigit() and start.isdigit() and Owner(int(pid), start).alive():
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(str(p))
    return removed
