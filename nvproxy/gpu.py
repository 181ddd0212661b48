"""This node's GPUs, as NVML reports them: the GPU half of the compatibility tuple.

`probe()` answers with a `NodeGpus`. A node without NVIDIA GPUs (no NVML
library, no driver loaded, zero devices) is a normal answer: an empty
`NodeGpus`. NVML that is there but fails (permissions, a version mismatch
between libnvidia-ml and the kernel module, a lost GPU) is a `GpuError`
naming the NVML call and NVML's own message, because restoring a GPU image on
a node whose driver is broken must not look like "this node has no GPU".

NVML sits behind a seam: `probe(nvml=...)` takes any object with pynvml's
functions, constants and NVMLError class; the default is the `pynvml` module
from nvidia-ml-py.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from control.errors import GpuError, NotFound, PreconditionError

# NVML errors that mean "no NVIDIA GPU here" rather than "NVML is broken".
_NO_GPU_ERRORS = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


@dataclass(frozen=True)
class Gpu:
    index: int            # NVML index (enumeration order, by PCI bus id)
    product: str          # nvmlDeviceGetName, e.g. "NVIDIA H200"
    uuid: str             # "GPU-…"; stable across reboots
    minor: int            # /dev/nvidia<minor>
    memory_bytes: int     # total device memory
    pci_bus_id: str

    @property
    def device_path(self) -> str:
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True)
class NodeGpus:
    driver_version: str = ""          # e.g. "580.159.04"; "" without a GPU
    cuda_driver_version: str = ""     # the CUDA version the driver supports, e.g. "13.0"
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return bool(self.gpus)

    def compat(self) -> dict[str, Any]:
        """The GPU fields of the compatibility tuple (docs: ARCHITECTURE.md "Data")."""
        products = sorted({g.product for g in self.gpus})
        return {"gpu_product": ",".join(products), "gpu_count": len(self.gpus),
                "driver_version": self.driver_version, "cuda_driver_version": self.cuda_driver_version}

    def to_dict(self) -> dict[str, Any]:
        return {"driver_version": self.driver_version, "cuda_driver_version": self.cuda_driver_version,
                "gpus": [asdict(g) for g in self.gpus]}

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


def probe(nvml: Any = None) -> NodeGpus:
    """Ask NVML for the driver and every GPU; an empty NodeGpus when there is none."""
    nvml = _pynvml() if nvml is None else nvml
    no_gpu = {getattr(nvml, name) for name in _NO_GPU_ERRORS}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        if getattr(e, "value", None) in no_gpu:
            return NodeGpus()
        raise GpuError("nvmlInit", str(e), "is the NVIDIA kernel module the same version as libnvidia-ml?") from None
    try:
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
                        gpus=tuple(gpus))
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


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
