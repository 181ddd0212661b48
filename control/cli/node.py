"""`thaw provision`, `thaw doctor`, `thaw uninstall`: options → control.node.provision / uninstall."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from control.node import doctor as doctormod
    from control.node import provision as prov

from control import config as configmod
from control.cli.common import Context, handle_errors, json_option, needs_root
from control.errors import PreconditionError, ProvisionError, UserError, exit_code

_root_option = click.option(
    "--root", "root", type=click.Path(file_okay=False, path_type=Path), default=Path("/"), show_default=True,
    help="Act on the node tree under DIR (tests, images); its etc/thaw/config.toml is read "
         "unless --config or THAW_CONFIG say otherwise.")


def _thaw_command() -> tuple[str, ...]:
    """How the systemd unit runs this thaw: its console script, else the module."""
    script = Path(sys.executable).parent / "thaw"
    return (str(script),) if script.is_file() else (sys.executable, "-m", "control.cli.main")


def _checks_text(checks: list[doctormod.Check]) -> str:
    return "\n".join(f"  {c.status:<5} {c.name:<33} {c.detail}" for c in checks)


def _tuple_text(compat: dict) -> str:
    lines = []
    for k, v in compat.items():
        v = ",".join(v) if isinstance(v, list) else v
        lines.append(f"  {k:<22} {v}")
    return "\n".join(lines)


def _report_text(r: prov.Report) -> str:
    out = ["node checks:", _checks_text(r.checks), "",
           "plan (dry run: nothing is changed):" if r.dry_run else "steps:"]
    for p in r.plans:
        word = p.result or p.action
        out.append(f"  {word:<9} {p.step:<33} {p.target}" + (f"  [{p.detail}]" if p.detail else ""))
    out += ["", "compatibility tuple:", _tuple_text(r.compat)]
    for n in r.notes:
        out.append(f"note: {n}")
    if r.dry_run:
        n = len(r.changes)
        out.append(f"dry run: {n} step{'s' if n != 1 else ''} would change something" if n else
                   "dry run: nothing would change")
    elif any(p.result == "failed" for p in r.plans):
        out.append("provisioning stopped at the failed step; the steps above it are done")
    elif r.changes:
        counts: dict[str, int] = {}
        for p in r.plans:
            counts[p.result] = counts.get(p.result, 0) + 1
        out.append("provisioned: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    else:
        out.append("provisioned: nothing changed")
    return "\n".join(out)


@click.command("provision")
@click.option("--dry-run", is_flag=True, help="Print the checks and the plan; change nothing.")
@_root_option
@click.option("--from", "source_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory holding the binaries to install [default: a checkout's build/ "
                   "(`make setup`), a release install's <prefix>/releases/<version>/bin].")
@click.option("--no-systemd", is_flag=True, help="Do not write or enable the thawd unit (thawd runs elsewhere).")
@click.option("--restart-containerd", is_flag=True,
              help="Run containerd.restart_command when containerd's config changed.")
@json_option
@click.pass_obj
@handle_errors
def provision_cmd(obj: Context, dry_run: bool, root: Path, source_dir: Path | None, no_systemd: bool,
                  restart_containerd: bool) -> None:
    """Turn this node into a thaw node: check it, install runsc, the shim, the
    stand-in and the CUDA helper, write runsc.toml, the containerd drop-in,
    a CDI spec, the cache directory and the thawd unit. Idempotent."""
    from control.node import provision as prov
    settings = obj.settings_under(root.resolve())
    source_dir = source_dir or configmod.INSTALL.source_bin
    if source_dir is None:
        raise UserError("--from DIR: name the directory of the binaries to install (this thaw runs "
                        "neither from a checkout nor from a release install, which have a default)")
    opts = prov.Options(source_dir=source_dir.resolve(),
                        root=root.resolve(), dry_run=dry_run, systemd=not no_systemd,
                        restart_containerd=restart_containerd,
                        thaw_command=_thaw_command())
    report: prov.Report | None = None
    try:
        report = prov.provision(settings, opts)
    except (PreconditionError, ProvisionError) as e:
        report = getattr(e, "report", None)
        if obj.json:
            click.echo(json.dumps({**(report.to_dict() if report else {}), "error": e.to_dict()},
                                  indent=2, default=str))
            click.echo(f"thaw: error: {e}", err=True)
            sys.exit(exit_code(e))
        if report is not None:
            click.echo(_report_text(report))
        raise
    obj.emit(report.to_dict(), lambda _: _report_text(report))


@click.command("doctor")
@_root_option
@click.option("--no-systemd", is_flag=True, help="thawd runs without systemd (the DaemonSet): "
              "do not check its unit.")
@json_option
@click.pass_obj
@handle_errors
def doctor_cmd(obj: Context, root: Path, no_systemd: bool) -> None:
    """Check this node: pass / warn / fail per line; exit non-zero on any fail
    (usable as a readiness probe)."""
    from control.node import doctor as doctormod
    from control.node import provision as prov
    settings = obj.settings_under(root.resolve())
    opts = prov.Options(source_dir=prov.Layout(root.resolve()).host(settings.install_dir / "bin"),
                        root=root.resolve(), systemd=not no_systemd,
                        thaw_command=_thaw_command(), compare_binaries=False)
    checks, compat = prov.doctor_checks(settings, opts)
    status = doctormod.worst(checks)
    obj.emit({"status": status, "checks": [c.to_dict() for c in checks], "compatibility_tuple": compat},
             lambda _: _checks_text(checks) + "\n\ncompatibility tuple:\n" + _tuple_text(compat)
             + f"\n\ndoctor: {status}")
    if status == doctormod.FAIL:
        failed = [c.name for c in checks if c.status == doctormod.FAIL]
        e = PreconditionError(f"doctor found {len(failed)} failing check(s): {', '.join(failed)}")
        click.echo(f"thaw: error: {e}", err=True)  # the report (or its JSON) is on stdout already
        sys.exit(exit_code(e))


@click.command("uninstall")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@_root_option
@click.option("--restart-containerd", is_flag=True,
              help="Run containerd.restart_command when containerd's config changed.")
@click.option("--purge", is_flag=True, help="Also remove /etc/thaw/config.toml, the cache, state and logs.")
@click.option("--force", is_flag=True, help="Even while sandboxes of thaw or of containerd's shim are on the node.")
@json_option
@click.pass_obj
@handle_errors
@needs_root("uninstall removes what provision wrote under /etc and the install directory, and edits containerd's config")
def uninstall_cmd(obj: Context, dry_run: bool, root: Path, restart_containerd: bool, purge: bool,
                  force: bool) -> None:
    """Undo `thaw provision`: stop thawd, remove what provision wrote and give
    containerd back the config it had. Keeps the config file, cache, state and
    logs unless --purge."""
    from control.node import uninstall as un
    settings = obj.settings_under(root.resolve())
    plans = un.uninstall(settings, un.Options(root=root.resolve(), dry_run=dry_run,
                                              restart_containerd=restart_containerd, purge=purge, force=force))

    def human(_: object) -> str:
        out = ["plan (dry run: nothing is changed):" if dry_run else "steps:"]
        out += [f"  {p.result or p.action:<9} {p.step:<33} {p.target}" + (f"  [{p.detail}]" if p.detail else "")
                for p in plans]
        if not dry_run:
            out.append("uninstalled" if un.removed_anything(plans) else "uninstalled: nothing was there")
        return "\n".join(out)
    obj.emit({"dry_run": dry_run, "steps": [p.to_dict() for p in plans]}, human)


COMMANDS = [provision_cmd, doctor_cmd, uninstall_cmd]
