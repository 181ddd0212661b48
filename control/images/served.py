"""A cache entry restored through thaw-gofer, every chunk checked as runsc reads it (issue 30).

runsc restoring from an entry's own files reads whatever is on disk: a byte
changed after the install (bit rot, a write with its mtime put back) restored
altered memory with exit 0, and the entry stayed "ready". With
`cache.verify = read` (the default) a restore from the cache goes the way a
streamed restore does (control/images/stream.py): the image directory runsc
gets is a *view* of the entry, <cache>/views/<entry>.<rand>.<pid>-<start>/,
holding

  - gcs_opts.json, which makes runsc start its checkpoint-gofer (thaw-gofer,
    through GVISOR_SIDECAR_BINARIES_DIR set for that one `runsc restore`) in
    verify mode: it serves the entry's checkpoint.img, pages_meta.img and
    pages.img and hashes each chunk the entry's manifest names the first time a
    read touches it, failing the read (EIO) when it does not match
    (go/internal/stream/verify.go);
  - symbolic links to the entry's files (thaw.json for the spec; a hard link
    would change the files' ctime, which the cache's cheap check compares);
  - corrupt.json once thaw-gofer found an altered chunk (cache.CORRUPT_REPORT).

So an altered byte fails the sentry's read, runsc fails the restore (or kills
a sandbox whose pages still load in the background), and `verdict()` turns the
report into IntegrityError("cache", ...): the entry is marked corrupt (never
served again; the next use fetches it, copying the chunks that still hash
right) and evicted once no restore holds it. No pass over the image happens
before runsc starts: each byte is hashed as it is read, once.

A `Served` is what thawd's image source and `thaw restore --from-store` hand
to the restore, as a Stream is: `path`, `env()`, `hit`, `verdict()`,
`release()`.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from pathlib import Path

from control.config import Settings
from control.errors import IntegrityError
from control.files import Owner, write_bytes_atomic
from control.images import stream as streammod
from control.images.cache import CORRUPT_REPORT, MANIFEST_FILE, VIEWS_DIR, Cache, Lease

log = logging.getLogger(__name__)

# A local entry has no late bytes: the deadline only bounds a read that hangs on the disk.
DEADLINE_S = 60.0


def read_shape() -> tuple[int, int]:
    """What the gofer offers the sentry on this node (reads in flight, bytes per read):
    control/node/hugepages.py gofer_read_shape, from the host's THP settings and CPUs."""
    from control.node import hugepages
    return hugepages.gofer_read_shape(hugepages.host_huge_pages(), len(os.sched_getaffinity(0)))


class Served:
    """A leased cache entry as runsc restores it: through thaw-gofer, every chunk checked
    (a Restorable: control/images/source.py; its `source` is the entry, `path` the view)."""
    streamed = False
    checked = True

    def __init__(self, cache: Cache, lease: Lease, path: Path, sidecar_dir: Path) -> None:
        self.cache = cache
        self.lease = lease
        self.entry = lease.entry
        self.path = path
        self.source = self.entry.path
        self.sidecar_dir = sidecar_dir
        self.hit = lease.hit
        self._error: IntegrityError | None = None
        self._released = False

    def env(self) -> dict[str, str]:
        return {streammod.SIDECAR_ENV: str(self.sidecar_dir)}

    def verdict(self, wait_s: float = 0.0) -> IntegrityError | None:
        """IntegrityError when thaw-gofer found an altered chunk (the restore's reason);
        the entry is then marked corrupt. None when it found none (so far). The gofer
        writes its report before it fails the read, so there is nothing to wait for."""
        if self._error is None:
            r = _report(self.path)
            if r is not None:
                chunk_name, where = r
                self._error = IntegrityError("cache", chunk_name[:16], f"{where} of cache entry {self.entry.id} do "
                                             "not hash to this chunk's name (altered on disk); the entry is marked "
                                             "corrupt and fetched again on its next use")
                self.cache.mark_corrupt(self.entry.id)
        return self._error

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def describe(self, holder: str) -> None:
        self.lease.describe(holder)

    def release(self) -> None:
        """The restore is done with the files (or gone): the lease goes, and a corrupt
        entry is evicted unless another restore still holds it."""
        if self._released:
            return
        self._released = True
        bad = self.verdict()
        self.lease.release()
        shutil.rmtree(self.path, ignore_errors=True)
        if bad is not None and self.cache.evict(self.entry.id):
            log.warning("evicted corrupt cache entry %s", self.entry.id)

    def to_dict(self) -> dict:
        return {"entry": self.entry.id, "path": str(self.path), "verified_reads": True,
                "error": str(self._error) if self._error else None}


class ServedDirectory:
    """`thaw restore DIR` of a directory holding a thaw manifest (a cache entry `thaw pull`
    printed, or a copy of one): read through thaw-gofer, every chunk checked, as a cache hit.
    No lease: DIR is the user's to keep in place. An altered chunk is IntegrityError; when DIR
    is an entry of `cache`, that entry is marked corrupt too."""
    streamed = False
    checked = True
    hit = True

    def __init__(self, image: Path, path: Path, sidecar_dir: Path, cache: Cache | None) -> None:
        self.image = self.source = image
        self.path = path
        self.sidecar_dir = sidecar_dir
        self.cache = cache
        self._error: IntegrityError | None = None

    def env(self) -> dict[str, str]:
        return {streammod.SIDECAR_ENV: str(self.sidecar_dir)}

    def verdict(self, wait_s: float = 0.0) -> IntegrityError | None:
        if self._error is None:
            r = _report(self.path)
            if r is not None:
                entry = self.cache is not None and self.image.parent == self.cache.root / "entries"
                self._error = IntegrityError("image", r[0][:16], f"{r[1]} of {self.image} do not hash to this "
                                             "chunk's name (altered on disk)"
                                             + ("; the cache entry is marked corrupt" if entry else ""))
                if entry:
                    self.cache.mark_corrupt(self.image.name)
        return self._error

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def to_dict(self) -> dict:
        return {"image": str(self.image), "path": str(self.path), "verified_reads": True,
                "error": str(self._error) if self._error else None}

    def describe(self, holder: str) -> None:
        pass   # nothing is leased

    def release(self) -> None:
        self.verdict()
        shutil.rmtree(self.path, ignore_errors=True)


def for_directory(settings: Settings, image: Path, cache: Cache | None = None) -> ServedDirectory | None:
    """A view of image directory `image` read through thaw-gofer when it holds a thaw manifest
    and cache.verify = read; None otherwise (runsc reads it directly, unchecked: nothing names
    its chunks). The view lives under the state directory, named with this process."""
    manifest = image / MANIFEST_FILE
    if not usable(settings) or not manifest.is_file():
        return None
    from control.images import manifest as manifestmod
    m = manifestmod.parse(manifest.read_bytes(), str(manifest))
    me = Owner.me()
    root = settings.state_dir / VIEWS_DIR
    root.mkdir(parents=True, mode=0o700, exist_ok=True)
    for p in root.iterdir():   # views of restores that died
        pid, _, start = p.name.rsplit(".", 1)[-1].partition("-")
        if not (pid.isdigit() and start.isdigit() and Owner(int(pid), start).alive()):
            shutil.rmtree(p, ignore_errors=True)
    view = root / f"dir.{secrets.token_hex(4)}.{me.pid}-{me.start}"
    view.mkdir(mode=0o700)
    try:
        for f in m.files:
            os.symlink(image.resolve() / f.name, view / f.name)
        if (image / "thaw.json").is_file() and not any(f.name == "thaw.json" for f in m.files):
            os.symlink(image.resolve() / "thaw.json", view / "thaw.json")
        write_view(view, [(f.name, image.resolve() / f.name, f.size) for f in m.files], manifest.resolve())
        return ServedDirectory(image, view, streammod.sidecar_dir(settings), cache)
    except BaseException:
        shutil.rmtree(view, ignore_errors=True)
        raise


def _report(view: Path) -> tuple[str, str] | None:
    """thaw-gofer's report in `view`: (the chunk's name, which bytes of which file)."""
    p = view / CORRUPT_REPORT
    try:
        r = json.loads(p.read_bytes()[:4096])
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "?", f"an altered chunk ({p} unreadable)"
    if not isinstance(r, dict):
        return "?", f"an altered chunk ({p})"
    return str(r.get("chunk")), f"{r.get('file')} bytes {r.get('offset')}+{r.get('length')}"


def usable(settings: Settings) -> bool:
    """Whether restores from the cache go through thaw-gofer here (cache.verify = read, the gofer installed)."""
    return settings.cache_verify == "read" and Path(settings.store_gofer).is_file()


def for_restore(cache: Cache, settings: Settings, lease: Lease) -> Served | Lease:
    """What a restore from leased entry `lease` reads: a Served view with cache.verify = read
    (the default). Without thaw-gofer at store.gofer every chunk is hashed first instead
    (the safe default stays safe; logged), and a corrupt entry raises IntegrityError
    (released, marked corrupt). With cache.verify = stat or full: the lease itself."""
    if settings.cache_verify != "read":
        return lease
    if not Path(settings.store_gofer).is_file():
        log.warning("thaw-gofer is not at %s (store.gofer): hashing all of %s before restoring it",
                    settings.store_gofer, lease.entry.id)
        why = cache.check_entry(lease.entry, full=True)
        if why is not None:
            lease.release()
            cache.mark_corrupt(lease.entry.id)
            raise IntegrityError("cache", lease.entry.id, why)
        cache.mark_verified(lease.entry.id)
        return lease
    try:
        return serve(cache, settings, lease)
    except BaseException:
        lease.release()
        raise


def serve(cache: Cache, settings: Settings, lease: Lease) -> Served:
    """A view of the leased entry for runsc (the module docstring says what it holds)."""
    remove_leftovers(cache)
    e = lease.entry
    m = cache.manifest_of(e)
    me = Owner.me()
    root = cache.root / VIEWS_DIR
    root.mkdir(mode=0o700, exist_ok=True)
    view = root / f"{e.id}.{secrets.token_hex(4)}.{me.pid}-{me.start}"
    view.mkdir(mode=0o700)
    try:
        for f in m.files:
            os.symlink(e.path / f.name, view / f.name)
        write_view(view, [(f.name, e.path / f.name, f.size) for f in m.files], e.path / MANIFEST_FILE)
        return Served(cache, lease, view, streammod.sidecar_dir(settings))
    except BaseException:
        shutil.rmtree(view, ignore_errors=True)
        raise


def write_view(view: Path, files: list[tuple[str, Path, int]], manifest: Path) -> None:
    """Write gcs_opts.json into `view`: thaw-gofer in verify mode serving `files` (name,
    path, size; runsc's files among them), each chunk checked against `manifest` (a
    manifest's files[].chunks, go/internal/stream/verify.go), reporting to CORRUPT_REPORT.
    Twin: bench/gpu/verified.py `view` (the same for an image outside the cache, on a GPU
    machine without thaw's dependencies)."""
    served = [{"name": name, "path": str(path), "size": size, "pages": name == streammod.PAGES}
              for name, path, size in files if name in streammod.RUNSC_FILES]
    parallel, read_bytes = read_shape()
    cfg = {"version": streammod.GOFER_CONFIG_VERSION, "socket": "", "complete": "", "files": served,
           "deadline_s": DEADLINE_S, "boost_s": 0.0, "max_parallel": parallel,
           "max_read_bytes": read_bytes, "log": "", "verify": str(manifest), "corrupt": str(view / CORRUPT_REPORT)}
    write_bytes_atomic(view / streammod.GOFER_CONFIG, json.dumps(cfg).encode(), mode=0o600)


def remove_leftovers(cache: Cache) -> list[str]:
    """Remove views whose process is gone (a restore killed before it released its view)."""
    root = cache.root / VIEWS_DIR
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for p in root.iterdir():
        pid, _, start = p.name.rsplit(".", 1)[-1].partition("-")
        if pid.isdigit() and start.isdigit() and Owner(int(pid), start).alive():
            continue
        if (p / CORRUPT_REPORT).exists():   # what a killed restore learned still counts
            eid = p.name.rsplit(".", 2)[0]   # <entry id>.<rand>.<pid>-<start>; ids hold dots
            cache.mark_corrupt(eid)
            log.warning("cache entry %s: a restore killed meanwhile found it altered (%s)", eid, _report(p)[1])
        shutil.rmtree(p, ignore_errors=True)
        removed.append(str(p))
    return removed
