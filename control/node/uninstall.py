"""`thaw uninstall`: undo `thaw provision` on this node.

Plan, then apply, as provision does (control/node/provision.py: its Plan,
Layout and Command). What provision wrote goes: the thawd unit (stopped and
disabled first), the containerd drop-in, /etc/thaw/runsc.toml, thaw's CDI spec,
the huge-page boot settings, the binaries in <node.install_dir>/bin. The
containerd main config becomes what it was before provision changed it
(containerd_config.undo_import: byte for byte from provision's backup when one
matches). Kept unless --purge: /etc/thaw/config.toml, the cache, state and logs.
The host's huge-page settings stay as they are until the next boot (sysfs).

It refuses while sandboxes thaw or containerd's shim runs are on the node
(their runsc would go): `thaw ps`, `ctr task ls`; --force removes anyway.
The release's own files (<prefix>/releases, the `thaw` link) are install.sh's
to remove (`install.sh --uninstall` runs this first).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from control.config import DEFAULT_CONFIG_FILE, Settings
from control.errors import PreconditionError, ProvisionError, ThawError, UserError
from control.node import containerd_config as cc
from control.node import provision as prov
from control.node.provision import NONE, RUN, SKIP, Command, Layout, Plan, Skip, Step

REMOVE, RESTORE = "remove", "restore"


@dataclass(frozen=True)
class Options:
    root: Path = Path("/")
    dry_run: bool = False
    restart_containerd: bool = False
    purge: bool = False      # also the config file, cache, state and logs
    force: bool = False      # even with sandboxes on the node


class RemovePath(Step):
    """A file or link provision wrote; a directory only when it is empty
    (`tree`: the whole directory, --purge only)."""

    def __init__(self, name: str, layout: Layout, path: Path, *, empty_dir: bool = False,
                 tree: bool = False) -> None:
        self.name, self.empty_dir, self.tree = name, empty_dir, tree
        self.target = layout.host(path)

    def plan(self, earlier: list[Plan]) -> Plan:
        t = self.target
        if not t.exists() and not t.is_symlink():
            return Plan(self.name, str(t), NONE, "absent")
        going = {p.target for p in earlier if p.action == REMOVE}   # planned before this one
        if self.empty_dir and t.is_dir() and not t.is_symlink() and any(str(c) not in going for c in t.iterdir()):
            return Plan(self.name, str(t), SKIP, "not empty: kept", warning=False)
        if t.is_dir() and not t.is_symlink() and not (self.tree or self.empty_dir):
            return Plan(self.name, str(t), SKIP, "a directory, not what provision wrote: kept", warning=True)
        return Plan(self.name, str(t), REMOVE, "")

    def apply(self, plan: Plan) -> None:
        if self.tree:
            shutil.rmtree(self.target)
        elif self.target.is_dir() and not self.target.is_symlink():
            self.target.rmdir()
        else:
            self.target.unlink()


class RestoreContainerdConfig(Step):
    """The containerd main config as it was before provision (containerd_config.undo_import)."""

    name = "containerd config"

    def __init__(self, layout: Layout, config: Path, dropin_dir: Path) -> None:
        self.config, self.dropin_dir = config, dropin_dir
        self.target = layout.host(config)
        self.undo: cc.ImportsUndo | None = None

    def backups(self) -> list[tuple[Path, str]]:
        base = self.target.with_name(self.target.name + ".thaw-backup")
        found, n, p = [], 1, base
        while p.is_file():
            found.append((p, p.read_text()))
            n += 1
            p = base.with_name(f"{base.name}.{n}")
        return found

    def plan(self, earlier: list[Plan]) -> Plan:
        t = str(self.target)
        text = self.target.read_text() if self.target.is_file() else None
        try:
            self.undo = cc.undo_import(text, self.config, self.dropin_dir, self.backups())
        except UserError as e:
            return Plan(self.name, t, SKIP, e.message, warning=True)
        action = {"none": NONE, "delete": REMOVE, "write": RESTORE}[self.undo.action]
        return Plan(self.name, t, action, self.undo.reason)

    def apply(self, plan: Plan) -> None:
        assert self.undo is not None
        if self.undo.action == "delete":
            self.target.unlink()
            return
        assert self.undo.text is not None
        mode = self.target.stat().st_mode & 0o7777
        prov.write_atomic(self.target, mode, data=self.undo.text.encode())
        if self.undo.backup is not None:
            self.undo.backup.unlink()


def _ours(earlier: list[Plan], step: str) -> bool:
    return any(p.step == step and p.action in (REMOVE, RESTORE) for p in earlier)


def steps(settings: Settings, opts: Options) -> list[Step]:
    """Every step, in order: the reverse of provision.steps."""
    lay = Layout(opts.root)
    live = prov.systemd_running(opts.root)
    unit = lay.host(prov.UNIT)
    out: list[Step] = []
    if live and unit.exists():
        out.append(Command("stop thawd", ["systemctl", "disable", "--now", "thawd.service"],
                           lambda e: (True, "the unit is installed")))
    else:
        out.append(Skip("stop thawd", str(unit), "no unit, or systemd not running here: stop `thaw serve` "
                        "yourself if it runs", warning=False))
    out += [RemovePath("enable thawd", lay, prov.UNIT_WANTS), RemovePath("thawd unit", lay, prov.UNIT)]
    if live:
        out.append(Command("systemd reload", ["systemctl", "daemon-reload"],
                           lambda e: (_ours(e, "thawd unit"), "the unit was removed")))
    out.append(RemovePath("containerd drop-in", lay, cc.dropin_path(settings)))
    restore = RestoreContainerdConfig(lay, settings.containerd_config, settings.containerd_dropin_dir)
    out.append(restore)
    out.append(_DropinDir(lay, settings.containerd_dropin_dir))
    out += [RemovePath("runsc.toml", lay, prov.RUNSC_TOML),
            RemovePath("cdi spec", lay, prov.CDI_SPEC),
            RemovePath("huge pages at boot", lay, prov.THP_TMPFILES)]
    bindir = settings.install_dir / "bin"
    out += [RemovePath(f"remove {name}", lay, bindir / name) for name, _ in prov.BINARIES]
    out.append(RemovePath("install-dir", lay, bindir, empty_dir=True))
    out.append(RemovePath("install prefix", lay, settings.install_dir, empty_dir=True))
    if opts.purge:
        out += [RemovePath("thaw config", lay, DEFAULT_CONFIG_FILE),
                RemovePath("cache dir", lay, settings.cache_dir, tree=True),
                RemovePath("state dir", lay, settings.state_dir, tree=True),
                RemovePath("log dir", lay, settings.log_dir, tree=True)]
    out.append(RemovePath("/etc/thaw", lay, DEFAULT_CONFIG_FILE.parent, empty_dir=True))
    if opts.restart_containerd:
        out.append(Command("restart containerd", list(settings.containerd_restart_command),
                           lambda e: (_ours(e, "containerd config") or _ours(e, "containerd drop-in"),
                                      "its config changed") if opts.root == Path("/")
                           else (False, "--root: not the live node")))
    return out


class _DropinDir(RemovePath):
    """The drop-in directory, when empty and no longer imported (the main config
    was provision's, or its import was taken out)."""

    def __init__(self, layout: Layout, path: Path) -> None:
        super().__init__("containerd drop-in dir", layout, path, empty_dir=True)

    def plan(self, earlier: list[Plan]) -> Plan:
        if not _ours(earlier, "containerd config"):
            return Plan(self.name, str(self.target), SKIP, "the main config still names it: kept", warning=False)
        return super().plan(earlier)


def sandboxes_on_node(settings: Settings, root: Path = Path("/")) -> list[str]:
    """Sandboxes whose runsc would go with the binaries: thaw's own (records in
    <node.state_dir>/sandboxes) and containerd's (runsc state files under
    containerd.runsc_root/<namespace>)."""
    lay = Layout(root)
    found = [f"thaw sandbox {p.stem}" for p in sorted(lay.host(settings.state_dir / "sandboxes").glob("*.json"))]
    runsc_root = lay.host(settings.containerd_runsc_root)
    found += [f"containerd container {p.parent.name}/{p.name.split('_sandbox:')[0]}"
              for p in sorted(runsc_root.glob("*/*.state"))]
    return found


def uninstall(settings: Settings, opts: Options) -> list[Plan]:
    """Plan every step; apply those that change something (not with dry_run)."""
    if not opts.force and not opts.dry_run:
        left = sandboxes_on_node(settings, opts.root)
        if left:
            shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            raise PreconditionError(f"{len(left)} sandbox(es) still on this node ({shown}): delete them first "
                                    "(`thaw delete`, `ctr task rm`), or pass --force", sandboxes=left)
    todo = steps(settings, opts)
    plans: list[Plan] = []
    for step in todo:
        plans.append(step.plan(plans))
    if opts.dry_run:
        return plans
    done: list[str] = []
    for step, plan in zip(todo, plans, strict=True):
        if plan.action in (NONE, SKIP):
            plan.result = "unchanged" if plan.action == NONE else "skipped"
            continue
        try:
            step.apply(plan)
        except (OSError, ThawError) as e:
            plan.result = "failed"
            raise ProvisionError(plan.step, f"{plan.target}: {e}", done, verb="uninstall") from e
        plan.result = {REMOVE: "removed", RESTORE: "restored", RUN: "ran"}[plan.action]
        done.append(f"{plan.result} {plan.target} ({plan.step})")
    return plans


def removed_anything(plans: list[Plan]) -> bool:
    return any(p.result in ("removed", "restored", "ran") for p in plans)
