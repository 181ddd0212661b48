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

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from control.node import containerd_config as cc
from control.node import doctor
from control import config
from control.config import DEFAULT_CONFIG_FILE, Settings
from control.errors import PreconditionError, ProvisionError, ThawError
from nvproxy import helper
from nvproxy.gpu import NodeGpus
from control.node.hugepages import (THP_DEFRAG, THP_DEFRAG_OK, THP_DIR, THP_NAMES, THP_SHMEM,  # noqa: F401
                                    THP_TMPFILES, HostHugePages, huge_pages_steps, thp_read, thp_selected,
                                    thp_tmpfiles, thp_wanted, thp_write, huge_pages_off)
from control.node.steps import (CDI_SPEC, CREATE, NONE, RUN, SKIP, UPDATE, CdiSpec, Command, ContainerdImports,  # noqa: F401
                                Layout, MakeDir, Plan, Skip, Step, Symlink, WriteFile, write_atomic)

RUNSC_TOML = Path("/etc/thaw/runsc.toml")
UNIT = Path("/etc/systemd/system/thawd.service")
UNIT_WANTS = Path("/etc/systemd/system/multi-user.target.wants/thawd.service")

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
    # The stand-in's log, rotated by the stand-in itself (standin.log_max_bytes, standin.log_keep);
    # the shim's logs are bounded by it at each delete (standin.shim_logs_keep, standin.shim_log_max_bytes).
    # Both settings reach it through the seeded config file above (seed_config).
    if settings.standin_log.parent not in (settings.log_dir, settings.log_dir / "shim"):
        out.append(MakeDir("stand-in log dir", lay, settings.standin_log.parent, 0o750))

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
