"""`thaw run | checkpoint | restore | ps | logs | delete | health | sandbox-gc | demo`: sandboxes thaw runs itself.

`thaw health ID` is usable as a readiness probe: exit status 0 when every
probe passes and the sandbox's gate is open (traffic reaches it), 1 when not
ready (a probe failed, the gate is still closed, or the workload exited: then
at once, with its exit status), 2 for a bad request.

`thaw checkpoint` exits 73 (EX_CANTCREAT) when no image was made
(CheckpointFailed: the workload keeps running and no partial image is left).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from control.lifecycle.sandbox import Sandboxes

from control.cli.common import Context, handle_errors, json_option, needs_root
from control.errors import IntegrityError, NoSpace, PreconditionError, ThawError, UserError, WorkloadExited
from control.cli.progress import Progress


ROOT_WHY = "runsc refuses create and restore with --rootless, and sandbox state is root's"
RUN_TAIL_LINES = 10   # of a workload that exits during `thaw run` (node.run_grace_s), shown before the error


def _sandboxes(obj: Context, debug: bool = False) -> Sandboxes:
    from control.lifecycle.sandbox import Sandboxes
    return Sandboxes(obj.settings, debug_log=debug)


@dataclass(frozen=True)
class RunOptions:
    id: str
    bundle: Path | None
    command: tuple[str, ...]
    env: tuple[str, ...]
    network: bool
    binds: tuple[str, ...]
    probes: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()
    gpus: str | None = None       # --gpus text (control/lifecycle/gpus.py parse_request)


def run_sandbox(obj: Context, o: RunOptions) -> dict:
    from control.lifecycle.sandbox import validate_id
    from runsc_hooks import network as netmod
    from runsc_hooks import probe as probemod
    from runsc_hooks import spec as specmod
    # Bad input is refused before anything is made: the id names directories under the state dir.
    validate_id(o.id)
    if bool(o.bundle) == bool(o.command):
        raise UserError("give either --bundle DIR or a command after --, not both or neither")
    ports = tuple(netmod.Port.parse(p) for p in o.publish)
    probemod.parse_all(o.probes)
    sb = _sandboxes(obj)
    if o.bundle:
        spec = specmod.Bundle(o.bundle).load()
        rootfs = specmod.Bundle(o.bundle).rootfs(spec)
        spec["root"]["path"] = str(rootfs.resolve())
        for m in spec.get("mounts", []):  # relative bind sources are relative to the bundle
            if m.get("type") == "bind" and not str(m.get("source", "/")).startswith("/"):
                m["source"] = str((o.bundle / m["source"]).resolve())
    else:
        from control.config import caller_path
        env = {}
        for kv in o.env:
            if "=" not in kv:
                raise UserError(f"--env {kv!r} must be KEY=VALUE")
            k, v = kv.split("=", 1)
            env[k] = v
        env.setdefault("PATH", specmod.sandbox_path(caller_path(), o.binds))
        exe = _check_command(o.command[0], env["PATH"], o.binds)
        rootfs = specmod.prepare_host_rootfs(obj.settings.state_dir / "rootfs" / o.id)
        spec = specmod.command_spec(list(o.command), rootfs=str(rootfs), env=env,
                                    extra_mounts=specmod.host_layout([*o.binds, *(p for p in [exe] if p.startswith("/"))]))
    from control.lifecycle import gpus as gpumod
    names = tuple(gpumod.parse_request(o.gpus)) if o.gpus is not None else ()
    rec = sb.run(o.id, spec, network=o.network, probes=o.probes, ports=ports, gpus=names)
    t0 = time.monotonic()
    ex = sb.watch(rec.id, obj.settings.run_grace_s)
    if ex is not None:
        files, _ = sb.logs(rec.id)
        tail = files.tail(RUN_TAIL_LINES)[0].decode(errors="replace").splitlines()
        raise WorkloadExited(rec.id, ex.describe(), time.monotonic() - t0, tail)
    return {"id": rec.id, "state": rec.state.value, "address": (rec.net or {}).get("sandbox_ip"),
            "ports": (rec.net or {}).get("ports", []), "probes": rec.probes, "gpus": rec.gpus,
            "log": str(sb.logs(rec.id)[0].log)}


def _check_command(exe: str, path: str | None, binds: tuple[str, ...]) -> str:
    """What runsc would refuse with a two-line error of its own, refused here in one
    line (exit 2): a --bind path or the command missing on the node."""
    import os
    import shutil

    from runsc_hooks import spec as specmod
    for b in binds:
        if not os.path.isabs(b) or not os.path.exists(b):
            raise UserError(f"--bind {b}: no such path on this node (give an absolute path that exists)", path=b)
    if "/" in exe:
        if not os.path.isabs(exe):
            raise UserError(f"command {exe}: give an absolute path or a name on the sandbox's PATH", command=exe)
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            raise UserError(f"command {exe}: no such executable file on this node", command=exe)
        return exe
    # The host layout binds the node's system directories: the sandbox finds
    # what the node finds on the sandbox's PATH.
    if shutil.which(exe, path=path or specmod.DEFAULT_PATH) is None:
        raise UserError(f"command {exe!r} is not on the sandbox's PATH ({path or specmod.DEFAULT_PATH})",
                        command=exe)
    return exe


@click.command("run")
@click.option("--id", "sid", required=True, help="Sandbox id.")
@click.option("--bundle", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="An OCI bundle directory (config.json + rootfs).")
@click.option("--env", multiple=True, help="KEY=VALUE for a command sandbox (repeatable).")
@click.option("--bind", "binds", multiple=True, help="Host path to bind read-only (repeatable).")
@click.option("--network/--no-network", default=True, help="Plumb a netns and address (default) or none.")
@click.option("--probe", "probes", multiple=True,
              help="Health probe kept for restores: tcp:PORT | http:PORT/PATH[=STATUS][~BODY] | "
                   "gpu:PORT/PATH[#FIELD] | exec:CMD (repeatable).")
@click.option("--publish", "-p", "publish", multiple=True,
              help="Publish NODE_PORT:SANDBOX_PORT (TCP) on network.publish_address (repeatable).")
@click.option("--gpus", default=None, metavar="all|N[,M]|UUID|CDI",
              help="GPUs for the sandbox: all, NVML indexes (0 or 0,1), a UUID (GPU-...) or CDI names "
                   "(nvidia.com/gpu=0), injected from this node's CDI specs (else generated from NVML), "
                   "with the CUDA checkpoint helper. A --bundle's cdi.k8s.io/* annotations are injected too.")
@click.argument("command", nargs=-1)
@json_option
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def run_cmd(obj: Context, sid: str, bundle: Path | None, env: tuple[str, ...], binds: tuple[str, ...],
            network: bool, probes: tuple[str, ...], publish: tuple[str, ...], gpus: str | None,
            command: tuple[str, ...]) -> None:
    """Run a workload in a new runsc sandbox, from a bundle or a command (after --).

    A command runs on the host's own filesystem, bound read-only, with a
    private /tmp and HOME (/root); its PATH is yours, less what the sandbox
    cannot see, then /usr/local/sbin:...:/bin. Its stdout and stderr go to a
    bounded log (`thaw logs ID`). One that exits within node.run_grace_s fails
    the command, with its last lines.
    """
    try:
        with Progress(not obj.json).step(f"run {sid}"):
            out = run_sandbox(obj, RunOptions(sid, bundle, command, env, network, binds, probes, publish, gpus))
    except WorkloadExited as e:
        if not obj.json:   # the workload's own last lines, then thaw's one error line
            click.echo(f"thaw: {sid}: the workload's last {len(e.log_tail)} line(s):", err=True)
            for line in e.log_tail:
                click.echo(f"  | {line}", err=True)
        raise
    warn_huge_pages(obj, sid)
    obj.emit(out, lambda d: f"{d['id']}: {d['state']}" + (f" at {d['address']}" if d["address"] else "")
             + (f" with {', '.join(d['gpus'])}" if d["gpus"] else ""))


def warn_huge_pages(obj: Context, sid: str, sb=None, thp_dir: Path | None = None) -> str:
    """Once per command: a GPU sandbox on a host without shmem huge pages (node.huge_pages:
    its GPU restores are slower, docs/gpu.md). Returns the warning it printed ("" for none)."""
    from control.node import provision
    s = obj.settings
    rec = (sb or _sandboxes(obj)).get(sid)
    if s.huge_pages == "no" or rec is None or not (rec.nvproxy or rec.gpus):
        return ""
    why = provision.huge_pages_off(thp_dir or provision.THP_DIR)
    if not why:
        return ""
    msg = (f"thaw: warning: host huge pages are off ({why}): runsc backs {sid}'s memory with 4 KiB pages, "
           "and GPU restores are slower (`thaw provision` sets them: node.huge_pages)")
    click.echo(msg, err=True)
    return msg


@click.command("checkpoint")
@click.argument("sid")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="New image directory.")
@click.option("--leave-running", is_flag=True, help="Keep the sandbox running after the save.")
@json_option
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def checkpoint_cmd(obj: Context, sid: str, out: Path, leave_running: bool) -> None:
    """Checkpoint sandbox SID into a new image directory."""
    with Progress(not obj.json).step(f"checkpoint {sid} -> {out}"):
        res = _sandboxes(obj).checkpoint(sid, out, leave_running=leave_running)
    obj.emit({"image": str(res.image), "checkpoint_s": round(res.seconds, 3), "image_bytes": res.image_bytes},
             lambda d: f"{d['image']}: {d['image_bytes'] / 1e6:.1f} MB in {d['checkpoint_s']:.2f}s")


@click.command("restore")
@click.argument("image", type=click.Path(path_type=Path), required=False)
@click.option("--from-store", "key", help="Restore the image of workload KEY: from the node cache, else from "
              "the store, streamed while it arrives (store.stream, on by default; else pulled first).")
@click.option("--id", "sid", required=True, help="Id of the restored sandbox.")
@click.option("--probe", "probes", multiple=True, help="Health probe (repeatable; default: the image's).")
@click.option("--cold-fallback", is_flag=True,
              help="When the restore fails or is unhealthy, start the image's workload cold instead.")
@click.option("--gpus", default=None, metavar="all|N[,M]|UUID|CDI",
              help="GPUs to restore a GPU image onto (as many as it was saved with, same model and "
                   "driver); default: the GPU indexes it was saved on.")
@json_option
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def restore_cmd(obj: Context, image: Path | None, key: str | None, sid: str, probes: tuple[str, ...],
                cold_fallback: bool, gpus: str | None) -> None:
    """Restore an image directory (or, with --from-store, a workload's image) as a new sandbox;
    traffic is let in once it is healthy."""
    from control.lifecycle import gpus as gpumod
    from runsc_hooks import probe as probemod
    if (image is None) == (key is None):
        raise UserError("give an image directory or --from-store KEY (one of them)")
    parsed = [probemod.parse(p) for p in probes] or None
    names = gpumod.parse_request(gpus) if gpus is not None else None
    sb = _sandboxes(obj)
    with Progress(not obj.json).step(f"restore {image or key} as {sid}"):
        if key is not None:
            out = restore_from_store(obj, sb, key, sid, parsed, cold_fallback, names)
        else:
            out = restore_directory(obj, sb, image, sid, parsed, cold_fallback, names)
    warn_huge_pages(obj, sid, sb)
    obj.emit(out, lambda d: f"{d['id']}: running ("
             + (f"restored in {d.get('restore_s', d.get('seconds', 0)):.2f}s" if d["mode"] == "restored"
                else f"started cold: {d['fallback_reason']}") + ")"
             + (f" at {d['address']}" if d["address"] else ""))


def restore_directory(obj: Context, sb, image: Path, sid: str, probes: list | None, cold_fallback: bool,
                      gpus: list[str] | None) -> dict:
    """`thaw restore DIR`. A DIR holding a thaw manifest (a cache entry `thaw pull` printed) is
    read through thaw-gofer with every chunk checked (issue 30), as a cache hit is; any other
    (a `thaw checkpoint --out` directory: nothing names its chunks) is read by runsc directly."""
    from control.images import image as images
    from control.images import served
    view = served.for_directory(obj.settings, image, images.open_cache(obj.settings))
    if view is None:
        if cold_fallback:
            return sb.warm_start(image, sid, probes=probes, gpus=gpus).to_dict()
        return {"mode": "restored", **sb.restore(image, sid, probes=probes, gpus=gpus).to_dict()}
    kw = {"runsc_env": tuple(view.env().items()), "gpus": gpus, "source": image, "settle": False}
    try:
        if cold_fallback:
            start = sb.warm_start(view.path, sid, probes=probes, **kw)
            out = start.to_dict()
            if start.restore is not None:
                out.update(start.restore.to_dict())
            failed = view.verdict() if out.get("mode") != "restored" else None
            if failed is not None:
                out["fallback_reason"] = f"corrupt: {failed.message}"
        else:
            try:
                out = {"mode": "restored", **sb.restore(view.path, sid, probes=probes, **kw).to_dict()}
            except ThawError as e:
                raise view.verdict() or e
        if out["mode"] == "restored":
            out = _loaded(sb, obj.settings, view, str(image), sid, out, cold_fallback, probes, gpus)
    finally:
        view.release()
    return out


def restore_from_store(obj: Context, sb, key: str, sid: str, probes: list | None, cold_fallback: bool,
                       gpus: list[str] | None = None) -> dict:
    """`thaw restore --from-store KEY`: a cache hit restores from the entry, through
    thaw-gofer with every chunk checked as runsc reads it (cache.verify = read, issue 30);
    a miss streams (store.stream: runsc restores at once, the image goes on arriving) or
    pulls, then restores. Either way the command returns once the sandbox has loaded every
    page, so an altered byte anywhere in the image is reported here (exit 65, or a cold
    start with --cold-fallback), and the entry ends up in the cache as after a pull."""
    from control.images import image as images
    from control.images import stream as streammod
    from control.images.source import open_restorable
    from control.cli.images import _store
    from control.node.compat import node_tuple
    s = obj.settings
    t0 = time.monotonic()
    # The store as this command's tenant sees it (issue 13): its prefix, keys, manifest checks.
    cache, store, node = images.open_cache(s), _store(obj), node_tuple(s)
    # A hit restores from the cache (through thaw-gofer, checked: images/source.py); a miss
    # streams (store.stream on, the default), unless `why` says why not.
    src, why, _ = open_restorable(cache, store, s, key, node)
    streamed = src.streamed
    # A Stream or a checked read knows why the sentry's reads failed (a plain lease: stat mode).
    checked = src.checked
    kw = {"runsc_env": tuple(src.env().items()), "background": True} if streamed else \
        {"runsc_env": tuple(src.env().items())}
    kw["source"] = src.source   # messages and the record name the entry, not the view runsc reads
    if checked:   # restoring until every page is in (_loaded): a kill meanwhile leaves nothing that looks done
        kw["settle"] = False
    kw["gpus"] = gpus
    try:
        if cold_fallback:
            start = sb.warm_start(src.path, sid, probes=probes, **kw)
            out = start.to_dict()
            if start.restore is not None:
                out.update(start.restore.to_dict())
            failed = src.verdict() if checked and out.get("mode") != "restored" else None
            if failed is not None:
                # Its stream failed or the entry's bytes are altered, so runsc gave up on
                # the restore: that is why it started cold, as thawd says for a container.
                out["fallback_reason"] = streammod.failure_reason(failed)
        else:
            try:
                out = {"mode": "restored", **sb.restore(src.path, sid, probes=probes, **kw).to_dict()}
            except ThawError as e:
                # A stream that failed (a full cache: NoSpace, exit 4) or an altered chunk
                # (IntegrityError, exit 65) is why runsc gave up.
                raise (src.verdict() or e) if checked else e
        out["source"] = "stream" if streamed else ("cache" if src.hit else "pull")
        if why and s.store_stream:
            out["pulled_whole"] = why
        out["ready_s"] = round(time.monotonic() - t0, 4)
        if streamed:
            # The sandbox answers; its image goes on arriving. Wait for the end of
            # both: the entry in the cache, every page in the sandbox.
            src.wait()
            out["stream"] = src.to_dict()
        if checked and out["mode"] == "restored":
            out = _loaded(sb, s, src, key, sid, out, cold_fallback, probes, gpus)
    finally:
        src.release()
    return out


def _loaded(sb, s, src, key: str, sid: str, out: dict, cold_fallback: bool, probes, gpus) -> dict:
    """Wait until the restored sandbox has every page (its background load reads the rest of
    the image through thaw-gofer); a failure there is the stream's or an altered chunk's:
    the sandbox is removed and the error raised, or with --cold-fallback it starts cold."""
    try:
        sb.wait_restored(sid, s.runsc_timeout_s)
        sb.settled(sid)
        return out
    except ThawError as e:
        sb.delete(sid, force=True)
        failed = src.verdict()
        if cold_fallback and failed is not None and not src.streamed:
            start = sb.cold_start(src.path, sid, f"corrupt: {failed.message}", probes=probes, gpus=gpus)
            return {**start.to_dict(), **{k: out[k] for k in ("source", "ready_s") if k in out}}
        how = "streamed in" if src.streamed else "loaded"
        msg = f"the restore of {key} as {sid} failed while its image {how} ({failed or e}); the sandbox was removed"
        if isinstance(failed, NoSpace):   # exit 4, as a pull into a full cache
            raise NoSpace(msg, **failed.fields) from None
        if isinstance(failed, IntegrityError):   # exit 65: altered bytes (a cached entry is marked corrupt)
            raise IntegrityError(failed.where, failed.chunk, f"{failed.message.split(': ', 1)[-1]}; the restore of "
                                 f"{key} as {sid} failed while its image {how}, the sandbox was removed") from None
        raise ThawError(msg) from None



@click.command("ps")
@json_option
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def ps_cmd(obj: Context) -> None:
    """List sandboxes (thaw's records joined with runsc's)."""
    rows = _sandboxes(obj).ps()

    def human(rs: list[dict]) -> str:
        lines = [f"{'ID':<28} {'STATE':<14} {'RUNSC':<10} {'PID':>7}  {'GATE':<6} {'ADDRESS':<15} {'PORTS':<12} "
                 "GPUS / EXIT"]
        for r in rs:
            extra = r["exit"] if r["exit"] else ",".join(g.split("=", 1)[-1] for g in r["gpus"]) or "-"
            lines.append(f"{r['id']:<28} {r['state']:<14} {r['runsc_status']:<10} {r['pid']:>7}  "
                         f"{r['gate'] or '-':<6} {r['address'] or '-':<15} {','.join(r['ports']) or '-':<12} {extra}")
        return "\n".join(lines)
    obj.emit(rows, human)


@click.command("logs")
@click.argument("sid")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the workload has exited.")
@click.option("--tail", "tail", type=click.IntRange(min=0), default=None,
              help="Only the last N lines (of what is kept: node.log_max_bytes, twice at most).")
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def logs_cmd(obj: Context, sid: str, follow: bool, tail: int | None) -> None:
    """Print a sandbox's stdout and stderr (thaw run/restore sandboxes; kept in
    <node.log_dir>/sandboxes/ID/, rotated at node.log_max_bytes)."""
    from control.lifecycle import logs as logsmod
    files, alive = _sandboxes(obj).logs(sid)
    out = sys.stdout.buffer
    data, size = files.tail(tail)
    out.write(data)
    out.flush()
    if follow:
        try:
            for chunk in logsmod.follow(files, size, alive):
                out.write(chunk)
                out.flush()
        except KeyboardInterrupt:
            pass
        ex = files.exit()
        if ex is not None:
            click.echo(f"thaw: {sid}: the workload exited: {ex.describe()}", err=True)


@click.command("delete")
@click.argument("sid")
@click.option("--force", is_flag=True, help="Kill a running sandbox first.")
@json_option
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def delete_cmd(obj: Context, sid: str, force: bool) -> None:
    """Delete a sandbox and everything thaw made for it."""
    _sandboxes(obj).delete(sid, force=force)
    obj.emit({"id": sid, "deleted": True}, f"{sid}: deleted")


@click.command("sandbox-gc")
@click.option("--orphans", is_flag=True,
              help="Also remove thaw network objects (netns, veth, nftables rules) of sandboxes with no record here.")
@click.option("--prefix", default="", help="With --orphans: only sandbox names starting with this.")
@json_option
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def sandbox_gc_cmd(obj: Context, orphans: bool, prefix: str) -> None:
    """Recover after a crash: remove what dead thaw processes left (containers, netns, gates, NAT)."""
    actions = _sandboxes(obj).recover(orphans=orphans, prefix=prefix)
    obj.emit(actions, lambda a: "\n".join(f"{x['action']} {x['id']}: {x['reason']}" for x in a) or "nothing to do")


@click.command("demo")
@click.option("--keep", is_flag=True, help="Keep the image directory afterwards.")
@click.option("--model-mb", default=None, type=click.IntRange(8, 4096),
              help="Size of the demo model's in-memory state.")
@json_option
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def demo_cmd(obj: Context, keep: bool, model_mb: int | None) -> None:
    """Cold-start a model server in a sandbox, checkpoint it, restore it, compare (from a checkout)."""
    try:
        from control.dev import demo
    except ImportError:   # the wheel leaves the dev harness out (pyproject.toml)
        raise PreconditionError("`thaw demo` runs from a checkout of thaw (`make demo`): its harness "
                                "(control/dev) is not part of a node install") from None
    t0 = time.monotonic()
    res = demo.run(obj.settings, Progress(not obj.json, sys.stderr), keep=keep, model_mb=model_mb)
    res["total_s"] = round(time.monotonic() - t0, 2)
    obj.emit(res, demo.table)
    if not res["verified"]:
        sys.exit(1)


EXIT_READY = 0
EXIT_NOT_READY = 1


@dataclass(frozen=True)
class HealthOptions:
    id: str
    probes: tuple[str, ...]       # empty: the sandbox's own probes
    timeout_s: float
    attempt_timeout_s: float


def health(obj: Context, o: HealthOptions) -> dict:
    from control.lifecycle.sandbox import Sandboxes
    from runsc_hooks import probe as probemod
    probes = [probemod.parse(p) for p in o.probes] or None  # parse at the edge: a bad probe is a UserError
    sb = Sandboxes(obj.settings)
    result, gate_closed = sb.health(o.id, probes, probemod.Policy(o.timeout_s, o.attempt_timeout_s,
                                                                  "thawd.health_timeout_s, or --timeout"))
    gate = None if gate_closed is None else ("closed" if gate_closed else "open")
    out = {"id": o.id, "ready": result.healthy and gate != "closed", "gate": gate, **result.to_dict(),
           "exited": None}
    if not result.healthy and sb.gone(o.id):
        ex = sb.exit_of(o.id)
        out["exited"] = ex.describe() if ex else "exit status unknown"
    return out


def _human(d: dict) -> str:
    if d.get("exited"):
        return f"{d['id']}: NOT READY: the workload exited ({d['exited']}); `thaw logs {d['id']}` has its output"
    lines = [f"{d['id']}: {'ready' if d['ready'] else 'NOT READY'} (healthy: {d['healthy']}, gate: {d['gate'] or '-'}, "
             f"{d['seconds']:.3f}s)"]
    for p in d["probes"]:
        lines.append(f"  {p['probe']:<32} {'ok' if p['ok'] else 'FAILED':<7} {p['attempts']:>3} attempt(s) "
                     f"{p['seconds']:.3f}s  {p['detail']}")
    if not d["healthy"] and d.get("deadline_s"):
        lines.append(f"  the check's deadline: {d['deadline_s']:g} s ({d['setting']})")
    return "\n".join(lines)


@click.command("health")
@click.argument("sid")
@click.option("--probe", "probes", multiple=True,
              help="running | tcp:PORT | http:PORT/PATH[=STATUS][~BODY] | gpu:PORT/PATH[#FIELD] | exec:CMD "
                   "(repeatable; default: the sandbox's own probes).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Deadline of the whole check in seconds [thawd.health_timeout_s].")
@click.option("--attempt-timeout", "attempt_timeout_s", type=float, default=None,
              help="Deadline of one probe attempt in seconds [thawd.health_attempt_timeout_s].")
@json_option
@click.pass_obj
@handle_errors
@needs_root(ROOT_WHY)
def health_cmd(obj: Context, sid: str, probes: tuple[str, ...], timeout_s: float | None,
               attempt_timeout_s: float | None) -> None:
    """Check sandbox SID now; exit 0 only when it is healthy and its gate is open."""
    obj.override("thawd.health_timeout_s", timeout_s)  # validated against the key's range
    obj.override("thawd.health_attempt_timeout_s", attempt_timeout_s)
    s = obj.settings
    out = health(obj, HealthOptions(sid, probes, s.thawd_health_timeout_s, s.thawd_health_attempt_timeout_s))
    obj.emit(out, _human)
    sys.exit(EXIT_READY if out["ready"] else EXIT_NOT_READY)


COMMANDS = [health_cmd, run_cmd, checkpoint_cmd, restore_cmd, ps_cmd, logs_cmd, delete_cmd, sandbox_gc_cmd,
            demo_cmd]
