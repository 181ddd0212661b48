"""This node's GPUs, as NVML reports them: the GPU half of the compatibility tuple.

`probe()` answers with a `NodeGpus`; it is the one reader of GPU facts:
`thaw doctor`, `thaw provision` (its CDI spec) and the compatibility tuple
(control/node/compat.py `node_tuple`, which thawd publishes and matches
images against) all take theirs from it, so they cannot disagree.

Where NVML says there is no NVIDIA stack (no libnvidia-ml, no driver loaded),
the kernel module's /proc/driver/nvidia is read instead: a privileged pod
sees the host's procfs but often lacks libnvidia-ml. No GPU there either (or
zero devices) is a normal answer: an empty `NodeGpus`. NVML that is there but
fails (permissions, a version mismatch between libnvidia-ml and the kernel
module, a lost GPU) is a `GpuError` naming the NVML call and NVML's own
message, because restoring a GPU image on a node whose driver is broken must
not look like "this node has no GPU".

NVML and procfs sit behind seams: `probe(nvml=..., procfs=...)` takes any
object with pynvml's functions, constants and NVMLError class (default: the
`pynvml` module from nvidia-ml-py) and the directory to read instead.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from control.errors import GpuError, NotFound, PreconditionError

# NVML errors that mean "no NVIDIA GPU here" rather than "NVML is broken".
_NO_GPU_ERRORS = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")
# The NVIDIA kernel module's procfs (open-gpu-kernel-modules
# kernel-open/nvidia/nv-procfs.c): `version`, and `gpus/<PCI bus id>/information`.
PROCFS = Path("/proc/driver/nvidia")


@dataclass(frozen=True)
class Gpu:
    index: int            # NVML index (enumeration order, by PCI bus id)
    product: str          # nvmlDeviceGetName, e.g. "NVIDIA H200"
    uuid: str             # "GPU-…"; stable across reboots
    minor: int            # /dev/nvidia<minor>
    memory_bytes: int     # total device memory; 0 when read from procfs (it does not say)
    pci_bus_id: str

    @property
    def device_path(self) -> str:
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True)
class NodeGpus:
    driver_version: str = ""          # e.g. "580.159.04"; "" without a GPU
    cuda_driver_version: str = ""     # the CUDA version the driver supports, e.g. "13.0";
                                      # "" from procfs (only libcuda/NVML know it)
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    source: str = ""                  # "nvml" | "procfs"; "" when neither found an NVIDIA driver

    def __bool__(self) -> bool:
        return bool(self.gpus)

    def compat(self) -> dict[str, Any]:
        """The GPU fields of the compatibility tuple (control/node/compat.py).

        gpu_product is the node's distinct product names, sorted, joined by
        "," ("NVIDIA H200"; "NVIDIA A100-SXM4-80GB,NVIDIA H200" on a mixed
        node; "" without a GPU): the same on every node with the same set of
        models, whatever their enumeration order.
        """
        products = sorted({g.product for g in self.gpus})
        return {"gpu_product": ",".join(products), "gpu_count": len(self.gpus),
                "driver_version": self.driver_version, "cuda_driver_version": self.cuda_driver_version}

    def to_dict(self) -> dict[str, Any]:
        return {"driver_version": self.driver_version, "cuda_driver_version": self.cuda_driver_version,
                "gpus": [asdict(g) for g in self.gpus], "source": self.source}

    def select(self, ids: Iterable[str]) -> list[Gpu]:
        """GPUs by index ("0"), UUID ("GPU-…") or "all", in the order asked, without repeats."""
        out: list[Gpu] = []
        for ident in ids:
            if ident == "all":
                found = list(self.gpus)
            else:
                found = [g for g in self.gpus if ident in (str(g.index), g.uuid)]
                if not found:
                    known = ", ".join(f"{g.index} ({g.uuid})" for g in self.gpus) or "none"
                    raise NotFound("GPU", ident, f"this node has {known}")
            out.extend(g for g in found if g not in out)
        return out


def probe(nvml: Any = None, procfs: Path = PROCFS) -> NodeGpus:
    """Ask NVML for the driver and every GPU, else the kernel module's procfs
    (no NVML library or driver); an empty NodeGpus when there is none."""
    nvml = _pynvml() if nvml is None else nvml
    with _session(nvml, "is the NVIDIA kernel module the same version as libnvidia-ml?") as up:
        if not up:
            return from_procfs(procfs)
        driver = _call(nvml, "nvmlSystemGetDriverVersion")
        cuda = _call(nvml, "nvmlSystemGetCudaDriverVersion")
        count = _call(nvml, "nvmlDeviceGetCount")
        gpus = []
        for i in range(count):
            h = _call(nvml, "nvmlDeviceGetHandleByIndex", i)
            gpus.append(Gpu(
                index=i,
                product=_text(_call(nvml, "nvmlDeviceGetName", h)),
                uuid=_text(_call(nvml, "nvmlDeviceGetUUID", h)),
                minor=int(_call(nvml, "nvmlDeviceGetMinorNumber", h)),
                memory_bytes=int(_call(nvml, "nvmlDeviceGetMemoryInfo", h).total),
                pci_bus_id=_text(_call(nvml, "nvmlDeviceGetPciInfo", h).busId),
            ))
        return NodeGpus(driver_version=_text(driver), cuda_driver_version=cuda_version(int(cuda)),
                        gpus=tuple(gpus), source="nvml")


def used_bytes(minors: Iterable[int], nvml: Any = None) -> int:
    """Device memory in use, summed over the GPUs /dev/nvidia<minor> of `minors`
    (what a checkpoint of a sandbox holding them may have to save: the deadline of
    control/lifecycle/deadlines.py). 0 where NVML says there is no NVIDIA stack."""
    want = set(minors)
    if not want:
        return 0
    nvml = _pynvml() if nvml is None else nvml
    with _session(nvml) as up:
        if not up:
            return 0
        total = 0
        for i in range(_call(nvml, "nvmlDeviceGetCount")):
            h = _call(nvml, "nvmlDeviceGetHandleByIndex", i)
            if int(_call(nvml, "nvmlDeviceGetMinorNumber", h)) in want:
                total += int(_call(nvml, "nvmlDeviceGetMemoryInfo", h).used)
        return total


@contextlib.contextmanager
def _session(nvml: Any, hint: str = "") -> Iterator[bool]:
    """NVML initialised for the block (True), or False where NVML says this node has no
    NVIDIA stack (_NO_GPU_ERRORS); any other init failure is a GpuError. Shut down after."""
    no_gpu = {getattr(nvml, name) for name in _NO_GPU_ERRORS}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        if getattr(e, "value", None) in no_gpu:
            yield False
            return
        raise GpuError("nvmlInit", str(e), hint) from None
    try:
        yield True
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def from_procfs(root: Path = PROCFS) -> NodeGpus:
    """The driver version and GPUs the NVIDIA kernel module lists under `root`.

    GPUs come in PCI bus id order, NVML's enumeration order, so indexes agree
    with NVML's; a GPU the driver excludes ("GPU Excluded: Yes") is left out,
    as NVML leaves it out. procfs tells neither the CUDA driver version nor the
    memory size: those are "" and 0. No driver there: an empty NodeGpus.
    """
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", _read(root / "version"))
    gpus: list[Gpu] = []
    for info in sorted((root / "gpus").glob("*/information")):
        f = dict((k.strip(), v.strip()) for k, _, v in
                 (line.partition(":") for line in _read(info).splitlines()) if v.strip())
        if f.get("GPU Excluded", "No").lower().startswith("y"):
            continue
        if not f.get("Device Minor", "").isdigit():
            raise PreconditionError(f"{info}: no 'Device Minor' line; cannot tell this GPU's /dev/nvidiaN",
                                    path=str(info))
        gpus.append(Gpu(index=len(gpus), product=f.get("Model", ""), uuid=f.get("GPU UUID", ""),
                        minor=int(f["Device Minor"]), memory_bytes=0,
                        pci_bus_id=f.get("Bus Location", info.parent.name)))
    if not m and not gpus:
        return NodeGpus()
    return NodeGpus(driver_version=m.group(1) if m else "", gpus=tuple(gpus), source="procfs")


def cuda_version(v: int) -> str:
    """NVML's integer CUDA version (13000) as "13.0"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _call(nvml: Any, name: str, *args: Any) -> Any:
    try:
        return getattr(nvml, name)(*args)
    except nvml.NVMLError as e:
        raise GpuError(name, str(e)) from None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _pynvml() -> Any:
    try:
        with warnings.catch_warnings():
            # The deprecated "pynvml" wrapper package warns on import; its
            # module is nvidia-ml-py's all the same.
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml
    except ImportError as e:
        raise PreconditionError(f"pynvml is not importable ({e}): install nvidia-ml-py") from None
    return pynvml
