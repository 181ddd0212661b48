"""What thaw does with checkpoint images across the store and the node cache:
checkpoint-and-publish, push, pull, list, verify. Each function is one CLI
command's or thawd's work; the modules below do the parts.

    publish_staged: an image written straight into a cache partial (`staged`:
          `runsc checkpoint --image-path` points there) -> chunk (thaw-chunk:
          SHA-256 + BLAKE3, the one pass that hashes) -> upload missing chunks
          in packs (read, encoded, not hashed again) -> publish the manifest
          (If-None-Match: first writer wins) -> under the key's lock, the
          partial becomes the cache entry by rename. Written once, hashed once.
    push: `thaw push DIR`: DIR (the user's, e.g. `thaw checkpoint --out`) is
          copied into a staged partial, then publish_staged; with --no-cache
          it is published in place and nothing is cached.
    pull: under the key's lock: a ready, compatible, intact cache entry -> lease;
          else the store's manifest for this node's tuple -> reserve space ->
          fill (local chunks, then parallel GETs) -> install -> lease

With a tenant's view of the store (Store.for_tenant, issue 13), a key must
start with "<tenant>.", manifests are signed with the cluster's manifest key
(when configured) and sealed with the tenant's key (when it encrypts), and
are refused on the way in unless they verify and were written for this very
tenant, key and tuple; local copies of chunks come only from the same
tenant's cache entries.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from control import metrics
from control.images import chunk
from control.images import manifest as manifestmod
from control.images import transfer
from control.images.cache import Cache, Lease
from control.node.compat import CompatTuple, check
from control.config import Settings
from control.errors import (CacheFull, ImageError, KeyMissing, ManifestError, ManifestRefused, NoSpace, NotFound,
                            StoreError, ThawError, TupleMismatch, UserError)
from control.files import fsync_path
from control.images import keys as keysmod
from control.images.manifest import Manifest
from control.images.store import Store
from control.images.transfer import Progress
from control.logfields import fields

log = logging.getLogger(__name__)


def open_cache(settings: Settings) -> Cache:
    return Cache(settings.cache_dir, settings.cache_budget_bytes, settings.cache_lock_timeout_s,
                 settings.cache_verify, settings.cache_direct_io)


@dataclass
class PullResult:
    lease: Lease
    hit: bool
    manifest_size: int
    fill: transfer.FillStats | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"key": self.lease.entry.key, "path": str(self.lease.path), "hit": self.hit,
                "size": self.manifest_size, "tuple_hash": self.lease.entry.tuple.hash(),
                "fill": self.fill.to_dict() if self.fill else None, "notes": self.notes}


def remote_manifest(store: Store, key: str, node: CompatTuple, reasons: list[str] | None = None) -> Manifest:
    """The store's manifest of `key` that `node` can restore.

    Tries the node's exact tuple first, then every other tuple stored under the
    key (a CPU-feature superset also restores). NotFound if there is none,
    TupleMismatch (every reason) if none fits, ManifestError if the only
    candidates are invalid.
    """
    reasons = list(reasons or [])
    invalid: list[ManifestError] = []
    check_tenant(store, key)
    exact = store.get_manifest(key, node.hash())
    if exact is not None:
        m = _checked(exact, store.manifest_name(key, node.hash()), key, store)
        if not check(m.tuple, node):
            return m
    for k, th, _size in store.list_manifests(key):
        if k != key or th == node.hash():
            continue
        body = store.get_manifest(key, th)
        if body is None:
            continue
        try:
            m = _checked(body, store.manifest_name(key, th), key, store)
        except ManifestError as e:
            invalid.append(e)
            continue
        bad = check(m.tuple, node)
        if not bad:
            return m
        reasons.append(f"stored {th[:12]}: " + "; ".join(map(str, bad)))
    if reasons:
        raise TupleMismatch(key, reasons + [str(e) for e in invalid])
    if invalid:
        raise invalid[0]
    raise NotFound("image", key, "not in this node's cache and not in the store")


def check_tenant(store: Store, key: str) -> None:
    tenant = getattr(store, "tenant", "")
    if tenant and not key.startswith(tenant + "."):
        raise UserError(f"key {key!r} is not tenant {tenant!r}'s: its keys start with {tenant + '.'!r}", field="key")


def _checked(body: bytes, source: str, key: str, store: Store | None = None) -> Manifest:
    """A manifest read from the store, refused (ManifestRefused) unless it opens
    with the tenant's key (when it encrypts), carries a valid tag (when the
    cluster has a manifest key) and was written for this tenant, key and tuple."""
    tenant = getattr(store, "tenant", "")
    tenant_key = getattr(store, "tenant_key", None)
    manifest_key = getattr(store, "manifest_key", None)
    tuple_hash = source.rsplit("/", 1)[-1].removesuffix(".json")
    if keysmod.is_sealed_manifest(body):
        if tenant_key is None:
            raise KeyMissing(tenant or "(none)", "this node's keys (the manifest is encrypted; store.encrypt is off "
                             "or the tenant has no key)")
        try:
            body = keysmod.open_manifest(tenant_key, tenant, key, tuple_hash, body)
        except ValueError as e:
            raise ManifestRefused(source, str(e)) from None
    elif tenant_key is not None:
        raise ManifestRefused(source, "it is not encrypted, but this tenant's images are (store.encrypt): "
                              "written by someone without the tenant's key, or before encryption was on")
    if manifest_key is not None:
        manifestmod.verify(body, manifest_key, source)
    m = manifestmod.parse(body, source)
    if m.key != key:
        raise ManifestError("key", f"is {m.key!r}, but the manifest is stored under {key!r}", source)
    if not source.endswith(f"/{m.tuple_hash}.json"):
        raise ManifestError("tuple_hash", f"{m.tuple_hash} does not match the object name", source)
    if tenant and m.tenant != tenant:
        raise ManifestRefused(source, f"it names tenant {m.tenant or '(none)'!r}, but it is stored under tenant "
                              f"{tenant!r}")
    if m.encryption != getattr(store, "encryption", ""):
        raise ManifestRefused(source, f"its chunks are sealed as {m.encryption or 'plaintext'!r}, this store's as "
                              f"{getattr(store, 'encryption', '') or 'plaintext'!r}")
    return m


def read_manifest(store: Store, key: str, tuple_hash: str) -> Manifest | None:
    """The store's manifest of `key` for `tuple_hash`, opened and verified as a pull
    would (ManifestError, ManifestRefused, KeyMissing); None when there is none."""
    body = store.get_manifest(key, tuple_hash)
    return None if body is None else _checked(body, store.manifest_name(key, tuple_hash), key, store)


def _published_body(store: Store, m: Manifest) -> bytes:
    """A manifest as it goes to the store: signed, then sealed, as the tenant's settings say."""
    body = m.to_json()
    if getattr(store, "manifest_key", None) is not None:
        body = manifestmod.sign(body, store.manifest_key)
    if getattr(store, "tenant_key", None) is not None:
        body = keysmod.seal_manifest(store.tenant_key, store.tenant, m.key, m.tuple_hash, body)
    return body


def _tenant(store: Store | None) -> str:
    return getattr(store, "tenant", "") if store is not None else ""


def pull(cache: Cache, store: Store | None, key: str, node: CompatTuple, *, workers: int,
         progress: Progress | None = None, on_total=None, fresh_s: float = 0.0) -> PullResult:
    """A leased cache entry of `key` for this node, fetched if need be. Release the lease
    (`result.lease.release()`, or use it as a context manager) once runsc is done.
    `fresh_s` (`thaw pull`: cache.scrub_interval_s): a cached entry whose chunks were not
    all hashed within that long is hashed now before it is called ready (issue 30: the
    cheap check alone called an entry with bytes flipped and its mtime put back ready)."""
    manifestmod.validate_key(key)
    if store is not None:
        check_tenant(store, key)
    notes: list[str] = []
    with cache.key_lock(key):
        notes += [f"recovered: removed {p}" for p in cache.recover_locked(key)]
        entry, reasons = cache.find_locked(key, node)
        if entry is not None:
            why = cache.check_entry(entry)
            if why is None and fresh_s and entry.verified < time.time() - fresh_s:
                why = cache.check_entry(entry, full=True)
                if why is None:
                    cache.mark_verified(entry.id)
                    notes.append(f"re-hashed cached entry {entry.id} (last checked "
                                 f"{'never' if not entry.verified else f'{time.time() - entry.verified:.0f} s ago'})")
            if why is None:
                lease = cache.lease(entry.id, hit=True)
                if lease is not None:
                    if on_total:
                        on_total(entry.size)
                    return PullResult(lease, True, entry.size, notes=notes)
            else:
                notes.append(f"cached entry {entry.id} is corrupt ({why}): refetching")
                cache.mark_corrupt(entry.id)
        if store is None:
            raise TupleMismatch(key, reasons) if reasons else NotFound("image", key, "not in this node's cache")
        m = remote_manifest(store, key, node, reasons)
        if on_total:
            on_total(m.size)
        entry_id, stats = _fill_and_install(cache, store, m,
                                            cache.sources(m.unique_chunks(), tenant=_tenant(store)),
                                            workers=workers, progress=progress)
        metrics.inc("thaw_store_fetched_bytes_total", stats.fetched_bytes)
        metrics.inc("thaw_store_retries_total", stats.retries)
        for e in cache.entries(key):
            if e.state == "corrupt" and cache.evict(e.id):
                notes.append(f"evicted corrupt entry {e.id}")
        lease = cache.lease(entry_id)
        assert lease is not None, "a just-installed entry is ready"
        return PullResult(lease, False, m.size, stats, notes)


def _fill_and_install(cache: Cache, store: Store | None, m: Manifest, sources: transfer.Sources, *,
                      workers: int, progress: Progress | None) -> tuple[str, transfer.FillStats]:
    """Precondition: the key's lock is held."""
    rid = cache.reserve(m.key, m.size)
    try:
        entry_id, partial = cache.new_partial(m.key, m.tuple_hash)
        try:
            stats = transfer.fill(m, partial, store, sources, workers=workers, progress=progress,
                                  on_bad_source=cache.mark_corrupt, direct_io=cache.direct_io)
            cache.install_locked(entry_id, partial, m)
        except BaseException as e:
            shutil.rmtree(partial, ignore_errors=True)
            full = no_space(cache, m, e)
            if full is not None:  # either engine: one clear error, and no half entry (removed above)
                raise full from None
            raise
    finally:
        cache.unreserve(rid)
    return entry_id, stats


def no_space(cache: Cache, m: Manifest | None, e: BaseException) -> NoSpace | None:
    """What a fill of the cache that failed with `e` says when `e` is a full file
    system (ENOSPC, EDQUOT): NoSpace naming the cache and the image (exit 4), as
    a pull and a stream (control/images/stream.py) both report it; else None."""
    if not _no_space(e):
        return None
    what = f" for image {m.key!r} ({m.size} bytes)" if m is not None else ""
    return NoSpace(f"no space left in the cache file system {cache.root}{what}; free space or lower "
                   "cache.budget_bytes", path=str(cache.root), key=m.key if m else "", need=m.size if m else 0)


def _no_space(e: BaseException) -> bool:
    """ENOSPC/EDQUOT from this process's own writes (local copies: an OSError, maybe wrapped by a
    worker) or from thaw-fetch or thaw-gofer (their write error's text)."""
    import errno
    for x in (e, e.__cause__, e.__context__):
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
    return isinstance(e, ThawError) and any(t in str(e).lower() for t in ("no space left on device",
                                                                          "disk quota exceeded"))


@dataclass
class PushResult:
    key: str
    tuple_hash: str
    size: int
    published: bool               # False: another writer's manifest was there first
    manifest_creator: dict
    upload: transfer.UploadStats
    installed: str | None         # the local entry now holding the store's manifest
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"key": self.key, "tuple_hash": self.tuple_hash, "size": self.size, "published": self.published,
                "manifest_creator": self.manifest_creator, "upload": self.upload.to_dict(),
                "installed": self.installed, "notes": self.notes}


@dataclass
class Staged:
    """A cache partial that a new image of `key` is being written into."""
    key: str
    node: CompatTuple
    entry_id: str
    path: Path
    installed: bool = False


@contextmanager
def staged(cache: Cache, key: str, node: CompatTuple) -> Iterator[Staged]:
    """A new partial directory in the cache for an image of `key` on this node:
    write the image there (`runsc checkpoint --image-path`), then
    `publish_staged`. Until then it is invisible to pulls; it is named with
    this process, so recovery leaves it alone while this process lives and
    reclaims it after a kill -9. Whatever was not installed by the end of the
    block is removed."""
    manifestmod.validate_key(key)
    eid, path = cache.new_partial(key, node.hash())
    st = Staged(key, node, eid, path)
    try:
        yield st
    finally:
        if not st.installed:
            shutil.rmtree(path, ignore_errors=True)


def publish_staged(cache: Cache, store: Store, st: Staged, *, chunker: Path, avg_chunk: int, workers: int,
                   progress: Progress | None = None, on_total=None) -> PushResult:
    """Publish the image written into `st` under its key for its node, then
    make it the cache entry by rename (ours won, or the store holds the same
    files); if another writer's different image won, that one is fetched
    into the cache instead and ours is dropped."""
    ours, up, won, final = _publish(store, st.path, st.key, st.node, chunker=chunker, avg_chunk=avg_chunk,
                                    workers=workers, progress=progress, on_total=on_total)
    notes: list[str] = []
    installed = None
    try:
        installed = _install(cache, store, st, ours, final, workers)
    except CacheFull as e:
        # The image is published; only this node's copy is missing. A later pull
        # fetches it when there is room.
        notes.append(f"not cached: {e}")
    return PushResult(st.key, final.tuple_hash, final.size, won, final.creator, up, installed, notes)


def push(cache: Cache | None, store: Store, directory: Path, key: str, node: CompatTuple, *,
         chunker: Path, avg_chunk: int, workers: int, progress: Progress | None = None,
         on_total=None) -> PushResult:
    """Publish the image directory `directory` under `key` for `node`'s tuple
    (`thaw push DIR`). With a cache, DIR is copied into a staged entry first:
    the copy is what is chunked, published and installed by rename, so what is
    cached is exactly what was published even if DIR changes later. Without
    one, DIR is published in place (its files must not change meanwhile:
    checked)."""
    if cache is None:
        manifestmod.validate_key(key)
        ours, up, won, final = _publish(store, directory, key, node, chunker=chunker, avg_chunk=avg_chunk,
                                        workers=workers, progress=progress, on_total=on_total)
        return PushResult(key, final.tuple_hash, final.size, won, final.creator, up, None)
    files = chunk.image_files(directory)   # refuse a bad directory by its own name, before copying
    with staged(cache, key, node) as st:
        before = chunk.file_state(files)
        for f in files:
            _copy_file(f, st.path / f.name)
        if chunk.file_state(files) != before:
            raise ImageError(str(directory), "files changed while being copied into the cache")
        return publish_staged(cache, store, st, chunker=chunker, avg_chunk=avg_chunk, workers=workers,
                              progress=progress, on_total=on_total)


def _copy_file(src: Path, dst: Path) -> None:
    """Copy in the kernel (copy_file_range: a reflink where the file system
    shares extents, no user-space buffer elsewhere)."""
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        n = os.fstat(fi.fileno()).st_size
        done = 0
        try:
            while done < n:
                k = os.copy_file_range(fi.fileno(), fo.fileno(), n - done)
                if k == 0:
                    break
                done += k
        except OSError:   # e.g. EXDEV or EINVAL on older kernels and some file systems
            fi.seek(done)
            fo.seek(done)
            shutil.copyfileobj(fi, fo, 16 << 20)
            done = fo.tell()
        if done != n:
            raise ImageError(str(src), f"copied {done} of {n} bytes: the file changed while being copied")


def _publish(store: Store, directory: Path, key: str, node: CompatTuple, *, chunker: Path, avg_chunk: int,
             workers: int, progress: Progress | None,
             on_total) -> tuple[Manifest, transfer.UploadStats, bool, Manifest]:
    """Chunk, upload and publish `directory`: (our manifest, upload stats,
    whether ours won, the manifest the store now holds)."""
    check_tenant(store, key)
    files = chunk.image_files(directory)
    before = chunk.file_state(files)
    layout = chunk.chunk_image(directory, key, node, chunker, avg_chunk)
    if on_total:
        on_total(sum(layout.unique_chunks().values()))   # what the upload progress counts
    store.ensure_bucket()
    probed = time.monotonic()   # the upload's first pointer probe: where it may learn an old pack's name
    locations, up = transfer.upload(layout, directory, store, workers=workers, progress=progress)
    # The upload trusted thaw-chunk's names; this is what makes that safe.
    if chunk.file_state(files) != before:
        raise ImageError(str(directory), "files changed while being published (nothing was published)")
    check_publish_time(store, store.manifest_name(key, layout.tuple_hash), time.monotonic() - probed)
    m = dataclasses.replace(layout, locations=locations, tenant=_tenant(store),
                            encryption=getattr(store, "encryption", ""))
    won = store.put_manifest_if_absent(key, m.tuple_hash, _published_body(store, m))
    final = m
    if not won:
        body = store.get_manifest(key, m.tuple_hash)
        if body is None:
            raise NotFound("manifest", store.manifest_name(key, m.tuple_hash),
                           "the conditional put lost, but the winner's manifest is not readable")
        final = _checked(body, store.manifest_name(key, m.tuple_hash), key, store)
        log.info("push %s: another writer published first (%s)", key, final.creator,
                 extra=fields(key=key, tenant=_tenant(store) or None, reason="lost the publish race"))
    return m, up, won, final


def check_publish_time(store: Store, manifest: str, seconds: float) -> None:
    """A publish may put its manifest only within store.gc_grace_s of its first pointer
    probe: a store GC deletes a pack no sooner than that long after its last pointer
    went (control/images/gc.py), so a pack this publish learned from a pointer still
    exists now. StoreError (nothing published) past it; a store without a grace (the
    unit tests' fake) has no bound."""
    grace = getattr(store, "gc_grace_s", None)
    if grace is not None and seconds >= grace:
        raise StoreError("publish", store.uri(manifest), f"the upload took {seconds:.0f} s, at least "
                         f"store.gc_grace_s ({grace:g} s): a store GC may have removed a pack it reuses; nothing "
                         "was published (raise store.gc_grace_s on every node, or publish again)", store.endpoint)


def _install(cache: Cache, store: Store, st: Staged, ours: Manifest, final: Manifest, workers: int) -> str:
    """Make the cache hold `final` (the store's manifest) for st's key and tuple.
    CacheFull if there is no room."""
    for f in ours.files:
        fsync_path(st.path / f.name)   # runsc does not fsync; durable before the rename makes an entry
    with cache.key_lock(final.key):
        cache.recover_locked(final.key)
        for e in cache.entries(final.key):
            if e.tuple.hash() != final.tuple_hash or e.state != "ready":
                continue
            if cache.manifest_of(e).files == final.files:
                return e.id
            # A different image under the same key and tuple (e.g. this node lost a
            # publishing race earlier): the store's manifest is the truth.
            cache.mark_corrupt(e.id)
        if final.files == ours.files:
            rid = cache.reserve(final.key, final.size)
            try:
                cache.install_locked(st.entry_id, st.path, final)
                st.installed = True
            finally:
                cache.unreserve(rid)
            entry_id = st.entry_id
        else:
            # Another node's image won the race: ours is dropped (`staged` removes
            # it) and the winner's is fetched as a pull would fetch it.
            entry_id, _ = _fill_and_install(cache, store, final,
                                            cache.sources(final.unique_chunks(), tenant=_tenant(store)),
                                            workers=workers, progress=None)
        for e in cache.entries(final.key):
            if e.state == "corrupt":
                cache.evict(e.id)
        return entry_id


def listing(cache: Cache, store: Store | None, node: CompatTuple) -> dict:
    """Local entries and stored manifests, each with size, age, tenant and whether this
    node can restore it (and why not); local ones also when they were last used and
    who holds them (leases)."""
    from control.lifecycle.tenant import store_tenant
    now = time.time()
    local = []
    for e in cache.entries():
        bad = check(e.tuple, node)
        local.append({**e.to_dict(), "match": not bad, "reasons": [str(b) for b in bad],
                      "tenant": store_tenant(e.key), "age_s": round(now - e.created),
                      "last_used_s": round(now - e.last_used),
                      "held_by": cache.lease_holders(e.id) if e.leases else []})
    remote: list[dict] = []
    out: dict = {"node_tuple_hash": node.hash(), "local": local, "remote": remote,
                 "cache_used_bytes": cache.used_bytes(), "cache_budget_bytes": cache.budget}
    if store is None:
        return out
    published: dict[tuple[str, str], float] = {}
    if hasattr(store, "list_objects"):   # the store's LastModified: when each image was published
        for o in store.list_objects("manifests/"):
            k, _, leaf = o.name[len("manifests/"):].partition("/")
            if leaf.endswith(".json"):
                published[(k, leaf[:-len(".json")])] = o.mtime
    for key, th, nbytes in store.list_manifests():
        row: dict = {"key": key, "tuple_hash": th, "manifest_bytes": nbytes, "tenant": store_tenant(key)}
        if (key, th) in published:
            row["age_s"] = round(now - published[(key, th)])
        try:
            body = store.get_manifest(key, th)   # bounded: ManifestError past MAX_MANIFEST_BYTES
            m = _checked(body or b"", store.manifest_name(key, th), key, store)
        except (ManifestError, ManifestRefused, KeyMissing) as e:
            # One bad manifest is that image's problem, not the listing's (issue 30).
            log.warning("skipping manifest %s: %s", store.manifest_name(key, th), e)
            row.update(match=False, valid=False, reasons=[str(e)])
        else:
            bad = check(m.tuple, node)
            row.update(valid=True, size=m.size, match=not bad, reasons=[str(b) for b in bad],
                       creator=m.creator, chunks=len(m.unique_chunks()))
        remote.append(row)
    return out


def verify(cache: Cache, key: str | None = None) -> list[dict]:
    """Re-hash every chunk of every entry (of `key`); corrupt ones are marked and
    evicted unless leased (the next pull refetches them)."""
    out = []
    for e in cache.entries(key):
        if e.state == "evicting":
            continue
        why = cache.check_entry(e, full=True)
        row = {"id": e.id, "key": e.key, "size": e.size, "ok": why is None, "problem": why, "evicted": False}
        if why is None:
            cache.mark_verified(e.id)
        else:
            cache.mark_corrupt(e.id)
            row["evicted"] = cache.evict(e.id)
        out.append(row)
    return out
