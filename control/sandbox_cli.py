"""`thaw run | checkpoint | restore | ps | delete | demo`."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from control.cli import Context, handle_errors, json_option
from control.errors import UserError
from control.progress import Progress
from control.sandbox import Sandboxes
from runsc_hooks import spec as specmod


def _sandboxes(obj: Context, debug: bool = False) -> Sandboxes:
    return Sandboxes(obj.settings, debug_log=debug)


@dataclass(frozen=True)
class RunOptions:
    id: str
    bundle: Path | None
    command: tuple[str, ...]
    env: tuple[str, ...]
    network: bool
    binds: tuple[str, ...]


def run_sandbox(obj: Context, o: RunOptions) -> dict:
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
    rec = sb.run(o.id, spec, network=o.network)
    return {"id": rec.id, "state": rec.state.value, "address": (rec.net or {}).get("sandbox_ip")}


@click.command("run")
@click.option("--id", "sid", required=True, help="Sandbox id.")
@click.option("--bundle", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="An OCI bundle directory (config.json + rootfs).")
@click.option("--env", multiple=True, help="KEY=VALUE for a command sandbox (repeatable).")
@click.option("--bind", "binds", multiple=True, help="Host path to bind read-only (repeatable).")
@click.option("--network/--no-network", default=True, help="Plumb a netns and address (default) or none.")
@click.argument("command", nargs=-1)
@json_option
@click.pass_obj
@handle_errors
def run_cmd(obj: Context, sid: str, bundle: Path | None, env: tuple[str, ...], binds: tuple[str, ...],
            network: bool, command: tuple[str, ...]) -> None:
    """Run a workload in a new runsc sandbox, from a bundle or a command (after --).

    A command runs on the host's own filesystem, bound read-only, with a
    private /tmp.
    """
    with Progress(not obj.json).step(f"run {sid}"):
        out = run_sandbox(obj, RunOptions(sid, bundle, command, env, network, binds))
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
@json_option
@click.pass_obj
@handle_errors
def restore_cmd(obj: Context, image: Path, sid: str) -> None:
    """Restore an image directory as a new sandbox."""
    with Progress(not obj.json).step(f"restore {image} as {sid}"):
        res = _sandboxes(obj).restore(image, sid)
    obj.emit({"id": res.id, "restore_s": round(res.seconds, 3), "address": res.sandbox_ip},
             lambda d: f"{d['id']}: running (restored in {d['restore_s']:.2f}s)"
             + (f" at {d['address']}" if d["address"] else ""))


@click.command("ps")
@json_option
@click.pass_obj
@handle_errors
def ps_cmd(obj: Context) -> None:
    """List sandboxes (thaw's records joined with runsc's)."""
    rows = _sandboxes(obj).ps()

    def human(rs: list[dict]) -> str:
        lines = [f"{'ID':<28} {'STATE':<14} {'RUNSC':<10} {'PID':>7}  ADDRESS"]
        for r in rs:
            lines.append(f"{r['id']:<28} {r['state']:<14} {r['runsc_status']:<10} {r['pid']:>7}  {r['address'] or '-'}")
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


@click.command("demo")
@click.option("--keep", is_flag=True, help="Keep the image directory afterwards.")
@click.option("--model-mb", default=None, type=click.IntRange(8, 4096),
              help="Size of the demo model's in-memory state.")
@json_option
@click.pass_obj
@handle_errors
def demo_cmd(obj: Context, keep: bool, model_mb: int | None) -> None:
    """Cold-start a model server in a sandbox, checkpoint it, restore it, compare."""
    from control import demo
    t0 = time.monotonic()
    res = demo.run(obj.settings, Progress(not obj.json, sys.stderr), keep=keep, model_mb=model_mb)
    res["total_s"] = round(time.monotonic() - t0, 2)
    obj.emit(res, demo.table)
    if not res["verified"]:
        sys.exit(1)


COMMANDS = [run_cmd, checkpoint_cmd, restore_cmd, ps_cmd, delete_cmd, demo_cmd]
