"""A streamed restore's learned order: the ranges of an image's memory that earlier
restores faulted on first (they say what the workload touches), kept beside its
manifest in the store and fetched first by the next stream (control/images/stream.py).
A hint: a missing or unreadable order only costs the head start. An encrypting
tenant's order is sealed (keys.seal_order)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

from control.errors import ManifestError, StoreError
from control.images import keys as keysmod
from control.images.manifest import Manifest
from control.images.store import Store
from control.logfields import fields

log = logging.getLogger("control.images.stream")

ORDER_SCHEMA = "thaw.order"
ORDER_VERSION = 1
MAX_ORDER_RANGES = 4096


def read_order(store: Store, m: Manifest) -> dict[str, list[list[int]]]:
    """The ranges earlier restores of this image faulted on, by file, in the order
    first seen; {} when there is none or it cannot be read (it is only a hint)."""
    try:
        body = store.get_order(m.key, m.tuple_hash)
    except (StoreError, ManifestError) as e:   # ManifestError: larger than an order may be
        log.info("stream %s: no learned order (%s)", m.key, e, extra=fields(key=m.key, reason=str(e)))
        return {}
    if body is None:
        return {}
    tenant_key = getattr(store, "tenant_key", None)
    if tenant_key is not None:   # an encrypting tenant's order is sealed (keys.seal_order)
        try:
            body = keysmod.open_order(tenant_key, store.tenant, m.key, m.tuple_hash, body)
        except ValueError as e:
            log.warning("stream %s: ignoring the learned order: %s", m.key, e, extra=fields(key=m.key, reason=str(e)))
            return {}
    try:
        doc = json.loads(body)
        if doc.get("schema") != ORDER_SCHEMA or doc.get("version") != ORDER_VERSION:
            return {}
        sizes = {f.name: f.size for f in m.files}
        out: dict[str, list[list[int]]] = {}
        for name, rs in (doc.get("files") or {}).items():
            if name not in sizes:
                continue
            out[name] = [[int(o), int(n)] for o, n in rs[:MAX_ORDER_RANGES]
                         if 0 <= int(o) and 0 < int(n) and int(o) + int(n) <= sizes[name]]
        return out
    except (ValueError, TypeError, AttributeError, RecursionError) as e:
        log.warning("stream %s: ignoring an unreadable order object: %s", m.key, str(e)[:200],
                    extra=fields(key=m.key, reason=str(e)[:200]))
        return {}


def record_order(store: Store, m: Manifest, faults: dict[str, list[list[int]]]) -> dict:
    """Merge this restore's faulted ranges into the image's order object (earlier
    ranges keep their rank; new ones not already covered go after them)."""
    prior = read_order(store, m)
    merged: dict[str, list[list[int]]] = {name: list(rs) for name, rs in prior.items()}
    added = 0
    for name, rs in faults.items():
        have = merged.setdefault(name, [])
        for off, n in rs:
            if len(have) >= MAX_ORDER_RANGES:
                break
            if any(o <= off and off + n <= o + k for o, k in have):
                continue
            have.append([off, n])
            added += 1
    doc = {"schema": ORDER_SCHEMA, "version": ORDER_VERSION, "key": m.key, "tuple_hash": m.tuple_hash,
           "files": merged, "updated": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if added:
        body = json.dumps(doc, separators=(",", ":")).encode()
        tenant_key = getattr(store, "tenant_key", None)
        if tenant_key is not None:   # what a workload touches first is the tenant's to know
            body = keysmod.seal_order(tenant_key, store.tenant, m.key, m.tuple_hash, body)
        store.put_order(m.key, m.tuple_hash, body)
    return {"added": added, "ranges": sum(len(v) for v in merged.values())}


# -- leftovers ---------------------------------------------------------------------------
