"""The one face of checkpoint images for both doors: a restorable image of a key,
from the node cache, else from the store, streamed while it arrives or pulled
whole first, decided once (`open_restorable`); and the tenant's view of the
store, composed once (`tenant_store`).

The CLI (`thaw restore --from-store`, control/cli/sandbox.py) calls
`open_restorable` directly; thawd calls it through `ImageSource`, its six verbs
over the cache and the store (pull, has, staged, publish, entries, evict), with
the node's compatibility tuple computed once, at start, and every verb on the
tenant's view of the store, the tenant being the first field of the workload key
(control/lifecycle/tenant.py store_tenant; issue 13).

What comes back is a `Restorable`: a cache entry served through thaw-gofer with
every chunk checked as runsc reads it (control/images/served.py Served, issue 30;
with cache.verify = stat, the cache Lease itself, control/images/cache.py) or a
Stream (control/images/stream.py), each with `path` (the image directory runsc
restores from), `source` (the directory messages and records name: the cache
entry, not the view of it runsc reads), `hit`, `streamed`, `checked` (whether
`verdict()` can tell why the sentry's reads failed), `env()` (what `runsc restore`
needs in its environment: thaw-gofer's sidecar directory), `verdict()` (why its
stream failed, or which chunk of the entry was altered; None otherwise),
`wait()` (until its image is whole: a stream's end), `to_dict()` and `release()`.
"""
from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from control.config import Settings
from control.errors import NotFound, StoreError, ThawError, TupleMismatch
from control.images import image as images
from control.images import served
from control.images import stream as streammod
from control.images.cache import Cache, Lease
from control.images.keys import Keyring
from control.images.store import Store
from control.lifecycle.tenant import store_tenant
from control.node.compat import CompatTuple, node_tuple
from control.logfields import fields

log = logging.getLogger(__name__)


class Restorable(Protocol):
    path: Path
    source: Path        # what messages and records name (a Served view's entry, not the view)
    hit: bool
    streamed: bool
    checked: bool       # verdict() can tell why the sentry's reads failed (a stream, a checked read)

    def env(self) -> dict[str, str]: ...

    def verdict(self, wait_s: float = ...) -> ThawError | None: ...

    def wait(self, timeout: float | None = ...) -> bool: ...   # until the image is whole (a stream's end)

    def to_dict(self) -> dict: ...

    def describe(self, holder: str) -> None: ...   # who holds it (Cache.lease_holders, `thaw evict`)

    def release(self) -> None: ...


def tenant_store(settings: Settings, tenant: str, base: Store | None = None,
                 keys: Keyring | None = None) -> Store:
    """The store as `tenant` (a store tenant: no sub-tenant) sees it: its prefix, its
    key when encryption is on (KeyMissing without one), the manifest key."""
    return (base if base is not None else Store(settings)).for_tenant(
        tenant, keys if keys is not None else Keyring.from_settings(settings))


def open_restorable(cache: Cache, store: Store, settings: Settings, key: str, node: CompatTuple, *,
                    lock_timeout_s: float | None = None) -> tuple[Restorable, str, images.PullResult | None]:
    """A restorable image of `key` for this node: a leased cache entry (a hit), else
    a Stream filling a new entry (store.stream, the default, where thaw-gofer is
    installed), else the image pulled whole into the cache first. Returns it, why a
    miss was pulled whole rather than streamed ("" when it streamed or was a hit),
    and the pull's result when it pulled. Raises what a pull raises (NotFound,
    TupleMismatch, StoreError, ManifestError, CacheFull, Timeout for the key's lock)."""
    why = streammod.why_not(settings, store)
    if not why:
        src = streammod.open_image(cache, store, settings, key, node, lock_timeout_s=lock_timeout_s)
        return (src if src.streamed else served.for_restore(cache, settings, src)), "", None
    r = images.pull(cache, store, key, node, workers=settings.store_workers)
    return served.for_restore(cache, settings, r.lease), ("" if r.hit else why), r


class ImageSource:
    """thawd's view of checkpoint images: the node cache backed by the object store."""

    def __init__(self, settings: Settings, node: CompatTuple | None = None, store: Store | None = None) -> None:
        self.s = settings
        self.cache = images.open_cache(settings)
        self.store = store if store is not None else Store(settings)
        self.keys = Keyring.from_settings(settings)
        self.node = node or node_tuple(settings)
        if self.keys.manifest_key is None:
            log.warning("store.manifest_key_file is not set: manifests are neither signed nor checked, so anyone "
                        "who can write the bucket can publish an image this node restores (docs/security.md)")
        self._recover()
        try:
            self.store.ensure_bucket()
        except StoreError as e:  # the store may come up later; pulls then report it per request
            log.warning("store not ready at start: %s", e)

    def _recover(self) -> None:
        """What a thawd killed mid-pull or mid-stream left (a partial entry, a stream's
        directory of hard links) goes before this one serves, so neither the cache dir
        nor its listing shows a half-made image, and a stream's hard links stop
        holding the space of entries evicted since. Keys another process holds are
        left to it; any later pull of a key recovers it too (image.pull, stream.open_image)."""
        try:
            removed = self.cache.recover() + streammod.remove_leftovers(self.cache) + \
                served.remove_leftovers(self.cache)
        except OSError as e:   # a start must not fail for a leftover it cannot remove
            log.warning("cache: recovering leftovers at start: %s", e)
            return
        for p in removed:   # a warning: what a crash left is worth seeing (and thawd logs INFO only once serving)
            log.warning("cache: recovered at start: removed %s", p)

    def pull(self, key: str) -> Restorable:
        """A restorable image of `key` on this node (open_restorable); NotFound /
        TupleMismatch / StoreError otherwise. A Stream's end is logged."""
        t0 = time.monotonic()
        src, why, r = open_restorable(self.cache, self._store(key), self.s, key, self.node,
                                      lock_timeout_s=self.s.thawd_prepare_timeout_s)
        if src.streamed:
            # A stream holds the key's lock until its entry is in. A second container of
            # the key meanwhile waits for that lock within thawd.prepare_timeout_s and then
            # restores from the cache (one download for both, as with a pull); a longer
            # stream leaves it cold (fetch-in-progress), as a pull that long would.
            src.add_done_callback(lambda st: self._stream_done(key, st))
            return src
        if why and self.s.store_stream:   # on, but not for this image: say why (docs/store.md "Streaming restore")
            (log.warning if "thaw-gofer" in why else log.info)("pull %s: pulled whole, not streamed: %s", key, why,
                                                               extra=fields(key=key, reason=why))
        if r is not None:
            for note in r.notes:
                log.info("pull %s: %s", key, note)
            if not r.hit and r.fill is not None:
                f = r.fill
                log.info("pull %s: fetched %d bytes (%d raw, %d chunks) from the store, %d bytes from local "
                         "chunks, %d zero; image %d bytes in %.3fs (fill %.3fs, %s, %d bytes O_DIRECT)",
                         key, f.fetched_bytes, f.fetched_raw_bytes, f.fetched_chunks, f.local_bytes, f.zero_bytes,
                         r.manifest_size, time.monotonic() - t0, f.seconds, f.engine or "?", f.direct_bytes,
                         extra=fields(key=key, decision="pulled", bytes=f.fetched_bytes,
                                      duration_s=round(time.monotonic() - t0, 3)))
        return src

    def _stream_done(self, key: str, st) -> None:
        if st.error is None:
            log.info("stream %s: in the cache as %s (%.2fs; %s)", key, st.entry_id, st.seconds, st.stats,
                     extra=fields(key=key, decision="streamed", duration_s=round(st.seconds, 3)))
        else:
            log.warning("stream %s failed after %.2fs: %s", key, st.seconds, st.error,
                        extra=fields(key=key, decision="stream-failed", reason=str(st.error),
                                     duration_s=round(st.seconds, 3)))

    def has(self, key: str) -> bool:
        """Whether an image of `key` for this node exists (in the cache or the store)."""
        if any(e.state == "ready" and e.tuple.hash() == self.node.hash() for e in self.cache.entries(key)):
            return True
        try:
            images.remote_manifest(self._store(key), key, self.node)
            return True
        except (NotFound, TupleMismatch):
            return False

    def staged(self, key: str) -> AbstractContextManager[images.Staged]:
        """A cache partial for a new image of `key` (`.path`: where runsc writes it);
        removed at the end of the block unless `publish` installed it."""
        return images.staged(self.cache, key, self.node)

    def publish(self, st: images.Staged) -> bool:
        """Publish a staged image and make it this node's cache entry (by rename);
        True if ours won the publish."""
        t0 = time.monotonic()
        r = images.publish_staged(self.cache, self._store(st.key), st, chunker=self.s.pack_chunker,
                                  avg_chunk=self.s.pack_avg_chunk_bytes, workers=self.s.store_workers)
        for note in r.notes:
            log.info("publish %s: %s", st.key, note)
        u = r.upload
        log.info("publish %s: image %d bytes, uploaded %d bytes (%d raw, %d of %d chunks, %d packs) in "
                 "%.3fs (upload %.3fs), %s", st.key, r.size, u.uploaded_bytes, u.uploaded_raw_bytes,
                 u.uploaded_chunks, u.chunks, u.packs, time.monotonic() - t0, u.seconds,
                 "published" if r.published else "another writer published first",
                 extra=fields(key=st.key, decision="published" if r.published else "lost-race", bytes=r.size,
                              duration_s=round(time.monotonic() - t0, 3)))
        return r.published

    def store_for(self, key: str) -> Store:
        """The store as the tenant of `key` (a workload key, or a pod's lookup key: both
        start with the tenant) sees it; KeyMissing when it must encrypt and has no key."""
        return tenant_store(self.s, store_tenant(key), self.store, self.keys)

    _store = store_for

    def entries(self) -> list[dict]:
        return [{"key": e.key, "tuple_hash": e.tuple.hash(), "bytes": e.size, "leases": e.leases,
                 "state": e.state, "reason": ""} for e in self.cache.entries()]

    def evict(self, key: str) -> bool:
        """Evict every unleased local entry of `key` (the store keeps its copy)."""
        return any([self.cache.evict(e.id) for e in self.cache.entries(key)])


__all__ = ["ImageSource", "Restorable", "open_restorable", "tenant_store", "Lease"]
