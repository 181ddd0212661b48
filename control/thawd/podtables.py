"""Pod tables: what a node needs to match a pod to its image before any of its app
containers exists.

CRI's RunPodSandbox carries no container list, so when a pod's pause container is
created thawd knows only the pod's lookup key (control/lifecycle/pod.py lookup: its
tenant, pod-wide annotations and declared container names). A table maps a lookup
key to a pod key (the image) and the identity of every container that image holds;
it is written when a cold pod of that lookup has been assembled, on the node
(<state_dir>/thawd/pods/<lookup>/<key>.json) and in the store, per tenant
(tenants/<tenant>/pods/<lookup>/<key>.json), signed with the cluster's manifest key
and sealed with the tenant's key as a manifest is. So the first pod of a workload
on a node that never assembled one finds its table in the store, and its image
(streamed, or pulled) restores as on any other node.

A lookup key has as many tables as versions of the workload were assembled (a
rolling update: other image digests, other specs, other pod keys): neither evicts
the other. A pod picks the table whose hint is its own: the pod's name less the
suffix Kubernetes generates (a Deployment's pods are `<deployment>-<pod-template-hash>-<5
characters>`, so one ReplicaSet, one version, one hint); else the most recent. A
pod of another version than the table it picked fails at its first container that
differs (control/thawd/pods.py), and its next sandbox starts cold: the cost of a
wrong pick is one sandbox restart, never a wrong restore.

A table from the store is only a hint to which image to lease: every container is
still checked against it at its create, and a forged or stale table can cause a
cold start, not a restore of anything but the tenant's own image.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from control.errors import ThawError
from control.files import write_json_atomic
from control.images import keys as keysmod
from control.lifecycle import pod as podmod

log = logging.getLogger("thawd")

SCHEMA = "thaw.pod-table"
VERSION = 1
# A table is a few hundred bytes per container; anything larger is not one.
MAX_TABLE_BYTES = 64 << 10
# Versions of one workload kept per lookup key, on the node and read from the store.
MAX_TABLES = 8
MAX_HINTS = 8
# What Kubernetes appends to a generateName (apimachinery pkg/util/rand String(5):
# characters of "bcdfghjklmnpqrstvwxz2456789", no vowels, no 0/1/3).
_GENERATED_SUFFIX = re.compile(r"-[bcdfghjklmnpqrstvwxz2456789]{5}$")


def hint_of(sandbox_spec: dict) -> str:
    """Which version of its workload a pod is, as far as its name tells: the pod's name
    less a generated suffix ("" when the pod's sandbox names no pod)."""
    name = (sandbox_spec.get("annotations") or {}).get(podmod.CRI_SANDBOX_NAME, "")
    return _GENERATED_SUFFIX.sub("", name)


@dataclass
class Table:
    lookup: str
    key: str
    containers: dict                 # name -> identity (pod.identity) the image was saved with
    hints: list[str] = field(default_factory=list)
    time: float = 0.0                # when its pod was assembled (the newest writer's)
    # Hints of pods that failed on this table (another version): not picked for them
    # again on this node. Kept on the node, never published.
    refused: list[str] = field(default_factory=list)
    # Its init containers (name -> identity): they ran to their end before the pod was
    # saved, so the image holds none of them; a restoring pod answers them as done.
    init: dict = field(default_factory=dict)

    def to_dict(self, local: bool = False) -> dict:
        d = {"schema": SCHEMA, "version": VERSION, "lookup": self.lookup, "key": self.key,
             "containers": self.containers, "init": self.init, "hints": self.hints, "time": self.time}
        if local and self.refused:
            d["refused"] = self.refused
        return d


class TableError(ThawError):
    """A pod table that is not one (named, with what is wrong: it is skipped)."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"pod table {where}: {why}", where=where)


def parse(body: bytes, where: str, lookup: str, key: str) -> Table:
    """A table read from `where`; TableError naming what is wrong."""
    if len(body) > MAX_TABLE_BYTES:
        raise TableError(where, f"larger than {MAX_TABLE_BYTES} bytes")
    try:
        d = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise TableError(where, f"not JSON ({type(e).__name__})") from None
    if not isinstance(d, dict) or d.get("schema") != SCHEMA or d.get("version") != VERSION:
        raise TableError(where, f"not a {SCHEMA} version {VERSION} document")
    if d.get("lookup") != lookup or d.get("key") != key:
        raise TableError(where, f"written for {d.get('lookup')!r} / {d.get('key')!r}, stored under {lookup} / {key}")
    if not key.startswith(lookup + "-"):
        raise TableError(where, f"its pod key {key!r} is not one of lookup {lookup!r}")
    containers = d.get("containers")
    if not isinstance(containers, dict) or not containers or not all(
            isinstance(n, str) and isinstance(i, dict) for n, i in containers.items()):
        raise TableError(where, "containers must map names to identities")
    init = d.get("init") or {}
    if not isinstance(init, dict) or not all(isinstance(n, str) and isinstance(i, dict) for n, i in init.items()):
        raise TableError(where, "init must map names to identities")
    hints = [h for h in d.get("hints") or [] if isinstance(h, str)][:MAX_HINTS]
    refused = [h for h in d.get("refused") or [] if isinstance(h, str)][:MAX_HINTS]
    t = d.get("time")
    return Table(lookup, key, containers, hints, float(t) if isinstance(t, (int, float)) else 0.0, refused, init)


def _tag(d: dict, key: bytes) -> str:
    rest = {k: v for k, v in d.items() if k != "tag"}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, keysmod.POD_TABLE_TAG_LABEL + canonical, hashlib.sha256).hexdigest()


def encode(t: Table, store) -> bytes:
    """A table as it goes to `store` (a tenant's view): signed, then sealed, as the
    tenant's settings say (as images.image publishes a manifest)."""
    d = t.to_dict()
    if getattr(store, "manifest_key", None) is not None:
        d["tag"] = _tag(d, store.manifest_key)
    body = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    if getattr(store, "tenant_key", None) is not None:
        body = keysmod.seal_pod_table(store.tenant_key, store.tenant, t.lookup, t.key, body)
    return body


def decode(body: bytes, store, lookup: str, key: str) -> Table:
    """A table read from `store`, refused (TableError) unless it opens with the tenant's
    key (when it encrypts) and carries a valid tag (when the cluster has a manifest key)."""
    where = store.pod_table_name(lookup, key)
    if getattr(store, "tenant_key", None) is not None:
        try:
            body = keysmod.open_pod_table(store.tenant_key, store.tenant, lookup, key, body)
        except ValueError as e:
            raise TableError(where, str(e)) from None
    t = parse(body, where, lookup, key)
    if getattr(store, "manifest_key", None) is not None:
        d = json.loads(body)
        if not isinstance(d.get("tag"), str) or not hmac.compare_digest(d["tag"], _tag(d, store.manifest_key)):
            raise TableError(where, "its integrity tag does not verify under this cluster's manifest key "
                             "(store.manifest_key_file)")
    return t


class PodTables:
    """The tables of one node, backed by the store (`store_for(lookup)`: the store as
    the lookup key's tenant sees it, or None; `store_for` None: this node keeps its
    tables to itself)."""

    def __init__(self, directory: Path, store_for: Callable[[str], object] | None = None) -> None:
        self.dir = directory
        self.store_for = store_for

    def _path(self, lookup: str, key: str) -> Path:
        return self.dir / lookup / f"{key}.json"

    def local(self, lookup: str) -> list[Table]:
        """This node's tables of `lookup`, newest first (an unreadable one is skipped, logged)."""
        d = self.dir / lookup
        out = []
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                out.append(parse(p.read_bytes()[:MAX_TABLE_BYTES + 1], str(p), lookup, p.stem))
            except (OSError, TableError) as e:
                log.warning("pod table %s unusable (%s); ignoring it", p, e)
        return sorted(out, key=lambda t: -t.time)

    def remote(self, lookup: str) -> list[Table]:
        """The store's tables of `lookup`, newest first; [] without a store. A store that
        fails or a table that is not one is logged and skipped: the pod starts cold."""
        try:
            store = self.store_for(lookup) if self.store_for is not None else None
            if store is None:
                return []
            names = store.list_pod_tables(lookup, MAX_TABLES)
        except ThawError as e:
            log.warning("pod tables of %s: the store cannot be asked: %s", lookup, e)
            return []
        out = []
        for key, _ in names:
            try:
                body = store.get_pod_table(lookup, key, MAX_TABLE_BYTES)
                if body is not None:
                    out.append(decode(body, store, lookup, key))
            except ThawError as e:
                log.warning("pod table %s/%s skipped: %s", lookup, key, e)
        return sorted(out, key=lambda t: -t.time)

    def pick(self, lookup: str, hint: str) -> tuple[Table | None, str]:
        """The table a pod of `lookup` whose hint is `hint` restores with, and where it
        came from ("node" or "store"): this node's with its hint, else the store's with
        its hint (kept on the node from then on), else the newest of either."""
        mine = [t for t in self.local(lookup) if hint not in t.refused]
        refused = {t.key for t in self.local(lookup) if hint in t.refused}
        same = [t for t in mine if hint and hint in t.hints]
        if same:
            return same[0], "node"
        theirs = [t for t in (self.remote(lookup) if (not mine or hint) else []) if t.key not in refused]
        for t in theirs:
            if not any(m.key == t.key for m in mine):
                self._save(t)
        same = [t for t in theirs if hint and hint in t.hints]
        if same:
            return same[0], "store"
        both = sorted(mine + [t for t in theirs if not any(m.key == t.key for m in mine)], key=lambda t: -t.time)
        if not both:
            return None, ""
        return both[0], "node" if any(m.key == both[0].key for m in mine) else "store"

    def put(self, lookup: str, key: str, containers: dict, hint: str, init: dict | None = None) -> Table:
        """A pod of `lookup` was assembled with `containers` (its key `key`): its table,
        now the newest of its lookup key, with `hint` among its hints; the oldest tables
        beyond MAX_TABLES go."""
        old = next((t for t in self.local(lookup) if t.key == key), None)
        hints = ([hint] if hint else []) + [h for h in (old.hints if old else []) if h != hint]
        t = Table(lookup, key, containers, hints[:MAX_HINTS], time.time(),
                  [h for h in (old.refused if old else []) if h != hint], dict(init or {}))
        self._save(t)
        for stale in self.local(lookup)[MAX_TABLES:]:
            self._path(lookup, stale.key).unlink(missing_ok=True)
        return t

    def publish(self, t: Table) -> None:
        """Put `t` in the store (the lookup's tenant's view). Raises ThawError."""
        store = self.store_for(t.lookup) if self.store_for is not None else None
        if store is not None:
            store.put_pod_table(t.lookup, t.key, encode(t, store))

    def refuse(self, lookup: str, key: str, hint: str) -> None:
        """A pod whose hint is `hint` failed on table `key` (a container of another
        version): this node picks it for such pods no more."""
        t = next((t for t in self.local(lookup) if t.key == key), None)
        if t is not None and hint not in t.refused:
            t.refused = [hint, *t.refused][:MAX_HINTS]
            self._save(t)

    def _save(self, t: Table) -> None:
        p = self._path(t.lookup, t.key)
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_json_atomic(p, t.to_dict(local=True))

    def forget(self, lookup: str, key: str) -> None:
        self._path(lookup, key).unlink(missing_ok=True)
