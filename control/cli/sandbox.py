"""`thaw run | checkpoint | restore | ps | delete | health | sandbox-gc | demo`: sandboxes thaw runs itself.

`thaw health ID` is usable as a readiness probe: exit status 0 when every
probe passes and the sandbox's gate is open (traffic reaches it), 1 when not
ready (a probe failed, or the gate is still closed), 2 for a bad request.
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

from control.cli.common import Context, handle_errors, json_option
from control.errors import UserError
from control.cli.progress import Progress


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


def run_sandbox(obj: Context, o: RunOptions) -> dict:
    from runsc_hooks import network as netmod
    from runsc_hooks import spec as specmod
    if bool(o.bundle) == bool(o.command):
        raise UserError("give either --bundle DIR or a command after --, not both or neither")
    sb = _sandboxes(obj)
    if o.bundle:
        spec = specmod.Bundle(o.bundle).load()
        rootfs = specmod.Bundle(o.bundle).rootfs(spec)
        spec["root"]["path"] = str(rootfs.resolve())
        for m in spec.get("mounts", []):  # relative bind sources are relative to the bundle
            if m.get("type") == "bind" and not str(m.get("source", "/")).startswith("/"):
                m["source"] = str((o.bundle / m["source"]).resolve())
    else:
        env = {}
        for kv in o.env:
            if "=" not in kv:
                raise UserError(f"--env {kv!r} must be KEY=VALUE")
            k, v = kv.split("=", 1)
            env[k] = v
        rootfs = specmod.prepare_host_rootfs(obj.settings.state_dir / "rootfs" / o.id)
        exe = o.command[0]
        spec = specmod.command_spec(list(o.command), rootfs=str(rootfs), env=env,
                                    extra_mounts=specmod.host_layout([*o.binds, *(p for p in [exe] if p.startswith("/"))]))
    ports = tuple(netmod.Port.parse(p) for p in o.publish)
    rec = sb.run(o.id, spec, network=o.network, probes=o.probes, ports=ports)
    return {"id": rec.id, "state": rec.state.value, "address": (rec.net or {}).get("sandbox_ip"),
            "ports": (rec.net or {}).get("ports", []), "probes": rec.probes}


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
@click.argument("command", nargs=-1)
@json_option
@click.pass_obj
@handle_errors
def run_cmd(obj: Context, sid: str, bundle: Path | None, env: tuple[str, ...], binds: tuple[str, ...],
            network: bool, probes: tuple[str, ...], publish: tuple[str, ...], command: tuple[str, ...]) -> None:
    """Run a workload in a new runsc sandbox, from a bundle or a command (after --).

    A command runs on the host's own filesystem, bound read-only, with a
    private /tmp.
    """
    with Progress(not obj.json).step(f"run {sid}"):
        out = run_sandbox(obj, RunOptions(sid, bundle, command, env, network, binds, probes, publish))
    obj.emit(out, lambda d: f"{d['id']}: {d['state']}" + (f" at {d['address']}" if d["address"] else ""))


@click.command("checkpoint")
@click.argument("sid")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="New image directory.")
@click.option("--leave-running", is_flag=True, help="Keep the sandbox running after the save.")
@json_option
@click.pass_obj
@handle_errors
def checkpoint_cmd(obj: Context, sid: str, out: Path, leave_running: bool) -> None:
    """Checkpoint sandbox SID into a new image directory."""
    with Progress(not obj.json).step(f"checkpoint {sid} -> {out}"):
        res = _sandboxes(obj).checkpoint(sid, out, leave_running=leave_running)
    obj.emit({"image": str(res.image), "checkpoint_s": round(res.seconds, 3), "image_bytes": res.image_bytes},
             lambda d: f"{d['image']}: {d['image_bytes'] / 1e6:.1f} MB in {d['checkpoint_s']:.2f}s")


@click.command("restore")
@click.argument("image", type=click.Path(path_type=Path))
@click.option("--id", "sid", required=True, help="Id of the restored sandbox.")
@click.option("--probe", "probes", multiple=True, help="Health probe (repeatable; default: the image's).")
@click.option("--cold-fallback", is_flag=True,
              help="When the restore fails or is unhealthy, start the image's workload cold instead.")
@json_option
@click.pass_obj
@handle_errors
def restore_cmd(obj: Context, image: Path, sid: str, probes: tuple[str, ...], cold_fallback: bool) -> None:
    """Restore an image directory as a new sandbox; traffic is let in once it is healthy."""
    from runsc_hooks import probe as probemod
    parsed = [probemod.parse(p) for p in probes] or None
    sb = _sandboxes(obj)
    with Progress(not obj.json).step(f"restore {image} as {sid}"):
        if cold_fallback:
            out = sb.warm_start(image, sid, probes=parsed).to_dict()
        else:
            out = {"mode": "restored", **sb.restore(image, sid, probes=parsed).to_dict()}
    obj.emit(out, lambda d: f"{d['id']}: running ("
             + (f"restored in {d.get('restore_s', d.get('seconds', 0)):.2f}s" if d["mode"] == "restored"
                else f"started cold: {d['fallback_reason']}") + ")"
             + (f" at {d['address']}" if d["address"] else ""))


@click.command("ps")
@json_option
@click.pass_obj
@handle_errors
def ps_cmd(obj: Context) -> None:
    """List sandboxes (thaw's records joined with runsc's)."""
    rows = _sandboxes(obj).ps()

    def human(rs: list[dict]) -> str:
        lines = [f"{'ID':<28} {'STATE':<14} {'RUNSC':<10} {'PID':>7}  {'GATE':<6} {'ADDRESS':<15} PORTS"]
        for r in rs:
            lines.append(f"{r['id']:<28} {r['state']:<14} {r['runsc_status']:<10} {r['pid']:>7}  "
                         f"{r['gate'] or '-':<6} {r['address'] or '-':<15} {','.join(r['ports']) or '-'}")
        return "\n".join(lines)
    obj.emit(rows, human)


@click.command("delete")
@click.argument("sid")
@click.option("--force", is_flag=True, help="Kill a running sandbox first.")
@json_option
@click.pass_obj
@handle_errors
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
def demo_cmd(obj: Context, keep: bool, model_mb: int | None) -> None:
    """Cold-start a model server in a sandbox, checkpoint it, restore it, compare."""
    from control.dev import demo
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
    result, gate_closed = Sandboxes(obj.settings).health(o.id, probes,
                                                         probemod.Policy(o.timeout_s, o.attempt_timeout_s))
    gate = None if gate_closed is None else ("closed" if gate_closed else "open")
    return {"id": o.id, "ready": result.healthy and gate != "closed", "gate": gate, **result.to_dict()}


def _human(d: dict) -> str:
    lines = [f"{d['id']}: {'ready' if d['ready'] else 'NOT READY'} (healthy: {d['healthy']}, gate: {d['gate'] or '-'}, "
             f"{d['seconds']:.3f}s)"]
    for p in d["probes"]:
        lines.append(f"  {p['probe']:<32} {'ok' if p['ok'] else 'FAILED':<7} {p['attempts']:>3} attempt(s) "
                     f"{p['seconds']:.3f}s  {p['detail']}")
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
def health_cmd(obj: Context, sid: str, probes: tuple[str, ...], timeout_s: float | None,
               attempt_timeout_s: float | None) -> None:
    """Check sandbox SID now; exit 0 only when it is healthy and its gate is open."""
    obj.override("thawd.health_timeout_s", timeout_s)  # validated against the key's range
    obj.override("thawd.health_attempt_timeout_s", attempt_timeout_s)
    s = obj.settings
    out = health(obj, HealthOptions(sid, probes, s.thawd_health_timeout_s, s.thawd_health_attempt_timeout_s))
    obj.emit(out, _human)
    sys.exit(EXIT_READY if out["ready"] else EXIT_NOT_READY)


COMMANDS = [health_cmd, run_cmd, checkpoint_cmd, restore_cmd, ps_cmd, delete_cmd, sandbox_gc_cmd, demo_cmd]
