"""CDI (Container Device Interface) specs for NVIDIA GPUs, and their injection
into OCI specs for runsc.

runsc does not read CDI itself; the caller merges CDI edits into the OCI spec
(docs/notes/gvisor-facts.md "GPU"). This module:

- reads CDI spec files (JSON or YAML) from /etc/cdi and /var/run/cdi (a spec
  in a later directory overrides an earlier one's device of the same name, as
  the CDI reference implementation does);
- generates a spec of kind nvidia.com/gpu for this node from NVML and the
  driver files on disk when no spec file exists (`generate`);
- resolves CDI device requests (annotations `cdi.k8s.io/<key>` whose values are
  comma-separated `vendor/class=name`) into spec.linux.devices, mounts, env and
  hooks (`inject`);
- takes its own injection out again (`strip`), for a re-injection at restore
  (nvproxy/restore_spec.py: the GPUs this node assigns, possibly other minors
  than at checkpoint, with every mount destination kept for runsc's restore
  spec validation).

Device nodes become OCI devices with type/major/minor read from the host node
when the CDI spec leaves them out. Mounts default to type "bind". Env entries
replace a variable of the same name, except the path lists in `_PATH_LISTS`,
which are prepended to.
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat as statmod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from control.errors import NotFound, PreconditionError, SpecError, UserError
from nvproxy.gpu import NodeGpus
from control.files import write_json_atomic

CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))   # later wins (CDI: dynamic over static)
NVIDIA_KIND = "nvidia.com/gpu"
CDI_VERSION = "0.6.0"
REQUEST_ANNOTATION_PREFIX = "cdi.k8s.io/"
# What thaw injected into a spec (JSON), so a later re-injection can take it
# out again. Not a dev.gvisor.* annotation: those must match at restore.
INJECTED_ANNOTATION = "thaw.dev/cdi-injected"
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
_PATH_LISTS = ("LD_LIBRARY_PATH", "PATH")
_QUALIFIED = re.compile(r"^(?P<kind>[A-Za-z0-9][A-Za-z0-9.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)="
                        r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.:-]*)$")
# /dev/nvidiaN: the only device nodes allowed to differ at restore (restore_spec.py).
GPU_NODE = re.compile(r"^/dev/nvidia[0-9]+$")


# -- the CDI data model ------------------------------------------------------------

@dataclass(frozen=True)
class DeviceNode:
    path: str                    # in the container
    host_path: str = ""          # on the host; default: path
    type: str = ""               # c | b; default: from the host node
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str = ""        # cgroup access, e.g. "rwm"
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    type: str = "bind"
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class Edits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()


@dataclass(frozen=True)
class Device:
    name: str
    edits: Edits


@dataclass(frozen=True)
class CdiSpec:
    version: str
    kind: str
    devices: tuple[Device, ...]
    edits: Edits = field(default_factory=Edits)
    path: str = ""               # the file it came from ("" when generated)

    def device(self, name: str) -> Device | None:
        return next((d for d in self.devices if d.name == name), None)


def parse_qualified(name: str) -> tuple[str, str]:
    """"nvidia.com/gpu=0" -> ("nvidia.com/gpu", "0"); SpecError otherwise."""
    m = _QUALIFIED.match(name)
    if not m:
        raise SpecError("annotations", f"{name!r} is not a CDI device name (vendor.com/class=name)")
    return m["kind"], m["name"]


# -- reading spec files ---------------------------------------------------------------

def parse(data: Any, path: str = "") -> CdiSpec:
    """Validate a CDI spec document; a bad one raises SpecError naming the field."""
    def need(cond: bool, fld: str, problem: str) -> None:
        if not cond:
            raise SpecError(fld, problem, path or None)

    need(isinstance(data, dict), "(root)", "expected an object")
    need(isinstance(data.get("cdiVersion"), str), "cdiVersion", "missing or not a string")
    kind = data.get("kind")
    need(isinstance(kind, str) and _QUALIFIED.match(f"{kind}=x") is not None, "kind",
         "must be vendor.com/class")
    devs = data.get("devices")
    need(isinstance(devs, list) and devs, "devices", "must be a non-empty list")
    devices = []
    for i, d in enumerate(devs):
        need(isinstance(d, dict), f"devices[{i}]", "must be an object")
        name = d.get("name")
        need(isinstance(name, str) and _QUALIFIED.match(f"{kind}={name}") is not None, f"devices[{i}].name",
             "must be a device name (letters, digits, _ . : -)")
        need(name not in {x.name for x in devices}, f"devices[{i}].name", f"{name!r} appears twice")
        need(isinstance(d.get("containerEdits"), dict), f"devices[{i}].containerEdits", "missing")
        devices.append(Device(name, _parse_edits(d["containerEdits"], f"devices[{i}].containerEdits", need)))
    edits = _parse_edits(data.get("containerEdits") or {}, "containerEdits", need)
    return CdiSpec(version=data["cdiVersion"], kind=kind, devices=tuple(devices), edits=edits, path=path)


def _parse_edits(e: Any, at: str, need: Callable[[bool, str, str], None]) -> Edits:
    need(isinstance(e, dict), at, "must be an object")
    env = e.get("env") or []
    need(isinstance(env, list) and all(isinstance(x, str) and "=" in x for x in env), f"{at}.env",
         "must be a list of KEY=VALUE strings")
    nodes = []
    for i, n in enumerate(e.get("deviceNodes") or []):
        f = f"{at}.deviceNodes[{i}]"
        need(isinstance(n, dict) and isinstance(n.get("path"), str) and n["path"].startswith("/dev/"),
             f"{f}.path", "must be a path under /dev/")
        need(n.get("type", "") in ("", "c", "b"), f"{f}.type", "must be c or b")
        for k in ("major", "minor", "fileMode", "uid", "gid"):
            need(n.get(k) is None or (isinstance(n[k], int) and n[k] >= 0), f"{f}.{k}", "must be a non-negative integer")
        need(isinstance(n.get("permissions", ""), str) and set(n.get("permissions", "")) <= set("rwm"),
             f"{f}.permissions", "must be letters of rwm")
        nodes.append(DeviceNode(path=n["path"], host_path=n.get("hostPath") or "", type=n.get("type", ""),
                                major=n.get("major"), minor=n.get("minor"), file_mode=n.get("fileMode"),
                                permissions=n.get("permissions", ""), uid=n.get("uid"), gid=n.get("gid")))
    mounts = []
    for i, m in enumerate(e.get("mounts") or []):
        f = f"{at}.mounts[{i}]"
        need(isinstance(m, dict), f, "must be an object")
        need(isinstance(m.get("hostPath"), str) and m["hostPath"].startswith("/"), f"{f}.hostPath",
             "must be an absolute path")
        need(isinstance(m.get("containerPath"), str) and m["containerPath"].startswith("/"),
             f"{f}.containerPath", "must be an absolute path")
        opts = m.get("options") or []
        need(isinstance(opts, list) and all(isinstance(o, str) for o in opts), f"{f}.options",
             "must be a list of strings")
        mounts.append(Mount(m["hostPath"], m["containerPath"], m.get("type") or "bind", tuple(opts)))
    hooks = []
    for i, h in enumerate(e.get("hooks") or []):
        f = f"{at}.hooks[{i}]"
        need(isinstance(h, dict) and h.get("hookName") in HOOK_NAMES, f"{f}.hookName",
             f"must be one of {', '.join(HOOK_NAMES)}")
        need(isinstance(h.get("path"), str) and h["path"].startswith("/"), f"{f}.path", "must be an absolute path")
        for k in ("args", "env"):
            v = h.get(k) or []
            need(isinstance(v, list) and all(isinstance(x, str) for x in v), f"{f}.{k}", "must be a list of strings")
        need(h.get("timeout") is None or (isinstance(h["timeout"], int) and h["timeout"] > 0), f"{f}.timeout",
             "must be a positive integer (seconds)")
        hooks.append(Hook(h["hookName"], h["path"], tuple(h.get("args") or []), tuple(h.get("env") or []),
                          h.get("timeout")))
    return Edits(env=tuple(env), device_nodes=tuple(nodes), mounts=tuple(mounts), hooks=tuple(hooks))


def load_file(path: Path) -> CdiSpec:
    """One CDI spec file: .json, or .yaml/.yml."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError("(file)", f"cannot read: {e.strerror}", str(path)) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else _yaml(text)
    except ValueError as e:
        raise SpecError("(file)", f"not valid {path.suffix[1:].upper()}: {e}", str(path)) from None
    return parse(data, str(path))


def _yaml(text: str) -> Any:
    # Imported here: JSON and generated specs need no PyYAML, and the GPU
    # machine's interpreter runs this module from the repo tree.
    try:
        import yaml
    except ImportError:
        raise PreconditionError("PyYAML is needed to read YAML CDI specs (pip install PyYAML)") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(str(e)) from None


class Registry:
    """Every CDI device this node knows, by qualified name."""

    def __init__(self, specs: Iterable[CdiSpec] = ()) -> None:
        self.specs: list[CdiSpec] = []
        self._devices: dict[str, tuple[CdiSpec, Device]] = {}
        for s in specs:
            self.add(s)

    def add(self, spec: CdiSpec) -> None:
        self.specs.append(spec)
        for d in spec.devices:
            self._devices[f"{spec.kind}={d.name}"] = (spec, d)

    def names(self, kind: str | None = None) -> list[str]:
        return sorted(n for n in self._devices if kind is None or n.startswith(kind + "="))

    def resolve(self, qualified: str) -> tuple[CdiSpec, Device]:
        parse_qualified(qualified)
        try:
            return self._devices[qualified]
        except KeyError:
            kind = qualified.split("=", 1)[0]
            known = ", ".join(self.names(kind)) or f"no {kind} devices"
            where = ", ".join(sorted({s.path or "(generated)" for s in self.specs})) or "no CDI spec files"
            raise NotFound("CDI device", qualified, f"known: {known} (from {where})") from None


def load_dirs(dirs: Iterable[Path] = CDI_DIRS, exclude: Iterable[Path] = ()) -> Registry:
    """Every spec file in `dirs` (missing directories are fine), later overriding
    earlier; files in `exclude` are not read (provision leaves out the spec it
    owns and may rewrite)."""
    reg = Registry()
    skip = {Path(p) for p in exclude}
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.suffix in (".json", ".yaml", ".yml") and p.is_file() and p not in skip:
                reg.add(load_file(p))
    return reg


# -- generating a spec for this node ----------------------------------------------

# Driver libraries a CUDA workload needs (the "compute" and "utility"
# capabilities of the NVIDIA container toolkit). The first two are required.
DRIVER_LIBS = ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm", "libcudadebugger",
               "libnvidia-gpucomp", "libnvidia-allocator", "libnvidia-cfg", "libnvidia-opencl")
REQUIRED_LIBS = ("libcuda", "libnvidia-ml")
DRIVER_BINS = ("nvidia-smi", "nvidia-debugdump")
DEFAULT_LIB_DIRS = (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib"),
                    Path("/usr/local/nvidia/lib64"), Path("/usr/local/nvidia/lib"))
DEFAULT_BIN_DIRS = (Path("/usr/bin"), Path("/usr/local/nvidia/bin"))
# Directories the dynamic loader searches without being told (Debian/Ubuntu
# and RHEL layouts); driver libraries elsewhere get LD_LIBRARY_PATH.
_LOADER_DIRS = {"/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")     # nvproxy needs both; no uvm-tools, no caps
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")


def driver_files(driver_version: str, lib_dirs: Iterable[Path] = DEFAULT_LIB_DIRS,
                 bin_dirs: Iterable[Path] = DEFAULT_BIN_DIRS) -> list[Mount]:
    """Mounts of the driver's user-space files at their host paths.

    Each library is `<name>.so.<driver_version>`, found in the first of
    `lib_dirs` that has it; every symlink beside it that points at it
    (libcuda.so.1, libcuda.so) is mounted too, from the real file, so no
    ldconfig hook is needed in the container.
    """
    lib_dirs, mounts, missing = [Path(d) for d in lib_dirs], [], []
    for lib in DRIVER_LIBS:
        real = next((d / f"{lib}.so.{driver_version}" for d in lib_dirs
                     if (d / f"{lib}.so.{driver_version}").is_file()), None)
        if real is None:
            if lib in REQUIRED_LIBS:
                missing.append(f"{lib}.so.{driver_version}")
            continue
        mounts.append(Mount(str(real), str(real), "bind", MOUNT_OPTIONS))
        for link in sorted(real.parent.glob(f"{lib}.so*")):
            if link.is_symlink() and link.resolve() == real.resolve():
                mounts.append(Mount(str(real), str(link), "bind", MOUNT_OPTIONS))
    if missing:
        raise PreconditionError(f"driver {driver_version}: {', '.join(missing)} not found in "
                                f"{', '.join(map(str, lib_dirs))}", driver_version=driver_version)
    for b in DRIVER_BINS:
        p = next((Path(d) / b for d in bin_dirs if (Path(d) / b).is_file()), None)
        if p is not None:
            mounts.append(Mount(str(p), str(p), "bind", MOUNT_OPTIONS))
    return mounts


def generate(node: NodeGpus, lib_dirs: Iterable[Path] = DEFAULT_LIB_DIRS,
             bin_dirs: Iterable[Path] = DEFAULT_BIN_DIRS, exists: Callable[[str], bool] = os.path.exists) -> dict:
    """A CDI spec document (kind nvidia.com/gpu) for this node's GPUs.

    Devices are named by NVML index ("0"), by UUID ("GPU-…") and "all"; each
    GPU device adds its /dev/nvidiaN, and the spec-level edits add the control
    nodes, the driver files and, when the libraries are outside the loader's
    default directories, LD_LIBRARY_PATH.
    """
    if not node.gpus:
        raise PreconditionError("no NVIDIA GPU on this node: nothing to put in a CDI spec")
    mounts = driver_files(node.driver_version, lib_dirs, bin_dirs)
    missing = [p for p in CONTROL_NODES if not exists(p)]
    if missing:
        raise PreconditionError(f"NVIDIA device nodes missing: {', '.join(missing)} (is nvidia-uvm loaded?)")
    lib_paths = sorted({str(Path(m.container_path).parent) for m in mounts if ".so" in m.container_path})
    edits: dict[str, Any] = {
        "deviceNodes": [{"path": p} for p in CONTROL_NODES],
        "mounts": [{"hostPath": m.host_path, "containerPath": m.container_path, "type": m.type,
                    "options": list(m.options)} for m in mounts],
    }
    extra = [p for p in lib_paths if p not in _LOADER_DIRS]
    if extra:
        edits["env"] = ["LD_LIBRARY_PATH=" + ":".join(extra)]
    devices = []
    for g in node.gpus:
        nodes = {"deviceNodes": [{"path": g.device_path}]}
        devices.append({"name": str(g.index), "containerEdits": nodes})
        devices.append({"name": g.uuid, "containerEdits": nodes})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [{"path": g.device_path} for g in node.gpus]}})
    doc = {"cdiVersion": CDI_VERSION, "kind": NVIDIA_KIND, "devices": devices, "containerEdits": edits}
    parse(doc)   # what we write must read back
    return doc


def write_spec(doc: dict, directory: Path = Path("/var/run/cdi"), name: str = "thaw-nvidia.json",
               mode: int = 0o644) -> Path:
    """Write a generated spec atomically (temp file, fsync, rename), world-readable
    like the NVIDIA container toolkit's specs: it names no secret."""
    parse(doc)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / name, doc, mode)
    return directory / name


def node_registry(node: NodeGpus, dirs: Iterable[Path] = CDI_DIRS, **generate_kw: Any) -> Registry:
    """The node's CDI devices: spec files when any define nvidia.com/gpu, else a generated spec."""
    reg = load_dirs(dirs)
    if not reg.names(NVIDIA_KIND) and node.gpus:
        reg.add(parse(generate(node, **generate_kw)))
    return reg


# -- injecting into an OCI spec ------------------------------------------------------

def requested_devices(spec: dict) -> list[str]:
    """CDI device names requested through `cdi.k8s.io/*` annotations, in order, without repeats."""
    out: list[str] = []
    for key, value in sorted((spec.get("annotations") or {}).items()):
        if not key.startswith(REQUEST_ANNOTATION_PREFIX):
            continue
        for name in (v.strip() for v in value.split(",")):
            if name:
                parse_qualified(name)
                if name not in out:
                    out.append(name)
    return out


# The NVIDIA device plugin's default way to name a container's GPUs (its "envvar"
# strategy): the kubelet puts them into the container's environment, and the NVIDIA
# container runtime, which runsc is not, turns them into devices. The values that
# name none (NVIDIA container toolkit: "void" and "none" keep the driver out, an
# empty value means no GPU) and a path (the "volume-mounts" strategy) request nothing.
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
_NO_GPU = ("", "void", "none")
_GPU_WORD = re.compile(r"^(all|[0-9]+|(GPU|MIG)-[0-9A-Za-z-]+)$")


def visible_devices(spec: dict) -> list[str]:
    """The CDI devices (nvidia.com/gpu=...) a spec asks for through NVIDIA_VISIBLE_DEVICES
    when nothing has given it a GPU yet (no /dev/nvidiactl among its devices: containerd
    injects CDI devices and cdi.k8s.io/* requests itself); [] otherwise. UserError for a
    value that names no GPU in a way thaw knows."""
    if any(d.get("path") == CONTROL_NODES[0] for d in (spec.get("linux") or {}).get("devices") or []):
        return []
    env = dict(e.split("=", 1) for e in (spec.get("process") or {}).get("env") or [] if "=" in e)
    value = env.get(VISIBLE_DEVICES_ENV)
    if value is None or value.strip() in _NO_GPU or value.startswith("/"):
        return []
    words = [w.strip() for w in value.split(",") if w.strip()]
    bad = [w for w in words if not _GPU_WORD.match(w)]
    if bad:
        raise UserError(f"{VISIBLE_DEVICES_ENV}={value!r}: {', '.join(bad)} is no GPU index, UUID or 'all'",
                        field=VISIBLE_DEVICES_ENV)
    return list(dict.fromkeys(f"{NVIDIA_KIND}={w}" for w in words))


def _device_entry(node: DeviceNode, stat: Callable[[str], os.stat_result]) -> dict:
    host = node.host_path or node.path
    typ, major, minor = node.type, node.major, node.minor
    if not typ or major is None or minor is None:
        try:
            st = stat(host)
        except OSError as e:
            raise PreconditionError(f"CDI device node {host} is not on this node: {e.strerror}",
                                    path=host) from None
        if statmod.S_ISCHR(st.st_mode):
            typ = typ or "c"
        elif statmod.S_ISBLK(st.st_mode):
            typ = typ or "b"
        else:
            raise PreconditionError(f"CDI device node {host} is not a device", path=host)
        major = os.major(st.st_rdev) if major is None else major
        minor = os.minor(st.st_rdev) if minor is None else minor
    d: dict[str, Any] = {"path": node.path, "type": typ, "major": major, "minor": minor}
    d["fileMode"] = node.file_mode if node.file_mode is not None else 0o666
    d["uid"] = node.uid if node.uid is not None else 0
    d["gid"] = node.gid if node.gid is not None else 0
    return d


def _set_env(env: list[str], entry: str) -> list[str]:
    key, value = entry.split("=", 1)
    old = next((e.split("=", 1)[1] for e in env if e.split("=", 1)[0] == key), None)
    if key in _PATH_LISTS and old:
        parts = value.split(":") + [p for p in old.split(":") if p not in value.split(":")]
        value = ":".join(parts)
    return [e for e in env if e.split("=", 1)[0] != key] + [f"{key}={value}"]


def inject(spec: dict, registry: Registry, devices: Iterable[str],
           stat: Callable[[str], os.stat_result] = os.stat) -> dict:
    """A copy of `spec` with the edits of `devices` (and of their specs) applied.

    Spec-level edits apply once per CDI spec, before its devices' edits. What
    was added is recorded in the INJECTED_ANNOTATION so `strip` can undo it.
    """
    devices = list(dict.fromkeys(devices))
    out = copy.deepcopy(spec)
    resolved = [registry.resolve(d) for d in devices]
    edits: list[Edits] = []
    seen_specs: list[int] = []
    for cdi_spec, dev in resolved:
        if id(cdi_spec) not in seen_specs:
            seen_specs.append(id(cdi_spec))
            edits.append(cdi_spec.edits)
        edits.append(dev.edits)

    proc = out.setdefault("process", {})
    linux = out.setdefault("linux", {})
    record: dict[str, Any] = {"devices": devices, "env": [], "mounts": [], "device_nodes": [], "hooks": []}
    for e in edits:
        for entry in e.env:
            proc["env"] = _set_env(list(proc.get("env") or []), entry)
            record["env"].append(entry.split("=", 1)[0])
        for n in e.device_nodes:
            entry = _device_entry(n, stat)
            linux["devices"] = [d for d in linux.get("devices") or [] if d.get("path") != n.path] + [entry]
            rules = linux.setdefault("resources", {}).setdefault("devices", [])
            rule = {"allow": True, "type": entry["type"], "major": entry["major"], "minor": entry["minor"],
                    "access": n.permissions or "rwm"}
            if rule not in rules:
                rules.append(rule)
            record["device_nodes"].append(n.path)
        for m in e.mounts:
            mount = {"destination": m.container_path, "type": m.type, "source": m.host_path,
                     "options": list(m.options)}
            mounts = out.setdefault("mounts", [])
            at = next((i for i, x in enumerate(mounts) if x.get("destination") == m.container_path), None)
            if at is None:
                mounts.append(mount)
            else:
                mounts[at] = mount
            record["mounts"].append(m.container_path)
        for h in e.hooks:
            hook: dict[str, Any] = {"path": h.path}
            if h.args:
                hook["args"] = list(h.args)
            if h.env:
                hook["env"] = list(h.env)
            if h.timeout is not None:
                hook["timeout"] = h.timeout
            out.setdefault("hooks", {}).setdefault(h.hook_name, []).append(hook)
            record["hooks"].append({"hookName": h.hook_name, **hook})
    for k in ("env", "mounts", "device_nodes"):
        record[k] = list(dict.fromkeys(record[k]))
    out.setdefault("annotations", {})[INJECTED_ANNOTATION] = json.dumps(record, sort_keys=True)
    return out


def strip(spec: dict) -> dict:
    """A copy of `spec` without what an earlier `inject` recorded (env values are dropped)."""
    out = copy.deepcopy(spec)
    raw = (out.get("annotations") or {}).pop(INJECTED_ANNOTATION, None)
    if raw is None:
        return out
    try:
        rec = json.loads(raw)
    except ValueError:
        raise SpecError(f"annotations.{INJECTED_ANNOTATION}", "not valid JSON") from None
    nodes, dests, keys = set(rec.get("device_nodes", [])), set(rec.get("mounts", [])), set(rec.get("env", []))
    linux = out.get("linux") or {}
    removed = [d for d in linux.get("devices") or [] if d.get("path") in nodes]
    if "devices" in linux:
        linux["devices"] = [d for d in linux["devices"] if d.get("path") not in nodes]
    res = (linux.get("resources") or {})
    if "devices" in res:
        gone = {(d.get("type"), d.get("major"), d.get("minor")) for d in removed}
        res["devices"] = [r for r in res["devices"] if (r.get("type"), r.get("major"), r.get("minor")) not in gone]
    out["mounts"] = [m for m in out.get("mounts") or [] if m.get("destination") not in dests]
    if "process" in out:
        out["process"]["env"] = [e for e in out["process"].get("env") or [] if e.split("=", 1)[0] not in keys]
    hooks = out.get("hooks") or {}
    for h in rec.get("hooks", []):
        h = dict(h)
        name = h.pop("hookName")
        if h in hooks.get(name, []):
            hooks[name].remove(h)
    return out


# -- GPUs in a spec (nvproxy/restore_spec.py pairs them at restore) ------------------

def is_gpu_node(path: str) -> bool:
    """/dev/nvidiaN: a GPU's device node, the one kind allowed to differ at restore."""
    return bool(GPU_NODE.match(path))


def gpu_nodes(spec: dict) -> list[str]:
    """The /dev/nvidiaN paths in spec.linux.devices, sorted by minor (as runsc pairs them)."""
    devs = [d for d in (spec.get("linux") or {}).get("devices") or [] if GPU_NODE.match(str(d.get("path", "")))]
    return [d["path"] for d in sorted(devs, key=lambda d: (d.get("minor", 0), d["path"]))]
