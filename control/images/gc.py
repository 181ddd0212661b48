"""The store's lifecycle: remove an image (`thaw rm`), retention, and the GC of
packs and chunk pointers no live manifest needs (`thaw gc --store`). One
tenant's prefix at a time: a tenant's manifests are the only ones that can
name its packs (dedup never crosses tenants, issue 13), so marking from them is
complete, and nothing of another tenant is listed, read or deleted.

What can reference a pack:
    a live manifest                      (mark: every manifest of the tenant, read and verified)
    a publish in flight, two ways:
      it uploaded the pack itself        (young: LastModified within the grace)
      it probed a chunk pointer naming   (the pointer may be old; the publish may then put a
      an older pack (dedup)               manifest naming that pack any time until its bound)
Pulls read only manifests; pointers are a dedup index that no manifest
depends on, so deleting a pointer never breaks an image. Pod tables
(pods/<lookup>/<key>.json, control/thawd/podtables.py) are hints that name an
image key: `thaw rm KEY` deletes the ones naming KEY, and a run deletes those whose
key has no live manifest once they are older than G (a table is published when its
pod is assembled, before the pod's image: a young one may be waiting for it).

So a pack that no live manifest names goes in two runs (store.gc_grace_s = G):
    run 1: every pointer naming it is deleted (once the pointer and the pack are older
           than G), then a marker gc/condemned/<pack> is written: its LastModified is
           when the last way for a publish to learn the pack's name went away;
    run n: the marker is older than G and no pointer names the pack: the pack is deleted
           (after one more HEAD: unchanged since it was listed), then its marker.
A publish that learned the name from a pointer did so before the marker; it puts
its manifest within G of that probe or not at all (image.check_publish_time),
and run n marks after the marker is G old, so it sees that manifest and keeps
the pack. Pack names are never written twice (pack.build salts them), so no
publish re-creates an object a run is about to delete. Every age is in the
store's clock (Store.clock), with one second of slack for S3's whole-second
LastModified. A run killed anywhere leaves only what a later run finishes:
deleted pointers (harmless), markers written late (they only wait longer),
a marker whose pack is gone (removed next run).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from control.errors import NotFound, PreconditionError, ThawError, UserError
from control.images import manifest as manifestmod
from control.images.store import Obj, Store
from control.lifecycle.workload import workload_of
from control.logfields import fields

log = logging.getLogger(__name__)

SLACK_S = 1.0          # S3 LastModified has whole seconds (SeaweedFS, and AWS listings)
MARKERS = "gc/condemned/"


@dataclass
class Report:
    tenant: str
    dry_run: bool
    now: float = 0.0                 # the store's clock at the start
    grace_s: float = 0.0
    removed_manifests: list[dict] = field(default_factory=list)   # retention: key, tuple_hash, age_s, why
    removed_orders: list[str] = field(default_factory=list)
    removed_pod_tables: list[str] = field(default_factory=list)   # pods/<lookup>/<key>.json
    removed_pointers: int = 0
    condemned_packs: list[str] = field(default_factory=list)
    deleted_packs: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    removed_markers: list[str] = field(default_factory=list)
    live_manifests: int = 0
    live_packs: int = 0
    waiting_packs: int = 0           # condemned, not yet G old
    young_packs: int = 0             # unreferenced and younger than G (a publish in flight, or a loser's)
    pointers: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (f"tenant {self.tenant}: {verb} {len(self.removed_manifests)} images by retention, "
                f"{len(self.removed_pod_tables)} pod tables, {self.removed_pointers} of {self.pointers} chunk pointers, "
                f"{len(self.deleted_packs)} packs "
                f"({self.deleted_bytes} bytes); {'would condemn' if self.dry_run else 'condemned'} "
                f"{len(self.condemned_packs)} packs, {self.waiting_packs} waiting out the grace "
                f"({self.grace_s:g} s), {self.young_packs} young; {self.live_manifests} live images in "
                f"{self.live_packs} packs")


def _need_tenant(store: Store) -> None:
    if not getattr(store, "tenant", ""):
        raise UserError("the store lifecycle works on one tenant's prefix: use Store.for_tenant", field="tenant")


def _manifest_objects(store: Store) -> tuple[dict[tuple[str, str], Obj], dict[tuple[str, str], Obj]]:
    """(key, tuple_hash) -> the manifest object, and -> the order object beside it."""
    manifests: dict[tuple[str, str], Obj] = {}
    orders: dict[tuple[str, str], Obj] = {}
    for o in store.list_objects("manifests/"):
        k, _, leaf = o.name[len("manifests/"):].partition("/")
        if "/" in leaf:
            continue
        if leaf.endswith(".json"):
            manifests[(k, leaf[:-len(".json")])] = o
        elif leaf.endswith(".order"):
            orders[(k, leaf[:-len(".order")])] = o
    return manifests, orders


def _pod_tables(store: Store) -> dict[str, list[Obj]]:
    """Image key -> the tenant's pod tables naming it (pods/<lookup>/<key>.json)."""
    out: dict[str, list[Obj]] = {}
    for o in store.list_objects("pods/"):
        lookup, _, leaf = o.name[len("pods/"):].partition("/")
        if lookup and leaf.endswith(".json") and "/" not in leaf:
            out.setdefault(leaf[:-len(".json")], []).append(o)
    return out


# -- thaw rm --------------------------------------------------------------------------------

def remove(store: Store, key: str, tuple_hash: str | None = None, dry_run: bool = False) -> list[str]:
    """Delete the tenant's manifests of `key` (of one tuple with `tuple_hash`), their
    fetch-order hints and, once no manifest of `key` is left, the pod tables naming it:
    the image is gone for every node that has not cached it. Its packs stay until a
    store GC finds them unreferenced. NotFound when there is none of these."""
    _need_tenant(store)
    manifestmod.validate_key(key)
    tenant = store.tenant
    if not key.startswith(tenant + "."):
        raise UserError(f"key {key!r} is not tenant {tenant!r}'s: its keys start with {tenant + '.'!r}", field="key")
    manifests, orders = _manifest_objects(store)
    pick = [kt for kt in manifests if kt[0] == key and (tuple_hash is None or kt[1].startswith(tuple_hash))]
    # A table is one per key, whatever the tuple: it goes with the key's last manifest.
    last = not any(kt[0] == key and kt not in pick for kt in manifests)
    tables = [o.name for o in _pod_tables(store).get(key, [])] if last else []
    if not pick and not tables:
        what = f" for tuple {tuple_hash}" if tuple_hash else ""
        raise NotFound("image", key, f"the store holds no manifest of it{what} (`thaw ls` lists them)")
    names = [manifests[kt].name for kt in pick] + [orders[kt].name for kt in pick if kt in orders] + tables
    if not dry_run:
        store.delete(names)
        log.info("rm %s: deleted %s", key, ", ".join(names), extra=fields(key=key, tenant=tenant, decision="removed"))
    return names


# -- retention ------------------------------------------------------------------------------

def retention(manifests: dict[tuple[str, str], Obj], now: float, max_age_s: float, keep: int) -> list[dict]:
    """The images retention removes: older than `max_age_s` (0: no limit), or beyond the
    `keep` newest of their workload and tuple (0: no limit). Ages are the store's
    LastModified of the manifest: when it was published."""
    out: dict[tuple[str, str], dict] = {}
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for kt, o in manifests.items():
        groups.setdefault((workload_of(kt[0]), kt[1]), []).append(kt)
        age = now - o.mtime
        if max_age_s and age > max_age_s:
            out[kt] = {"key": kt[0], "tuple_hash": kt[1], "age_s": round(age), "why": f"older than {max_age_s:g} s"}
    if keep:
        for (wl, _th), kts in groups.items():
            kts.sort(key=lambda kt: (manifests[kt].mtime, kt[0]), reverse=True)
            for kt in kts[keep:]:
                out.setdefault(kt, {"key": kt[0], "tuple_hash": kt[1], "age_s": round(now - manifests[kt].mtime),
                                    "why": f"not among the {keep} newest of workload {wl}"})
    return sorted(out.values(), key=lambda r: (r["key"], r["tuple_hash"]))


# -- the GC ---------------------------------------------------------------------------------

def _live_packs(store: Store, manifests: dict[tuple[str, str], Obj]) -> set[str]:
    """Every pack a live manifest names. Any manifest that cannot be read or verified
    stops the run before anything is deleted: what it names is unknown."""
    from control.images.image import read_manifest
    live: set[str] = set()
    for (key, th) in sorted(manifests):
        try:
            m = read_manifest(store, key, th)
        except ThawError as e:
            raise PreconditionError(
                f"store GC of tenant {store.tenant} stopped before deleting anything: manifest {key}/{th[:12]} "
                f"cannot be read ({e}); remove it with `thaw rm {key} --tuple {th[:12]}` or fix the keys",
                manifest=f"{key}/{th}") from None
        if m is not None:   # None: removed since the listing (not live any more)
            live.update(m.packs)
    return live


def collect(store: Store, *, grace_s: float, max_age_s: float = 0.0, keep: int = 0, dry_run: bool = False,
            workers: int = 8) -> Report:
    """One GC run over the tenant of `store` (module docstring): retention, then the
    pointers and packs no live manifest needs. A dry run deletes and writes nothing
    (but the clock object) and reports what a run now would do."""
    _need_tenant(store)
    rep = Report(store.tenant, dry_run, grace_s=grace_s)
    now = rep.now = store.clock()

    def old(o: Obj) -> bool:
        return now - o.mtime > grace_s + SLACK_S

    manifests, orders = _manifest_objects(store)
    rep.removed_manifests = retention(manifests, now, max_age_s, keep)
    gone = [(r["key"], r["tuple_hash"]) for r in rep.removed_manifests]
    if gone and not dry_run:
        store.delete([manifests[kt].name for kt in gone] + [orders[kt].name for kt in gone if kt in orders])
        log.info("gc %s: removed %d images by retention", store.tenant, len(gone),
                 extra=fields(tenant=store.tenant, decision="retention", count=len(gone)))
    for kt in gone:
        manifests.pop(kt)
        orders.pop(kt, None)

    live = _live_packs(store, manifests)
    rep.live_manifests, rep.live_packs = len(manifests), len(live)
    packs = {o.name[len("packs/"):]: o for o in store.list_objects("packs/")}
    markers = {o.name[len(MARKERS):]: o for o in store.list_objects(MARKERS)}
    pointers = list(store.list_objects("chunks/"))
    rep.pointers = len(pointers)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="gc-head") as pool:
        heads = list(pool.map(lambda o: store.head(o.name), pointers))

    # Pointers: a dedup index. One naming a live pack, or young, or naming a young pack, stays;
    # the rest (naming a dead pack, a missing one, or nothing thaw wrote) go.
    drop: list[str] = []
    named_by_kept: set[str] = set()
    named_by_dropped: set[str] = set()
    for o, h in zip(pointers, heads):
        if h is None:
            continue                      # deleted since the listing
        pk = (h.meta or {}).get("thaw-pack", "")
        target = packs.get(pk)
        if pk in live or not old(o) or (target is not None and not old(target)):
            named_by_kept.add(pk)
        else:
            drop.append(o.name)
            named_by_dropped.add(pk)
    rep.removed_pointers = len(drop)
    if drop and not dry_run:
        for i in range(0, len(drop), 500):   # in steps, each logged: a kill leaves a clear trace
            store.delete(drop[i:i + 500])
            log.info("gc %s: deleted %d chunk pointers", store.tenant, len(drop[i:i + 500]),
                     extra=fields(tenant=store.tenant, decision="deleted-pointers", count=len(drop[i:i + 500])))

    # Packs, after the pointers: a marker is written only once no pointer names its pack.
    condemn: list[str] = []
    unmark: list[str] = []
    delete: list[tuple[str, Obj]] = []
    for name, o in sorted(packs.items()):
        mk = markers.get(name)
        if name not in live and not old(o):
            rep.young_packs += 1          # a publish in flight, or a loser's: not this run's to judge
        if name in live or name in named_by_kept or not old(o):
            if mk is not None:
                unmark.append(name)       # named again: the grace starts over if it dies again
            continue
        if mk is None or name in named_by_dropped or o.mtime > mk.mtime:
            condemn.append(name)          # (again, when a pointer named it until now)
        elif old(mk):
            delete.append((name, o))
        else:
            rep.waiting_packs += 1
    unmark += [name for name in markers if name not in packs]   # the pack went; its marker goes too
    rep.condemned_packs = condemn
    if not dry_run:
        for name in condemn:
            store.put_empty(MARKERS + name)
        if condemn:
            log.info("gc %s: condemned %d packs", store.tenant, len(condemn),
                     extra=fields(tenant=store.tenant, decision="condemned", count=len(condemn)))
    for name, o in delete:
        if not dry_run:
            now_o = store.head("packs/" + name)
            if now_o is None or now_o.mtime != o.mtime:
                continue                  # changed since the listing: a later run decides again
            store.delete(["packs/" + name])
            store.delete([MARKERS + name])
            log.info("gc %s: deleted pack %s (%d bytes)", store.tenant, name, o.size,
                     extra=fields(tenant=store.tenant, decision="deleted-pack", pack=name, bytes=o.size))
        rep.deleted_packs.append(name)
        rep.deleted_bytes += o.size
    rep.removed_markers = sorted(set(unmark))
    if unmark and not dry_run:
        store.delete([MARKERS + n for n in rep.removed_markers])

    # Fetch-order hints whose manifest is gone (a hint is written after a restore).
    stale = [o.name for kt, o in orders.items() if kt not in manifests and old(o)]
    rep.removed_orders = stale
    if stale and not dry_run:
        store.delete(stale)

    # Pod tables naming a key with no live manifest (left by `thaw rm` of one tuple, by
    # retention, or by a pod never saved). Only old ones: a pod's table is published
    # when it is assembled, before its image, so a young one may be waiting for it.
    live_keys = {k for k, _ in manifests}
    rep.removed_pod_tables = sorted(o.name for k, objs in _pod_tables(store).items() if k not in live_keys
                                    for o in objs if old(o))
    if rep.removed_pod_tables and not dry_run:
        store.delete(rep.removed_pod_tables)
        log.info("gc %s: deleted %d pod tables", store.tenant, len(rep.removed_pod_tables),
                 extra=fields(tenant=store.tenant, decision="deleted-pod-tables", count=len(rep.removed_pod_tables)))
    log.info("gc %s: %s", store.tenant, rep.summary(), extra=fields(tenant=store.tenant, dry_run=dry_run))
    return rep
