"""What thaw does with checkpoint images across the store and the node cache:
push, pull, list, verify. Each function is one CLI command's work (and
thawd's, later); the modules below do the parts.

    push: pack (chunk + hash) -> upload missing chunks -> publish the manifest
          (If-None-Match: first writer wins) -> install the winner's manifest
          into the local cache (chunks copied from the pushed directory)
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
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from control.images import manifest as manifestmod
from control.images import chunk as pack
from control.images import transfer
from control.images.cache import Cache, Lease
from control.node.compat import CompatTuple, check
from control.config import Settings
from control.errors import KeyMissing, ManifestError, ManifestRefused, NotFound, TupleMismatch, UserError
from control.images import keys as keysmod
from control.images.manifest import Manifest
from control.images.store import Store
from control.images.transfer import Progress

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
    _check_tenant(store, key)
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


def _check_tenant(store: Store, key: str) -> None:
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


def _published_body(store: Store, m: Manifest) -> bytes:
    """A manifest as it goes to the store: signed, then sealed, as the tenant's settings say."""
    body = m.to_json()
    if getattr(store, "manifest_key", None) is not None:
        body = manifestmod.sign(body, store.manifest_key)
    if getattr(store, "tenant_key", None) is not None:
        body = keysmod.seal_manifest(store.tenant_key, store.tenant, m.key, m.tuple_hash, body)
    return body


def pull(cache: Cache, store: Store | None, key: str, node: CompatTuple, *, workers: int,
         progress: Progress | None = None, on_total=None) -> PullResult:
    """A leased cache entry of `key` for this node, fetched if need be. Release the lease
    (`result.lease.release()`, or use it as a context manager) once runsc is done."""
    manifestmod.validate_key(key)
    if store is not None:
        _check_tenant(store, key)
    notes: list[str] = []
    with cache.key_lock(key):
        notes += [f"recovered: removed {p}" for p in cache.recover_locked(key)]
        entry, reasons = cache.find_locked(key, node)
        if entry is not None:
            why = cache.check_entry(entry)
            if why is None:
                lease = cache.lease(entry.id)
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
        entry_id, stats = _fill_and_install(cache, store, m, cache.sources(m.unique_chunks(), tenant=_tenant(store)),
                                            workers=workers, progress=progress)
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
        entry_id, partial = cache.new_partial(m)
        try:
            def bad(owner: str) -> None:
                if owner != "source":
                    cache.mark_corrupt(owner)
            stats = transfer.fill(m, partial, store, sources, workers=workers, progress=progress,
                                  on_bad_source=bad, direct_io=cache.direct_io)
            cache.install_locked(entry_id, partial, m)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    finally:
        cache.unreserve(rid)
    return entry_id, stats


@dataclass
class PushResult:
    key: str
    tuple_hash: str
    size: int
    published: bool               # False: another writer's manifest was there first
    manifest_creator: dict
    upload: transfer.UploadStats
    installed: str | None         # the local entry now holding the store's manifest

    def to_dict(self) -> dict:
        return {"key": self.key, "tuple_hash": self.tuple_hash, "size": self.size, "published": self.published,
                "manifest_creator": self.manifest_creator, "upload": self.upload.to_dict(),
                "installed": self.installed}


def push(cache: Cache | None, store: Store, directory: Path, key: str, node: CompatTuple, *,
         chunker: Path, avg_chunk: int, workers: int, progress: Progress | None = None,
         on_total=None) -> PushResult:
    """Publish an image directory under `key` for `node`'s tuple, then make the
    local cache hold exactly the published manifest (ours, or the winner's)."""
    _check_tenant(store, key)
    layout = pack.pack(directory, key, node, chunker, avg_chunk)
    if on_total:
        on_total(sum(layout.unique_chunks().values()))   # what the upload progress counts
    store.ensure_bucket()
    locations, up = transfer.upload(layout, directory, store, workers=workers, progress=progress)
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
        log.info("push %s: another writer published first (%s)", key, final.creator)
    installed = None
    if cache is not None:
        installed = _install_published(cache, store, final, directory, m, workers)
    return PushResult(key, m.tuple_hash, final.size, won, final.creator, up, installed)


def _install_published(cache: Cache, store: Store, final: Manifest, directory: Path, ours: Manifest,
                       workers: int) -> str:
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
        sources = transfer.chain(transfer.dir_sources(ours, directory),
                                 cache.sources(final.unique_chunks(), tenant=_tenant(store)))
        entry_id, _ = _fill_and_install(cache, store, final, sources, workers=workers, progress=None)
        for e in cache.entries(final.key):
            if e.state == "corrupt":
                cache.evict(e.id)
        return entry_id


def listing(cache: Cache, store: Store | None, node: CompatTuple) -> dict:
    """Local entries and stored manifests, each with size and whether this node can restore it."""
    local = []
    for e in cache.entries():
        bad = check(e.tuple, node)
        local.append({**e.to_dict(), "match": not bad, "reasons": [str(b) for b in bad]})
    remote: list[dict] = []
    out: dict = {"node_tuple_hash": node.hash(), "local": local, "remote": remote,
                 "cache_used_bytes": cache.used_bytes(), "cache_budget_bytes": cache.budget}
    if store is None:
        return out
    for key, th, nbytes in store.list_manifests():
        row: dict = {"key": key, "tuple_hash": th, "manifest_bytes": nbytes}
        body = store.get_manifest(key, th)
        try:
            m = _checked(body or b"", store.manifest_name(key, th), key, store)
        except (ManifestError, ManifestRefused, KeyMissing) as e:
            row.update(match=False, valid=False, reasons=[str(e)])
        else:
            bad = check(m.tuple, node)
            row.update(valid=True, size=m.size, match=not bad, reasons=[str(b) for b in bad],
                       creator=m.creator, chunks=len(m.unique_chunks()))
        remote.append(row)
    return out


def _tenant(store: Store | None) -> str:
    return getattr(store, "tenant", "") if store is not None else ""


def verify(cache: Cache, key: str | None = None) -> list[dict]:
    """Re-hash every chunk of every entry (of `key`); corrupt ones are marked and
    evicted unless leased (the next pull refetches them)."""
    out = []
    for e in cache.entries(key):
        if e.state == "evicting":
            continue
        why = cache.check_entry(e, full=True)
        row = {"id": e.id, "key": e.key, "size": e.size, "ok": why is None, "problem": why, "evicted": False}
        if why is not None:
            cache.mark_corrupt(e.id)
            row["evicted"] = cache.evict(e.id)
        out.append(row)
    return out
