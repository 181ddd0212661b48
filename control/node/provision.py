"""`thaw provision`: turn a node into a thaw node, idempotently.

Plan, then apply. Every step inspects the tree and says what it would do
(create / update / none / skip / run); `--dry-run` prints that plan and stops.
Applying runs the steps in order, each write atomic (temp name, fsync,
rename); a failing step raises ProvisionError naming it and listing what the
steps before it changed. A second run plans `none` everywhere.

`root` makes every path relative to a directory tree (tests, images, a
DaemonSet with the host mounted elsewhere); file contents always name the
paths the node itself will see. docs/provision.md describes every step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from control.node import containerd_config as cc
from control.node import doctor
from control import config
from control.config import DEFAULT_CONFIG_FILE, Settings
from control.errors import PreconditionError, ProvisionError, ThawError
from control.files import write_file_atomic
from nvproxy import cdi, helper
from nvproxy.gpu import NodeGpus

RUNSC_TOML = Path("/etc/thaw/runsc.toml")
UNIT = Path("/etc/systemd/system/thawd.service")
UNIT_WANTS = Path("/etc/systemd/system/multi-user.target.wants/thawd.service")
# The CDI spec provision writes when no spec defines nvidia.com/gpu: in the
# static directory (cdi.CDI_DIRS[0]), which outlives a reboot (/var/run does not).
CDI_SPEC = cdi.CDI_DIRS[0] / "thaw-nvidia.json"

CREATE, UPDATE, NONE, SKIP, RUN = "create", "update", "none", "skip", "run"

# Host shmem THP (node.huge_pages). runsc backs a sandbox's memory file with huge
# pages only when shmem_enabled is "advise" and defrag one of THP_DEFRAG_OK
# (runsc/boot/loader.go createMemoryFile: the others may direct-compact where
# native anonymous memory would not). Not "always": it halves nvproxy's pageable
# copies (gVisor #12804). Measured on the H200: docs/gpu.md "Measured (H200, 2026-12-01)".
THP_DIR = Path("/sys/kernel/mm/transparent_hugepage")
THP_SHMEM = "advise"
THP_DEFRAG_OK = ("always", "defer", "never")
THP_DEFRAG = "defer"          # wakes kcompactd instead of compacting in the fault
THP_TMPFILES = Path("/etc/tmpfiles.d/thaw-huge-pages.conf")   # systemd-tmpfiles writes sysfs at boot
THP_NAMES = ("shmem_enabled", "defrag")

# What provision installs into <node.install_dir>/bin: (file name, required).
# The stand-in is optional until it is built (go/cmd/thaw-runsc): without it
# the shim runs the real runsc and every start is cold. The CUDA helper is
# required on GPU nodes only.
BINARIES = (
    ("runsc", True),
    ("containerd-shim-runsc-v1", True),
    ("thaw-runsc", False),
    ("thaw-runsc-hooks", False),   # thaw-runsc execs it for create/start/delete; runsc itself when absent
    ("thaw-cuda-checkpoint", False),
    ("thaw-chunk", True),          # thawd chunks every image it publishes (pack.chunker)
    ("thaw-fetch", True),          # and fetches every image it pulls (store.fetcher)
    ("thaw-gofer", True),          # and streams every image it does not hold (store.gofer, store.stream)
    ("thaw-ctrinfo", True),        # and asks containerd whose a container is (containerd.info, issue 13)
    ("thaw-monitor", False),       # `thaw run/restore` sandboxes' log and exit status (control/lifecycle/logs.py)
    ("thaw-relay", False),         # a parked sandbox's stdio (park.enabled; control/thawd/parking.py)
)
STANDIN = "thaw-runsc"
HOOKS = "thaw-runsc-hooks"
CUDA_HELPER = helper.BINARY_NAME
MONITOR = "thaw-monitor"   # twin: control/lifecycle/logs.py MONITOR_BINARY
RELAY = "thaw-relay"       # twin: control/thawd/parking.py RELAY_BINARY


@dataclass(frozen=True)
class Options:
    source_dir: Path                  # where the built binaries are (`make setup`: ./build)
    root: Path = Path("/")
    dry_run: bool = False
    systemd: bool = True              # write and enable the thawd unit
    restart_containerd: bool = False  # run containerd.restart_command if its config changed
    thaw_command: tuple[str, ...] = ("thaw",)
    compare_binaries: bool = True     # doctor: existence and mode only


@dataclass
class Plan:
    step: str
    target: str
    action: str                # create | update | none | skip | run
    detail: str = ""
    warning: bool = False      # a skip the operator should know about
    error: str = ""            # the step cannot be planned: provision changes nothing, doctor fails it
    result: str = ""           # after apply: created | updated | unchanged | skipped | ran

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Report:
    checks: list[doctor.Check]
    plans: list[Plan]
    compat: dict
    notes: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def failed_checks(self) -> list[doctor.Check]:
        return [c for c in self.checks if c.status == doctor.FAIL]

    @property
    def changes(self) -> list[Plan]:
        return [p for p in self.plans if p.action in (CREATE, UPDATE, RUN)]

    def to_dict(self) -> dict:
        # changed: something was changed; planned_changes: steps that would
        # change something (the dry run's answer, or what this run set out to do).
        return {"dry_run": self.dry_run, "planned_changes": len(self.changes),
                "changed": any(p.result in ("created", "updated", "ran") for p in self.plans),
                "checks": [c.to_dict() for c in self.checks],
                "steps": [p.to_dict() for p in self.plans],
                "compatibility_tuple": self.compat, "notes": self.notes}


class Layout:
    """Maps the node's paths into the tree being provisioned."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def host(self, path: Path) -> Path:
        if not path.is_absolute():
            raise ThawError(f"{path}: expected an absolute path")
        return self.root / path.relative_to("/")


# -- steps ------------------------------------------------------------------------

class Step:
    name = ""

    def plan(self, earlier: list[Plan]) -> Plan:
        raise NotImplementedError

    def apply(self, plan: Plan) -> None:
        raise NotImplementedError


class WriteFile(Step):
    """A file with given content (or a copy of `source`) and mode."""

    def __init__(self, name: str, layout: Layout, dest: Path, mode: int, *, content: str | None = None,
                 source: Path | None = None, only_if_absent: bool = False, compare: bool = True) -> None:
        self.name, self.dest, self.mode = name, dest, mode
        self.target = layout.host(dest)
        self.content = content.encode() if content is not None else None
        self.source = source
        self.only_if_absent = only_if_absent
        self.compare = compare

    def plan(self, earlier: list[Plan]) -> Plan:
        t = self.target
        mode = f"{self.mode:04o}"
        if not t.exists() and not t.is_symlink():
            if self.content is None and (self.source is None or not self.source.is_file()):
                return Plan(self.name, str(t), CREATE, f"missing, and no source {self.source} to install from")
            return Plan(self.name, str(t), CREATE, f"mode {mode}")
        if not t.is_file() or t.is_symlink():
            return Plan(self.name, str(t), UPDATE, "not a regular file: replaced")
        if self.only_if_absent:
            return Plan(self.name, str(t), NONE, "exists; left as it is")
        if self.compare and not self._same_content():
            return Plan(self.name, str(t), UPDATE, "content differs")
        have = t.stat().st_mode & 0o7777
        if have != self.mode:
            return Plan(self.name, str(t), UPDATE, f"mode {have:04o} -> {mode}")
        return Plan(self.name, str(t), NONE, f"up to date, mode {mode}")

    def _same_content(self) -> bool:
        if self.content is not None:
            return self.target.read_bytes() == self.content
        if self.source is None or not self.source.is_file():
            return True     # nothing to compare with: the installed copy stays
        if self.source.stat().st_size != self.target.stat().st_size:
            return False
        return _sha256(self.source) == _sha256(self.target)

    def apply(self, plan: Plan) -> None:
        if plan.action == UPDATE and plan.detail.startswith("mode "):
            os.chmod(self.target, self.mode)
            return
        if self.content is None and (self.source is None or not self.source.is_file()):
            raise ThawError(f"no source to install {self.target} from: {self.source} is missing")
        write_atomic(self.target, self.mode, data=self.content, source=self.source)


class MakeDir(Step):
    def __init__(self, name: str, layout: Layout, dest: Path, mode: int) -> None:
        self.name, self.mode = name, mode
        self.target = layout.host(dest)

    def plan(self, earlier: list[Plan]) -> Plan:
        mode = f"{self.mode:04o}"
        if not self.target.is_dir():
            return Plan(self.name, str(self.target), CREATE, f"directory, mode {mode}")
        have = self.target.stat().st_mode & 0o7777
        if have != self.mode:
            return Plan(self.name, str(self.target), UPDATE, f"mode {have:04o} -> {mode}")
        return Plan(self.name, str(self.target), NONE, f"exists, mode {mode}")

    def apply(self, plan: Plan) -> None:
        self.target.mkdir(parents=True, exist_ok=True)
        os.chmod(self.target, self.mode)


class Symlink(Step):
    """What `systemctl enable` does: a symlink in the target's .wants directory."""

    def __init__(self, name: str, layout: Layout, link: Path, points_to: Path) -> None:
        self.name, self.points_to = name, points_to
        self.target = layout.host(link)

    def plan(self, earlier: list[Plan]) -> Plan:
        want = str(self.points_to)
        if self.target.is_symlink():
            have = os.readlink(self.target)
            if have == want:
                return Plan(self.name, str(self.target), NONE, f"-> {want}")
            return Plan(self.name, str(self.target), UPDATE, f"-> {have} becomes -> {want}")
        if self.target.exists():
            return Plan(self.name, str(self.target), UPDATE, f"a file, replaced by a link -> {want}")
        return Plan(self.name, str(self.target), CREATE, f"-> {want}")

    def apply(self, plan: Plan) -> None:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.target.with_name(f".{self.target.name}.partial-{os.getpid()}")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(self.points_to, tmp)
        os.replace(tmp, self.target)


class ContainerdImports(Step):
    """Make the main containerd config import the drop-in directory (one line)."""

    name = "containerd-imports"

    def __init__(self, layout: Layout, config: Path, dropin_dir: Path) -> None:
        self.config, self.dropin_dir = config, dropin_dir
        self.target = layout.host(config)
        self.edit: cc.ImportsEdit | None = None

    def plan(self, earlier: list[Plan]) -> Plan:
        text = self.target.read_text() if self.target.is_file() else None
        self.edit = cc.ensure_import(text, self.config, self.dropin_dir)
        if self.edit.text is None:
            return Plan(self.name, str(self.target), NONE, self.edit.reason)
        action = CREATE if text is None else UPDATE
        detail = self.edit.reason + ("" if text is None else f"; backup {self.target.name}.thaw-backup")
        return Plan(self.name, str(self.target), action, detail)

    def apply(self, plan: Plan) -> None:
        assert self.edit is not None and self.edit.text is not None
        mode = 0o644
        if self.target.is_file():
            st = self.target.stat()
            mode = st.st_mode & 0o7777
            backup = _free_name(self.target.with_name(self.target.name + ".thaw-backup"))
            shutil.copy2(self.target, backup)
            plan.detail += f" (backup: {backup})"
        write_atomic(self.target, mode, data=self.edit.text.encode())


class Command(Step):
    """A command on the live node, run only when `when(earlier)` says so."""

    def __init__(self, name: str, argv: list[str], when: Callable[[list[Plan]], tuple[bool, str]]) -> None:
        self.name, self.argv, self.when = name, argv, when

    def plan(self, earlier: list[Plan]) -> Plan:
        run, why = self.when(earlier)
        return Plan(self.name, " ".join(self.argv), RUN if run else SKIP, why)

    def apply(self, plan: Plan) -> None:
        proc = subprocess.run(self.argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ThawError(f"`{' '.join(self.argv)}` exited {proc.returncode}: {tail[0]}")


class Skip(Step):
    def __init__(self, name: str, target: str, reason: str, warning: bool = True) -> None:
        self.name, self.target, self.reason, self.warning = name, target, reason, warning

    def plan(self, earlier: list[Plan]) -> Plan:
        return Plan(self.name, self.target, SKIP, self.reason, warning=self.warning)

    def apply(self, plan: Plan) -> None:  # pragma: no cover - skips are never applied
        pass


class CdiSpec(Step):
    """The node's CDI spec for its GPUs (nvproxy/cdi.py): left alone when a spec
    in the CDI directories other than ours defines nvidia.com/gpu (the NVIDIA
    container toolkit's, say); else ours, generated from the GPUs and the
    driver files on this node and kept in step with them.

    `generate` is nvproxy.cdi.generate (a seam for tests: its driver
    directories and device-node test)."""

    name = "cdi spec"

    def __init__(self, layout: Layout, gpus: NodeGpus,
                 generate: Callable[[NodeGpus], dict] = cdi.generate) -> None:
        self.layout, self.gpus, self.generate = layout, gpus, generate
        self.target = layout.host(CDI_SPEC)
        self.doc: dict | None = None

    def plan(self, earlier: list[Plan]) -> Plan:
        t = str(self.target)
        try:
            reg = cdi.load_dirs([self.layout.host(d) for d in cdi.CDI_DIRS], exclude=[self.target])
        except ThawError as e:
            why = f"cannot read the CDI specs already there: {e}"
            return Plan(self.name, t, SKIP, why, warning=True, error=why)
        theirs = [s.path for s in reg.specs if s.kind == cdi.NVIDIA_KIND]
        if theirs:
            return Plan(self.name, theirs[-1], SKIP, f"{cdi.NVIDIA_KIND} spec exists: {theirs[-1]}")
        try:
            self.doc = self.generate(self.gpus)
        except ThawError as e:
            why = f"cannot generate a CDI spec: {e}"
            return Plan(self.name, t, SKIP, why, warning=True, error=why)
        if not self.target.exists():
            return Plan(self.name, t, CREATE, "generated from this node's GPUs and driver files, mode 0644")
        try:
            same = json.loads(self.target.read_text()) == self.doc
        except (OSError, ValueError):
            same = False
        if not same:
            return Plan(self.name, t, UPDATE, "differs from this node's GPUs and driver files")
        have = self.target.stat().st_mode & 0o7777
        if have != 0o644:
            return Plan(self.name, t, UPDATE, f"mode {have:04o} -> 0644")
        return Plan(self.name, t, NONE, "up to date, mode 0644")

    def apply(self, plan: Plan) -> None:
        assert self.doc is not None
        cdi.write_spec(self.doc, self.target.parent, self.target.name, mode=0o644)


def thp_selected(text: str) -> str:
    """The selected word of a THP sysfs file ("always [madvise] never" -> "madvise");
    a file holding one bare word (a tree made for tests) is that word."""
    words = text.split()
    chosen = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else (words[0] if len(words) == 1 else "")


def thp_read(d: Path) -> dict[str, str]:
    """The selected value of each of the host's THP settings in `d` (THP_DIR, or its
    place in a tree); OSError when they cannot be read."""
    return {n: thp_selected((d / n).read_text()) for n in THP_NAMES}


def thp_write(d: Path, values: dict[str, str]) -> None:
    """Set the host's THP settings in `d` (thp_read's twin); sysfs: one write each,
    no temp file and rename."""
    for n, v in values.items():
        (d / n).write_text(v)


def huge_pages_off(thp_dir: Path = THP_DIR) -> str:
    """Why runsc backs a sandbox's memory with 4 KiB pages on this host, in
    words; "" when the host settings let it use huge pages (what HostHugePages sets)."""
    try:
        have = thp_read(thp_dir)
    except OSError as e:
        return f"cannot read {thp_dir} ({e.strerror or e})"
    bad = [f"{n} is {have[n] or '?'}" for n, ok in (("shmem_enabled", have["shmem_enabled"] == THP_SHMEM),
                                                    ("defrag", have["defrag"] in THP_DEFRAG_OK)) if not ok]
    return ", ".join(bad)


def thp_wanted(layout: Layout) -> dict[str, str]:
    """The values provision sets: shmem_enabled advise; the host's defrag where runsc
    accepts it, else defer."""
    try:
        defrag = thp_selected(layout.host(THP_DIR / "defrag").read_text())
    except OSError:
        defrag = ""
    return {"shmem_enabled": THP_SHMEM, "defrag": defrag if defrag in THP_DEFRAG_OK else THP_DEFRAG}


def thp_tmpfiles(values: dict[str, str]) -> str:
    return ("# Written by `thaw provision` (node.huge_pages): runsc backs a sandbox's memory with huge\n"
            "# pages only with these host settings (docs/provision.md).\n"
            + "".join(f"w {THP_DIR / name} - - - - {value}\n" for name, value in values.items()))


class HostHugePages(Step):
    """The host's shmem THP settings, now (sysfs); THP_TMPFILES keeps them across reboots."""

    name = "host huge pages"

    def __init__(self, layout: Layout, values: dict[str, str]) -> None:
        self.layout, self.values = layout, values
        self.dir = layout.host(THP_DIR)

    def plan(self, earlier: list[Plan]) -> Plan:
        t = str(self.dir)
        try:
            have = thp_read(self.dir)
        except OSError as e:
            return Plan(self.name, t, SKIP, f"cannot read the host's THP settings ({e}): runsc backs "
                        "sandboxes' memory with 4 KiB pages (slower GPU restores, docs/gpu.md)", warning=True)
        if have["shmem_enabled"] == THP_SHMEM and have["defrag"] in THP_DEFRAG_OK:
            return Plan(self.name, t, NONE, f"shmem_enabled {have['shmem_enabled']}, defrag {have['defrag']}")
        return Plan(self.name, t, UPDATE, ", ".join(f"{n} {have[n] or '?'} -> {v}" for n, v in self.values.items()
                                                   if have[n] != v))

    def apply(self, plan: Plan) -> None:
        # A value runsc takes is left alone.
        thp_write(self.dir, {n: v for n, v in self.values.items() if thp_selected((self.dir / n).read_text()) != v})


def huge_pages_steps(settings: Settings, lay: Layout, gpu: bool) -> list[Step]:
    if settings.huge_pages == "no" or (settings.huge_pages == "auto" and not gpu):
        why = ("node.huge_pages = no: the host's settings are left as they are" if settings.huge_pages == "no"
               else "CPU node (node.huge_pages = auto sets them on GPU nodes)")
        return [Skip("host huge pages", str(lay.host(THP_DIR)), why, warning=False),
                Skip("huge pages at boot", str(lay.host(THP_TMPFILES)), why, warning=False)]
    values = thp_wanted(lay)
    return [HostHugePages(lay, values),
            WriteFile("huge pages at boot", lay, THP_TMPFILES, 0o644, content=thp_tmpfiles(values))]


# -- the plan -------------------------------------------------------------------

def systemd_running(root: Path) -> bool:
    """systemd's own test (sd_booted): /run/systemd/system exists."""
    return root == Path("/") and Path("/run/systemd/system").is_dir()


def steps(settings: Settings, opts: Options, gpu: bool, gpus: NodeGpus = NodeGpus()) -> list[Step]:
    """Every step, in order, for this node. gpu: a GPU node (doctor.gpu_wanted);
    gpus: its GPUs, from nvproxy.gpu.probe (for the CDI spec)."""
    lay = Layout(opts.root)
    bindir = settings.install_dir / "bin"
    out: list[Step] = [MakeDir("install-dir", lay, bindir, 0o755)]

    installed: dict[str, bool] = {}
    for name, required in BINARIES:
        src, dest = opts.source_dir / name, bindir / name
        have = src.is_file() or lay.host(dest).is_file()
        needed = required or (name == CUDA_HELPER and gpu)
        installed[name] = have
        if not have and not needed:
            why = {STANDIN: "the runsc stand-in is not built yet (go/cmd/thaw-runsc): containerd's "
                            "shim will run the real runsc, every start is cold",
                   HOOKS: "the stand-in's create/start/delete part is not built (go/cmd/thaw-runsc-hooks): "
                          "the stand-in passes those to the real runsc, every start is cold",
                   CUDA_HELPER: "CUDA checkpoint helper not built (make setup); not needed on a CPU node",
                   MONITOR: "the sandbox monitor is not built (go/cmd/thaw-monitor): `thaw run` and "
                            "`thaw restore` refuse to start sandboxes here; containerd's are not "
                            "affected",
                   RELAY: "the parked sandboxes' stdio relay is not built (go/cmd/thaw-relay): with "
                          "park.enabled thawd parks nothing whose stdio is a pipe"}[name]
            out.append(Skip(f"install {name}", str(lay.host(dest)), f"{src} missing: {why}"))
            continue
        out.append(WriteFile(f"install {name}", lay, dest, 0o755, source=src, compare=opts.compare_binaries))

    out.append(WriteFile("thaw config", lay, DEFAULT_CONFIG_FILE, 0o644,
                         content=seed_config(settings), only_if_absent=True))
    binary = bindir / (STANDIN if installed[STANDIN] else "runsc")
    out.append(WriteFile("runsc.toml", lay, RUNSC_TOML, 0o644,
                         content=cc.runsc_toml(settings, binary, gpu=gpu)))
    out.append(MakeDir("containerd drop-in dir", lay, settings.containerd_dropin_dir, 0o755))
    out.append(WriteFile("containerd drop-in", lay, cc.dropin_path(settings), 0o644,
                         content=cc.containerd_dropin(settings.runtime_handler,
                                                      bindir / "containerd-shim-runsc-v1", RUNSC_TOML)))
    out.append(ContainerdImports(lay, settings.containerd_config, settings.containerd_dropin_dir))
    out.append(CdiSpec(lay, gpus) if gpu else
               Skip("cdi spec", str(lay.host(CDI_SPEC)), "CPU node: no CDI spec needed", warning=False))
    out += huge_pages_steps(settings, lay, gpu)
    out += [MakeDir("state dir", lay, settings.state_dir, 0o711),
            MakeDir("cache dir", lay, settings.cache_dir, 0o700),
            MakeDir("log dir", lay, settings.log_dir, 0o750),
            MakeDir("shim log dir", lay, settings.log_dir / "shim", 0o750)]

    if opts.systemd:
        out.append(WriteFile("thawd unit", lay, UNIT, 0o644, content=thawd_unit(opts.thaw_command)))
        out.append(Symlink("enable thawd", lay, UNIT_WANTS, UNIT))
        live = systemd_running(opts.root)
        out.append(Command("systemd reload", ["systemctl", "daemon-reload"],
                           lambda e: _changed(e, "thawd unit") if live else (False, _no_systemd(opts.root))))
        out.append(Command("start thawd", ["systemctl", "restart", "thawd.service"],
                           lambda e: _start_thawd(e, opts, live)))
    else:
        out.append(Skip("thawd unit", str(lay.host(UNIT)), "--no-systemd: thawd runs elsewhere "
                        "(the Kubernetes DaemonSet runs it in its pod)", warning=False))

    if opts.restart_containerd:
        out.append(Command("restart containerd", list(settings.containerd_restart_command),
                           lambda e: _changed(e, "containerd drop-in", "containerd-imports")
                           if opts.root == Path("/") else (False, _no_systemd(opts.root))))
    return out


def _changed(earlier: list[Plan], *names: str) -> tuple[bool, str]:
    hit = [p.step for p in earlier if p.step in names and p.action in (CREATE, UPDATE)]
    return (True, "changed: " + ", ".join(hit)) if hit else (False, "nothing it depends on changed")


def _no_systemd(root: Path) -> str:
    return "--root: not the live node" if root != Path("/") else "systemd is not running on this machine"


def _start_thawd(earlier: list[Plan], opts: Options, live: bool) -> tuple[bool, str]:
    if not live:
        return False, _no_systemd(opts.root) + ": start thawd yourself (`thaw serve`)"
    active = subprocess.run(["systemctl", "is-active", "--quiet", "thawd.service"]).returncode == 0
    changed = [p.step for p in earlier if p.step in ("thawd unit", "thaw config", "install runsc")
               and p.action in (CREATE, UPDATE)]
    if active and not changed:
        return False, "thawd is running"
    return True, "not running" if not active else "changed: " + ", ".join(changed)


def seed_config(settings: Settings) -> str:
    """/etc/thaw/config.toml for a node that has none: every key whose binary
    provision installs (Key.installed) at <node.install_dir>/bin, plus every key
    provision ran with that is not a default. The stand-in reads this file too."""
    items = []
    for k, value in config.values(settings):
        if k.installed and value is not None:
            items.append((k, settings.install_dir / "bin" / k.installed))
        elif value != k.default:
            items.append((k, value))
    return config.render_toml(items, header=(
        "# thaw configuration, written by `thaw provision` because none existed.",
        "# Every key, its default and its environment override: docs/configuration.md."))


def thawd_unit(thaw_command: tuple[str, ...]) -> str:
    exec_start = " ".join(thaw_command + ("serve",))
    return f"""# Written by `thaw provision`; re-run it instead of editing.
[Unit]
Description=thawd: checkpoint cache and warm restores for gVisor sandboxes
After=network-online.target local-fs.target
Wants=network-online.target
# The stand-in asks thawd at container create; without thawd starts are cold, not broken.
Before=containerd.service

[Service]
Type=simple
ExecStart={exec_start}
Restart=always
RestartSec=2
# /run/thaw holds thawd's socket and runsc state (runsc.root): keep it across restarts.
RuntimeDirectory=thaw
RuntimeDirectoryPreserve=yes
# Sandboxes thawd starts must outlive a thawd restart.
KillMode=process
LimitNOFILE=1048576

[Install]
WantedBy=multi-user.target
"""


# -- running it -------------------------------------------------------------------

def check_binaries(opts: Options, settings: Settings, gpu: bool) -> doctor.Check:
    """Are the binaries provision installs there (built, or installed before)?"""
    lay = Layout(opts.root)
    missing, optional = [], []
    for name, required in BINARIES:
        if (opts.source_dir / name).is_file() or lay.host(settings.install_dir / "bin" / name).is_file():
            continue
        (missing if required or (name == CUDA_HELPER and gpu) else optional).append(name)
    if missing:
        return doctor.Check("binaries", doctor.FAIL, f"not in {opts.source_dir}: {', '.join(missing)} "
                            "(run `make setup`, or pass --from DIR)")
    if optional:
        return doctor.Check("binaries", doctor.WARN, f"not in {opts.source_dir}: {', '.join(optional)} "
                            "(installed when built; see the skipped steps)")
    return doctor.Check("binaries", doctor.PASS, f"all in {opts.source_dir}")


def make_plan(settings: Settings, opts: Options) -> tuple[Report, list[Step]]:
    """Checks, facts and the planned steps; changes nothing."""
    lay = Layout(opts.root)
    runsc_src = opts.source_dir / "runsc"
    facts = doctor.gather(settings, runsc_src, opts.root)
    gpu = doctor.gpu_wanted(settings.gpu, facts.gpu)
    checks = doctor.node_checks(settings, facts, runsc_src, lay.host(settings.cache_dir))
    checks.append(check_binaries(opts, settings, gpu))
    todo = steps(settings, opts, gpu, facts.gpu)
    plans: list[Plan] = []
    for step in todo:
        plans.append(step.plan(plans))
    report = Report(checks, plans, doctor.compatibility_tuple(settings, facts), dry_run=opts.dry_run)
    if (not opts.restart_containerd and
            any(p.step in ("containerd drop-in", "containerd-imports") and p.action in (CREATE, UPDATE)
                for p in plans)):
        report.notes.append("containerd reads its config at start: restart it (`systemctl restart "
                            "containerd`) or re-run with --restart-containerd")
    return report, todo


def provision(settings: Settings, opts: Options) -> Report:
    """Check the node, then apply every step that changes something."""
    report, todo = make_plan(settings, opts)
    if report.failed_checks:
        failed = "; ".join(f"{c.name}: {c.detail}" for c in report.failed_checks)
        err = PreconditionError(f"node checks failed, nothing was changed: {failed}",
                                failed=[c.name for c in report.failed_checks])
        err.report = report  # type: ignore[attr-defined]
        raise err
    unplanned = [p for p in report.plans if p.error]
    if unplanned:
        err = PreconditionError("steps cannot be done, nothing was changed: "
                                + "; ".join(f"{p.step}: {p.error}" for p in unplanned),
                                failed=[p.step for p in unplanned])
        err.report = report  # type: ignore[attr-defined]
        raise err
    if opts.dry_run:
        return report
    return apply(report, todo)


def apply(report: Report, todo: list[Step]) -> Report:
    """Apply the planned steps in order; ProvisionError on the first failure."""
    done: list[str] = []
    for step, plan in zip(todo, report.plans, strict=True):
        if plan.action in (NONE, SKIP):
            plan.result = "unchanged" if plan.action == NONE else "skipped"
            continue
        try:
            step.apply(plan)
        except (OSError, ThawError, subprocess.SubprocessError) as e:
            plan.result = "failed"
            err = ProvisionError(plan.step, f"{plan.target}: {e}", done)
            err.report = report  # type: ignore[attr-defined]
            raise err from e
        plan.result = {CREATE: "created", UPDATE: "updated", RUN: "ran"}[plan.action]
        done.append(f"{plan.result} {plan.target} ({plan.step})")
    return report


def doctor_checks(settings: Settings, opts: Options) -> tuple[list[doctor.Check], dict]:
    """`thaw doctor`: the node checks, then one line per installed piece (is
    it what provision would write?), then thawd. Changes nothing."""
    lay = Layout(opts.root)
    runsc_path = lay.host(settings.runsc_path)
    facts = doctor.gather(settings, runsc_path, opts.root)
    gpu = doctor.gpu_wanted(settings.gpu, facts.gpu)
    checks = doctor.node_checks(settings, facts, runsc_path, lay.host(settings.cache_dir))
    plans: list[Plan] = []
    for step in steps(settings, opts, gpu, facts.gpu):
        plans.append(step.plan(plans))
    for p in plans:
        if p.action == RUN or (p.action == SKIP and p.step in ("systemd reload", "start thawd",
                                                               "restart containerd")):
            continue
        checks.append(_installed(p))
    ok, why = doctor.thawd_reachable(lay.host(settings.thawd_socket))
    checks.append(doctor.check_thawd(settings.thawd_socket, ok, why))
    checks.append(standin_config_check(settings, lay))
    return checks, doctor.compatibility_tuple(settings, facts)


def standin_config_check(settings: Settings, lay: Layout) -> doctor.Check:
    """What the stand-in reads (the node's config file, no THAW_* variables:
    containerd's environment) against what this thaw runs with."""
    node_file = lay.host(DEFAULT_CONFIG_FILE)
    try:
        seen = config.load(environ={}, default_file=node_file)
    except ThawError as e:
        return doctor.check_standin_config(settings, node_file, None, str(e))
    return doctor.check_standin_config(settings, node_file, seen)


def _installed(p: Plan) -> doctor.Check:
    if p.error:
        return doctor.Check(p.step, doctor.FAIL, f"{p.target}: {p.error}")
    if p.action == NONE:
        return doctor.Check(p.step, doctor.PASS, f"{p.target}: {p.detail}")
    if p.action == SKIP:
        return doctor.Check(p.step, doctor.WARN if p.warning else doctor.PASS, p.detail)
    if p.action == CREATE:
        if p.step == "thaw config":
            return doctor.Check(p.step, doctor.WARN, f"{p.target} missing: defaults and env only")
        return doctor.Check(p.step, doctor.FAIL, f"{p.target} missing (run `thaw provision`)")
    if p.step == "containerd-imports":
        return doctor.Check(p.step, doctor.FAIL, f"{p.target} does not import the drop-in: {p.detail} "
                            "(run `thaw provision`)")
    return doctor.Check(p.step, doctor.WARN, f"{p.target}: {p.detail}; differs from what "
                        "`thaw provision` writes")


def write_atomic(path: Path, mode: int, *, data: bytes | None = None, source: Path | None = None) -> None:
    """Write `data` (or copy `source`) to `path` durably: control.files.write_file_atomic, then
    the directory fsynced so that the rename survives a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def fill(f) -> None:
        if data is not None:
            f.write(data)
        else:
            assert source is not None
            with open(source, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)
    write_file_atomic(path, fill, mode, durable_rename=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _free_name(path: Path) -> Path:
    n, candidate = 1, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate
