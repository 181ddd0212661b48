"""Node checks: what `thaw provision` requires before it changes anything and
what `thaw doctor` reports (pass / warn / fail per line).

A check is a pure function of facts; the facts come from the host through the
small readers at the bottom (os.uname, /proc, the runsc binary) and, for GPUs,
through nvproxy/gpu.py `probe` (NVML, else /proc/driver/nvidia), the reader
thawd's compatibility tuple uses too. Unit tests feed the checks made-up facts;
integration tests run them for real.

Status policy (docs/provision.md "doctor"):
- fail: the node cannot run thaw as configured (wrong arch, old kernel, not
  root, no cgroups, runsc missing, unsupported NVIDIA driver, GPU required but
  absent, too little disk, containerd 1.x).
- warn: thaw runs, with less than it could (no GPU on a `node.gpu = auto`
  node: CPU workloads only; runsc stamped with another version label;
  containerd not found where we looked).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from control import config
from control.config import RUNSC_VERSION_LABEL, Settings, render_value
from control.errors import ThawError
from control.node import compat
from nvproxy import gpu as gpumod
from nvproxy.gpu import NodeGpus
from runsc_hooks.runsc import GlobalOptions, Runsc

PASS, WARN, FAIL = "pass", "warn", "fail"
MIN_KERNEL = (5, 6)
# cgroup v1 controllers runsc cannot do without: the `mandatory` ones in
# gvisor runsc/cgroup/cgroup.go (`controllers`: cpu and memory; the rest are
# optional and skipped when absent).
V1_CONTROLLERS = ("cpu", "memory")


@dataclass(frozen=True)
class Check:
    name: str
    status: str     # pass | warn | fail
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


def worst(checks: list[Check]) -> str:
    statuses = {c.status for c in checks}
    return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS


# -- checks (pure) -------------------------------------------------------------

def check_arch(machine: str) -> Check:
    if machine == "x86_64":
        return Check("arch", PASS, machine)
    return Check("arch", FAIL, f"{machine}: thaw supports x86_64 only")


def kernel_version(release: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check_kernel(release: str) -> Check:
    have = kernel_version(release)
    want = ".".join(map(str, MIN_KERNEL))
    if have >= MIN_KERNEL:
        return Check("kernel", PASS, f"{release} (>= {want})")
    return Check("kernel", FAIL, f"{release}: thaw needs Linux >= {want}")


def check_root(euid: int) -> Check:
    if euid == 0:
        return Check("root", PASS, "running as root")
    return Check("root", FAIL, f"euid {euid}: runsc create/restore refuse --rootless; run as root")


def check_cgroups(mounts: str) -> Check:
    """From /proc/self/mounts text: cgroup v2 at /sys/fs/cgroup, or v1 controllers."""
    v2_root = False
    v1: set[str] = set()
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        where, fstype, opts = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup2" and where == "/sys/fs/cgroup":
            v2_root = True
        elif fstype == "cgroup":
            v1.update(o for o in opts if o in V1_CONTROLLERS)
    if v2_root:
        return Check("cgroups", PASS, "cgroup v2 (unified) at /sys/fs/cgroup")
    missing = [c for c in V1_CONTROLLERS if c not in v1]
    if v1 and not missing:
        return Check("cgroups", PASS, "cgroup v1 controllers " + ",".join(V1_CONTROLLERS))
    if not v1:
        return Check("cgroups", FAIL, "no cgroup file system mounted at /sys/fs/cgroup")
    return Check("cgroups", FAIL, "cgroup v1 without controllers " + ",".join(missing))


def check_runsc(path: Path, version: str | None, error: str = "") -> Check:
    if version is None:
        why = error or ("not found" if not path.exists() else "not executable")
        return Check("runsc", FAIL, f"{path}: {why} (run `make setup`)")
    if version != RUNSC_VERSION_LABEL:
        return Check("runsc", WARN, f"{path}: version {version!r}, thaw pins {RUNSC_VERSION_LABEL!r}: "
                     "images restore only on nodes with the same label")
    return Check("runsc", PASS, f"{path}: {version}")


def check_platform(platform: str, kvm_present: bool) -> Check:
    if platform == "kvm" and not kvm_present:
        return Check("platform", FAIL, "runsc.platform = kvm but /dev/kvm is missing")
    return Check("platform", PASS, platform)


def gpu_wanted(setting: str, gpu: NodeGpus) -> bool:
    """Does this node run GPU sandboxes (nvproxy on, CDI spec, CUDA helper)?"""
    return setting == "yes" or (setting == "auto" and bool(gpu))


def check_gpu(setting: str, gpu: NodeGpus, error: str = "") -> Check:
    """`error`: why the GPU facts could not be read (a broken NVML). That fails
    whatever node.gpu says: thawd reads the same facts for its compatibility
    tuple and does not start without them."""
    if error:
        return Check("gpu", FAIL, f"{error}; thawd cannot compute this node's compatibility tuple")
    if setting == "no":
        return Check("gpu", PASS, "node.gpu = no: CPU node, nvproxy off")
    if gpu:
        names = ", ".join(sorted({g.product for g in gpu.gpus})) or "unknown model"
        return Check("gpu", PASS, f"{len(gpu.gpus)} x {names} ({gpu.source})")
    if setting == "yes":
        return Check("gpu", FAIL, "node.gpu = yes but no NVIDIA GPU was found")
    return Check("gpu", WARN, "no NVIDIA GPU: CPU node, only CPU workloads restore here")


def check_driver(gpu: NodeGpus, wanted: bool, supported: list[str] | None) -> Check:
    if not gpu.driver_version:
        if wanted:
            return Check("nvidia-driver", FAIL, "no NVIDIA driver loaded (/proc/driver/nvidia/version)")
        return Check("nvidia-driver", PASS, "not needed on a CPU node")
    if supported is None:
        return Check("nvidia-driver", FAIL, f"{gpu.driver_version}: could not ask runsc which drivers it supports")
    if gpu.driver_version in supported:
        return Check("nvidia-driver", PASS, f"{gpu.driver_version} (supported by the pinned runsc's nvproxy)")
    near = [v for v in supported if v.split(".")[0] == gpu.driver_version.split(".")[0]]
    return Check("nvidia-driver", FAIL, f"{gpu.driver_version} is not supported by the pinned runsc's nvproxy"
                 f" (supported{' ' + gpu.driver_version.split('.')[0] + '.x' if near else ''}: "
                 f"{', '.join(near or supported)})")


def containerd_major(version: str) -> int | None:
    m = re.search(r"\bv?(\d+)\.(\d+)\.\d+", version)
    return int(m.group(1)) if m else None


def check_containerd(binary: Path | None, version: str | None) -> Check:
    if binary is None:
        return Check("containerd", WARN, "containerd not found on PATH: the runtime handler "
                     "is written but nothing loads it yet")
    major = containerd_major(version or "")
    if major is None:
        return Check("containerd", WARN, f"{binary}: could not read its version ({version!r})")
    if major < 2:
        return Check("containerd", FAIL, f"{binary}: {version}: thaw's drop-in needs containerd 2.x "
                     "(config version 3)")
    return Check("containerd", PASS, f"{binary}: {version}")


def check_space(path: Path, free: int, budget: int, min_free: int) -> Check:
    gib = 1 << 30
    have = f"{free / gib:.1f} GiB free at {path}"
    if free < min_free:
        return Check("cache-space", FAIL, f"{have}; cache.min_free_bytes is {min_free / gib:.1f} GiB")
    if free < budget:
        return Check("cache-space", WARN, f"{have}; less than cache.budget_bytes ({budget / gib:.1f} GiB)")
    return Check("cache-space", PASS, f"{have} (budget {budget / gib:.1f} GiB)")


def check_thawd(sock: Path, reachable: bool, error: str) -> Check:
    if reachable:
        return Check("thawd", PASS, f"listening on {sock}")
    return Check("thawd", FAIL, f"{sock}: {error or 'not reachable'} (is thawd running? `thaw serve`)")


def check_standin_config(used: Settings, node_file: Path, seen: Settings | None, error: str = "") -> Check:
    """Does the stand-in see the settings thawd runs with? It reads the node's
    file (`node_file`) and containerd's environment, not thawd's: under
    Kubernetes thawd reads the ConfigMap while the stand-in reads the host's
    /etc/thaw/config.toml, which provision seeds only once. `seen` is
    control.config.load of that file with no THAW_* variables."""
    if seen is None:
        return Check("stand-in config", FAIL, f"{node_file}: {error}; the stand-in starts every container cold")
    keys = [k for k in config.KEYS if k.standin]
    differ = [(k, getattr(used, k.field), getattr(seen, k.field)) for k in keys
              if getattr(used, k.field) != getattr(seen, k.field)]
    if not differ:
        return Check("stand-in config", PASS, f"the stand-in reads the same {', '.join(k.name for k in keys)}")
    what = "; ".join(f"{k.name} is {render_value(a)} here, {render_value(b)} for the stand-in" for k, a, b in differ)
    status = FAIL if any(k.name == "thawd.socket" for k, _, _ in differ) else WARN
    return Check("stand-in config", status, f"{what} (it reads {node_file} and containerd's environment: "
                 "set these there)")


# -- facts (the host) ------------------------------------------------------------

@dataclass
class NodeFacts:
    machine: str
    kernel: str
    euid: int
    mounts: str
    kvm: bool
    gpu: NodeGpus
    containerd_binary: Path | None
    containerd_version: str | None
    runsc_version: str | None = None
    runsc_error: str = ""
    supported_drivers: list[str] | None = None
    cpu_features: list[str] = field(default_factory=list)
    gpu_error: str = ""        # nvproxy.gpu.probe failed (a broken NVML); gpu is then empty


def runsc_client(path: Path, settings: Settings) -> Runsc:
    return Runsc(path, GlobalOptions(root=settings.runsc_root, platform=settings.runsc_platform),
                 timeout_s=min(settings.runsc_timeout_s, 30.0))


def gather(settings: Settings, runsc_path: Path, root: Path = Path("/")) -> NodeFacts:
    """Read the facts the checks need. `root`: the tree being provisioned
    (containerd is looked for in its PATH directories)."""
    u = os.uname()
    binary, version = find_containerd(root)
    try:
        gpus, gpu_error = gpumod.probe(), ""
    except ThawError as e:   # GpuError (broken NVML) or pynvml missing: a failed check, not a crash
        gpus, gpu_error = NodeGpus(), str(e)
    facts = NodeFacts(machine=u.machine, kernel=u.release, euid=os.geteuid(),
                      mounts=_read("/proc/self/mounts"), kvm=Path("/dev/kvm").exists(),
                      gpu=gpus, containerd_binary=binary, containerd_version=version, gpu_error=gpu_error)
    if runsc_path.is_file() and os.access(runsc_path, os.X_OK):
        r = runsc_client(runsc_path, settings)
        try:
            facts.runsc_version = r.version()
            facts.supported_drivers = r.nvproxy_supported_drivers()
            facts.cpu_features = r.cpu_features()
        except ThawError as e:
            facts.runsc_error = str(e).splitlines()[0]
    return facts


def node_checks(settings: Settings, facts: NodeFacts, runsc_path: Path, cache_dir: Path) -> list[Check]:
    """The checks provision requires and doctor reports first."""
    free_at = nearest_existing(cache_dir)
    return [
        check_arch(facts.machine),
        check_kernel(facts.kernel),
        check_root(facts.euid),
        check_cgroups(facts.mounts),
        check_runsc(runsc_path, facts.runsc_version, facts.runsc_error),
        check_platform(settings.runsc_platform, facts.kvm),
        check_gpu(settings.gpu, facts.gpu, facts.gpu_error),
        check_driver(facts.gpu, gpu_wanted(settings.gpu, facts.gpu), facts.supported_drivers),
        check_containerd(facts.containerd_binary, facts.containerd_version),
        check_space(free_at, shutil.disk_usage(free_at).free, settings.cache_budget_bytes,
                    settings.cache_min_free_bytes),
    ]


class _GatheredRunsc:
    """compat._RunscFacts from what gather() already asked runsc."""

    def __init__(self, facts: NodeFacts) -> None:
        self.facts = facts

    def version(self) -> str:
        return self.facts.runsc_version or ""

    def cpu_features(self) -> list[str]:
        return self.facts.cpu_features


def compatibility_tuple(settings: Settings, facts: NodeFacts) -> dict:
    """The node's compatibility tuple, built by compat.node_tuple (the builder
    thawd uses) from the facts doctor gathered, with its hash. Without GPU
    facts (a broken NVML) there is no tuple: thawd would not start either."""
    if facts.gpu_error:
        return {"error": facts.gpu_error}
    t = compat.node_tuple(settings, runsc=_GatheredRunsc(facts), gpus=facts.gpu, arch=facts.machine)
    return {**t.to_dict(), "hash": t.hash()}


def find_containerd(root: Path = Path("/")) -> tuple[Path | None, str | None]:
    """containerd in the usual directories of `root` (the host's PATH may differ from ours)."""
    for d in ("/usr/local/bin", "/usr/bin", "/usr/local/sbin", "/usr/sbin", "/bin", "/sbin"):
        p = root / d.lstrip("/") / "containerd"
        if p.is_file() and os.access(p, os.X_OK):
            try:
                out = subprocess.run([str(p), "--version"], capture_output=True, text=True, timeout=10,
                                     stdin=subprocess.DEVNULL)
                return p, out.stdout.strip() or out.stderr.strip()
            except (OSError, subprocess.TimeoutExpired) as e:
                return p, f"error: {e}"
    return None, None


def thawd_reachable(sock: Path) -> tuple[bool, str]:
    """Can we connect to thawd's Unix socket? (A connect, not an RPC: the
    gRPC health service is thawd's to add.)"""
    try:
        if not sock.exists():
            return False, "socket does not exist"
    except PermissionError:   # a non-root doctor: the socket's directory is root's
        return False, "permission denied (thawd's socket is root's: run doctor as root)"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(str(sock))
        return True, ""
    except OSError as e:
        return False, e.strerror or str(e)
    finally:
        s.close()


def nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""

