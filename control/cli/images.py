"""`thaw push | pull | ls | gc | verify`: checkpoint images between a directory,
the object store and this node's cache (control/images/image.py does the work).

push, pull and ls work on one tenant's part of the store: the local user's
(`user-<name>`, or what tenancy.map says); root may name any tenant with
--tenant, others only their own or a sub-tenant of it (issue 13)."""

from __future__ import annotations

import functools
import logging
import os
import pwd
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

if TYPE_CHECKING:
    from control.node import compat

from control.cli.common import Context, handle_errors, json_option
from control.cli.progress import Bar, size as _size
from control.errors import NotFound

if TYPE_CHECKING:
    from control.images.store import Store

log = logging.getLogger("thaw")


def store_options(f: Callable) -> Callable:
    """Options shared by the image commands: where the store and the cache are."""
    @click.option("--endpoint", default=None, help="S3 endpoint URL [store.endpoint].")
    @click.option("--bucket", default=None, help="Bucket [store.bucket].")
    @click.option("--prefix", default=None, help="Key prefix inside the bucket [store.prefix].")
    @click.option("--cache-dir", default=None, help="Cache root [cache.dir].")
    @click.option("--budget", default=None, help="Cache budget in bytes, e.g. 50G [cache.budget_bytes].")
    @click.option("--machine-type", default=None, help="This node's machine type [node.machine_type].")
    @click.option("--tenant", default=None,
                  help="Tenant whose images these are (default: the local user's, user-<name>; only root "
                       "may name another tenant, others a sub-tenant <own>.<sub>).")
    @click.option("--progress/--no-progress", default=None,
                  help="Progress bar on stderr (default: when stderr is a terminal).")
    @functools.wraps(f)
    def wrapper(*args: Any, endpoint, bucket, prefix, cache_dir, budget, machine_type, tenant, progress,
                **kw: Any) -> Any:
        obj = click.get_current_context().find_object(Context)
        obj.tenant_request = tenant
        for k, v in (("store.endpoint", endpoint), ("store.bucket", bucket), ("store.prefix", prefix),
                     ("cache.dir", cache_dir), ("cache.budget_bytes", budget),
                     ("node.machine_type", machine_type)):
            obj.override(k, v)
        obj.progress = (not obj.json and sys.stderr.isatty()) if progress is None else progress
        return f(*args, **kw)
    return wrapper


def _node(obj: Context) -> compat.CompatTuple:
    from control.node import compat
    return compat.node_tuple(obj.settings)


def _tenant(obj: Context) -> str:
    from control.lifecycle import tenant as tenantmod
    uid = os.geteuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return tenantmod.cli_tenant(obj.tenant_request, user, uid, obj.settings.tenant_map)


def _store(obj: Context) -> Store:
    """The store as this command's tenant sees it."""
    from control.images.source import tenant_store
    from control.lifecycle import tenant as tenantmod
    return tenant_store(obj.settings, tenantmod.store_tenant(_tenant(obj)))


@click.command("push")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--key", "key", required=True,
              help="Workload key the image is published under: <tenant>.<name> (e.g. user-root.myapp).")
@click.option("--cache/--no-cache", "use_cache", default=True,
              help="Also cache the image on this node (DIR is copied into the cache, then published from there).")
@click.option("--allow-node-local", is_flag=True,
              help="Publish an image that needs paths of this node (a --bundle rootfs, --bind paths): "
                   "you make sure every restoring node has them at the same place.")
@store_options
@json_option
@click.pass_obj
@handle_errors
def push_cmd(obj: Context, directory: Path, key: str, use_cache: bool, allow_node_local: bool) -> None:
    """Publish a runsc checkpoint image directory under KEY (first writer wins).

    An image of `thaw checkpoint` whose restore needs paths only this node is
    sure to have is refused, naming them, unless --allow-node-local."""
    _check_portable(directory, allow_node_local)
    from control.images import image as images
    from control.images import manifest as manifestmod
    manifestmod.validate_key(key)   # the plain input first, before the directory or the store is looked at
    s = obj.settings
    tup, warning = _image_tuple(directory, _node(obj))
    bar = Bar(f"push {key}", obj.progress)
    r = images.push(images.open_cache(s) if use_cache else None, _store(obj), directory, key, tup,
                    chunker=s.pack_chunker, avg_chunk=s.pack_avg_chunk_bytes, workers=s.store_workers,
                    progress=bar, on_total=bar.set_total)
    bar.close()
    if warning:   # said once the push went: a refused push has its one error line alone
        log.warning("%s", warning)
    u = r.upload
    obj.emit(r.to_dict(), lambda d: (
        f"{'published' if r.published else 'already published by ' + str(r.manifest_creator.get('host'))} "
        f"{key} ({r.tuple_hash[:12]}): {_size(r.size)}, {u.uploaded_chunks}/{u.chunks} chunks sent "
        f"({_size(u.uploaded_bytes)}), {u.present_chunks} already in the store"
        + (f"; cached as {r.installed}" if r.installed else "") + "".join(f"\n  {n}" for n in r.notes)))


def _image_tuple(directory: Path, node: compat.CompatTuple) -> tuple[compat.CompatTuple, str | None]:
    """The tuple DIR's image is published under: the one `thaw checkpoint` recorded in its
    thaw.json (issue 30: it was the pushing node's, so an image made elsewhere was published
    as this node's), with a warning where it differs from this node's; this node's, with a
    warning, for an image that records none."""
    import json

    from control.node import compat as compatmod
    try:
        meta = json.loads((directory / "thaw.json").read_text())
    except (OSError, ValueError):
        meta = None
    tup = compatmod.image_tuple(meta, str(directory)) if isinstance(meta, dict) else None
    if tup is None:
        return node, (f"{directory} records no compatibility tuple (a plain runsc image, or one of a thaw before "
                      "it recorded one): published under this node's")
    bad = compatmod.check(tup, node)
    if tup != node:
        return tup, (f"{directory} was made on another node ({tup.hash()[:12]}): published under the tuple it was "
                     "made with, which this node " + ("cannot restore: " + "; ".join(map(str, bad)) if bad
                                                     else "can restore too"))
    return tup, None


def _check_portable(directory: Path, allow: bool) -> None:
    import json

    from control.errors import UserError
    from control.lifecycle import image_meta
    try:
        meta = json.loads((directory / image_meta.IMAGE_META).read_text())
    except (OSError, ValueError):
        return  # no thaw metadata (a plain runsc image): nothing to say
    if not isinstance(meta, dict) or meta.get("door", "cli") != "cli":
        return  # thawd's: its container's node makes the spec at restore
    local = image_meta.node_local(meta)
    if local and not allow:
        raise UserError(f"image {directory} depends on this node: {'; '.join(local)}. A node without them "
                        "cannot restore it; push with --allow-node-local if every restoring node has them at "
                        "the same paths", node_local=local)


@click.command("pull")
@click.argument("key")
@store_options
@json_option
@click.pass_obj
@handle_errors
def pull_cmd(obj: Context, key: str) -> None:
    """Make KEY's image ready in this node's cache (fetching only what is missing)."""
    from control.images import image as images
    s = obj.settings
    bar = Bar(f"pull {key}", obj.progress)
    r = images.pull(images.open_cache(s), _store(obj), key, _node(obj), workers=s.store_workers,
                    progress=bar, on_total=bar.set_total, fresh_s=s.cache_scrub_interval_s)
    bar.close()
    r.lease.release()
    f = r.fill

    def human(d: dict) -> str:
        if r.hit:
            return f"{key}: cached at {r.lease.path} ({_size(r.manifest_size)})"
        return (f"{key}: fetched into {r.lease.path}: {_size(r.manifest_size)}, {f.fetched_chunks} chunks "
                f"({_size(f.fetched_bytes)}) from the store, {f.local_chunks} from this node, "
                f"{f.zero_chunks} zero, in {f.seconds:.2f} s") + "".join(f"\n  {n}" for n in r.notes)
    obj.emit(r.to_dict(), human)


@click.command("ls")
@click.option("--local", "local_only", is_flag=True, help="Only this node's cache.")
@store_options
@json_option
@click.pass_obj
@handle_errors
def ls_cmd(obj: Context, local_only: bool) -> None:
    """Images in this node's cache and in the store: size, age, last use (cached ones), tenant,
    whether this node can restore them (and why not), and who holds the cached ones."""
    from control.images import image as images
    s = obj.settings
    d = images.listing(images.open_cache(s), None if local_only else _store(obj), _node(obj))
    from control.thawd.quarantine import read_quarantine
    quarantined = read_quarantine(s)
    for e in d["local"]:
        e["quarantined"] = quarantined.get(e["key"])

    def human(d: dict) -> str:
        lines = [f"node tuple {d['node_tuple_hash'][:12]}; cache {_size(d['cache_used_bytes'])} of "
                 f"{_size(d['cache_budget_bytes'])}",
                 f"LOCAL  {'KEY':<32} {'TUPLE':<12} {'SIZE':>11} {'AGE':>5} {'USED':>5} {'TENANT':<20} STATE"]
        lines += [f"  {e['key']:<37} {e['tuple_hash'][:12]} {_size(e['size']):>11} {_ago(e['age_s']):>5} "
                  f"{_ago(e['last_used_s']):>5} {e['tenant']:<20} {e['state']:<8} "
                  f"{'match' if e['match'] else 'MISMATCH: ' + '; '.join(e['reasons'])}"
                  + (f" QUARANTINED: {e['quarantined']}" if e["quarantined"] else "")
                  + "".join(f"\n      held by {h}" for h in e["held_by"])
                  for e in d["local"]] or ["  (none)"]
        if not local_only:
            lines.append(f"REMOTE {'KEY':<32} {'TUPLE':<12} {'SIZE':>11} {'AGE':>5} {'':>5} {'TENANT':<20}")
            lines += [f"  {e['key']:<37} {e['tuple_hash'][:12]} {_size(e.get('size', 0)):>11} "
                      f"{_ago(e.get('age_s')):>5} {'':>5} {e['tenant']:<20} "
                      + ("match" if e["match"] else ("MISMATCH: " if e.get("valid", True) else "INVALID: ")
                         + "; ".join(e["reasons"]))
                      for e in d["remote"]] or ["  (none)"]
        return "\n".join(lines)
    obj.emit(d, human)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(value: str | None, option: str) -> float | None:
    """Seconds of "90", "90s", "12h", "30d"; None for None."""
    if value is None:
        return None
    from control.errors import UserError
    v = value.strip().lower()
    try:
        return float(v[:-1]) * _UNITS[v[-1]] if v and v[-1] in _UNITS else float(v)
    except ValueError:
        raise UserError(f"{option} {value!r}: expected seconds, or a number with s, m, h or d", field=option) from None


def _ago(seconds: float | None) -> str:
    """90 -> "1m", 7200 -> "2h": the largest whole unit ("-" when unknown)."""
    if seconds is None:
        return "-"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{int(seconds // n)}{unit}"
    return f"{max(0, int(seconds))}s"


@click.command("gc")
@click.option("--store", "with_store", is_flag=True,
              help="Also collect the tenant's store: retention, then packs and chunk pointers no live image "
                   "needs (two runs at least store.gc_grace_s apart; docs/operate.md).")
@click.option("--dry-run", is_flag=True, help="With --store: say what would go, delete nothing.")
@click.option("--max-age", default=None, help="With --store: remove images published longer ago than this "
              "(90s, 12h, 30d) [store.retain_max_age_s].")
@click.option("--keep", type=click.IntRange(min=0), default=None,
              help="With --store: keep this many newest images per workload and tuple [store.retain_keep].")
@click.option("--all-tenants", is_flag=True, help="With --store, as root: every tenant of the store, one by one.")
@store_options
@json_option
@click.pass_obj
@handle_errors
def gc_cmd(obj: Context, with_store: bool, dry_run: bool, max_age: str | None, keep: int | None,
           all_tenants: bool) -> None:
    """Remove crash leftovers and corrupt entries; evict least recently used entries over budget.
    With --store, also the tenant's store garbage (dry run: --dry-run)."""
    from control.errors import UserError
    from control.images import image as images
    if (dry_run or max_age or keep is not None or all_tenants) and not with_store:
        raise UserError("--dry-run, --max-age, --keep and --all-tenants are options of the store GC: add --store")
    s = obj.settings
    out: dict = {}
    if not dry_run:
        cache = images.open_cache(s)
        busy: list[str] = []
        out = cache.gc(on_busy=busy.append)
        out["busy_keys"] = busy
    if with_store:
        out["store"] = _store_gc(obj, dry_run, _duration(max_age, "--max-age"), keep, all_tenants)

    def human(d: dict) -> str:
        lines = []
        if "evicted" in d:
            lines.append(f"removed {len(d['removed_partial_or_orphan'])} leftovers, evicted {len(d['evicted'])} "
                         f"entries; cache {_size(d['used_bytes'])} of {_size(d['budget_bytes'])}")
        for t in d.get("store", []):
            lines.append(t["summary"] if "summary" in t else f"tenant {t['tenant']}: error: {t['error']}")
            lines += [f"  {'would remove' if dry_run else 'removed'} {r['key']} ({r['tuple_hash'][:12]}): {r['why']}"
                      for r in t.get("removed_manifests", [])]
        return "\n".join(lines)
    obj.emit(out, human)
    if any("error" in t for t in out.get("store", [])):
        sys.exit(69)


def _store_gc(obj: Context, dry_run: bool, max_age_s: float | None, keep: int | None,
              all_tenants: bool) -> list[dict]:
    from control.errors import PreconditionError, ThawError
    from control.images import gc
    from control.images.keys import Keyring
    from control.images.source import tenant_store
    from control.images.store import Store
    s = obj.settings
    age = s.store_retain_max_age_s if max_age_s is None else max_age_s
    keep = s.store_retain_keep if keep is None else keep
    if all_tenants:
        if os.geteuid() != 0:
            raise PreconditionError("`thaw gc --store --all-tenants` needs root: it reads every tenant's images")
        root, ring = Store(s), Keyring.from_settings(s)
        views = [(t, lambda t=t: tenant_store(s, t, root, ring)) for t in root.list_dirs("tenants/")]
    else:
        views = [(None, lambda: _store(obj))]
    out = []
    for tenant, view in views:
        try:
            st = view()
            r = gc.collect(st, grace_s=s.store_gc_grace_s, max_age_s=age, keep=keep, dry_run=dry_run,
                           workers=s.store_workers)
        except ThawError as e:
            if not all_tenants:
                raise
            out.append({"tenant": tenant, "error": str(e)})   # the others are still collected
            continue
        out.append({**r.to_dict(), "summary": r.summary()})
    return out


@click.command("rm")
@click.argument("key")
@click.option("--tuple", "tuple_hash", default=None, help="Only the image of this tuple hash (or its prefix).")
@click.option("--dry-run", is_flag=True, help="Say what would go, delete nothing.")
@store_options
@json_option
@click.pass_obj
@handle_errors
def rm_cmd(obj: Context, key: str, tuple_hash: str | None, dry_run: bool) -> None:
    """Remove KEY's image from the store (its manifests and pod tables; the packs go with the next store GCs)
    and from this node's cache. Other nodes' caches keep their copies until evicted."""
    from control.images import gc
    from control.images import image as images
    removed = gc.remove(_store(obj), key, tuple_hash, dry_run=dry_run)
    cache = images.open_cache(obj.settings)
    entries = [e for e in cache.entries(key) if tuple_hash is None or e.tuple.hash().startswith(tuple_hash)]
    evicted, kept = [], []
    for e in entries:
        if dry_run:
            evicted.append(e.id)
        elif cache.evict(e.id):
            evicted.append(e.id)
        else:
            kept.append({"id": e.id, "why": _lease_why(cache, e.id)})
    d = {"key": key, "removed": removed, "evicted": evicted, "kept": kept, "dry_run": dry_run}
    verb = "would remove" if dry_run else "removed"
    obj.emit(d, lambda d: "\n".join([f"{key}: {verb} {len(removed)} store objects, "
                                      f"{'would evict' if dry_run else 'evicted'} {len(evicted)} cache entries"]
                                     + [f"  kept {k['id']}: {k['why']}" for k in kept]))


def _lease_why(cache, entry_id: str) -> str:
    holders = getattr(cache, "lease_holders", None)
    who = holders(entry_id) if holders else []
    return "leased by " + ", ".join(who) if who else "leased"


@click.command("verify")
@click.argument("key", required=False)
@store_options
@json_option
@click.pass_obj
@handle_errors
def verify_cmd(obj: Context, key: str | None) -> None:
    """Re-hash every cached chunk (of KEY); corrupt entries are evicted (the next pull refetches)."""
    from control.images import image as images
    rows = images.verify(images.open_cache(obj.settings), key)
    if key is not None and not rows:
        raise NotFound("image", key, "this node's cache holds no entry of it (`thaw ls --local` lists them)")
    obj.emit(rows, lambda rs: "\n".join(
        f"{r['id']}: {'ok' if r['ok'] else 'CORRUPT: ' + r['problem'] + (' (evicted)' if r['evicted'] else ' (in use)')}"
        for r in rs) or "cache is empty")
    if any(not r["ok"] for r in rows):
        sys.exit(65)


COMMANDS = [push_cmd, pull_cmd, ls_cmd, gc_cmd, rm_cmd, verify_cmd]
