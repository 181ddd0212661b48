"""The compatibility tuple: what a node must share with the node that saved an
image for runsc to restore it there (ARCHITECTURE.md, "Data").

runsc refuses a restore under a different runsc version string, NVIDIA driver
version or global flags, and needs the CPU features it saved against to be a
subset of the restoring CPU's (docs/notes/gvisor-facts.md). The tuple records those
facts, plus what thaw adds (GPU product and count, CUDA driver version,
machine type), and `check` explains a mismatch field by field.

`node_tuple` is the one builder of a node's tuple: thawd (which publishes
images under it and matches them against it), `thaw doctor` and `thaw
provision` (which print it) all call it, and its GPU half comes from the one
GPU reader, nvproxy/gpu.py `probe` (NVML, else /proc/driver/nvidia). So doctor
prints the hash thawd serves (its Health RPC) on the same node.

GPU product rule: `gpu_product` is the node's distinct GPU product names,
sorted and joined by "," (`NodeGpus.compat`): "NVIDIA H200" on an 8 x H200
node, "NVIDIA A100-SXM4-80GB,NVIDIA H200" on a mixed one. Count and order of
enumeration do not enter it; `gpu_count` carries the count.

No GPU is a valid tuple: product "", count 0, driver and CUDA versions "".
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform as _platform
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from control.config import Settings
from control.errors import ImageError, ManifestError, TupleMismatch
from nvproxy import gpu as gpumod

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompatTuple:
    runsc_version: str            # `runsc --version`, e.g. thaw-gvisor-160fafc42237
    platform: str                 # runsc --platform (systrap, kvm, ptrace)
    arch: str                     # uname -m
    cpu_features: tuple[str, ...]  # `runsc cpu-features`, sorted
    gpu_product: str              # distinct GPU product names, sorted, ","-joined; "" without GPU
    gpu_count: int
    driver_version: str           # NVIDIA driver, e.g. 580.159.04; "" without GPU
    cuda_driver_version: str      # CUDA version the driver supports, e.g. 13.0; "" without GPU
    machine_type: str             # from config node.machine_type

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cpu_features"] = list(self.cpu_features)
        return d

    def hash(self) -> str:
        """A stable SHA-256 of the canonical JSON of every field (hex)."""
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()

    @classmethod
    def from_dict(cls, d: Any, where: str = "tuple", source: str | None = None) -> "CompatTuple":
        """Validate and build; a bad field raises ManifestError naming `where.field`."""
        if not isinstance(d, dict):
            raise ManifestError(where, "must be an object", source)
        names = {f.name for f in fields(cls)}
        for k in d:
            if k not in names:
                raise ManifestError(f"{where}.{k}", "unknown field", source)
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                raise ManifestError(f"{where}.{f.name}", "missing", source)
            v = d[f.name]
            if f.name == "cpu_features":
                if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                    raise ManifestError(f"{where}.{f.name}", "must be a list of non-empty strings", source)
                v = tuple(sorted(set(v)))
            elif f.name == "gpu_count":
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ManifestError(f"{where}.{f.name}", "must be a non-negative integer", source)
            elif not isinstance(v, str):
                raise ManifestError(f"{where}.{f.name}", "must be a string", source)
            kw[f.name] = v
        return cls(**kw)


@dataclass(frozen=True)
class Mismatch:
    field: str
    image: Any
    node: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


def check(image: CompatTuple, node: CompatTuple) -> list[Mismatch]:
    """Why an image saved under `image` cannot restore on `node` (empty: it can).

    Every field must be equal, except CPU features, where the node's set must
    contain the image's (runsc restores onto a superset).
    """
    out: list[Mismatch] = []
    for f in fields(CompatTuple):
        a, b = getattr(image, f.name), getattr(node, f.name)
        if f.name == "cpu_features":
            missing = sorted(set(a) - set(b))
            if missing:
                shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
                out.append(Mismatch(f.name, a, b, f"node lacks {len(missing)} CPU feature(s) the image "
                                                  f"was saved with: {shown}"))
        elif a != b:
            out.append(Mismatch(f.name, a, b, f"image has {a!r}, node has {b!r}"))
    return out


# -- an image directory's tuple (issue 30) --------------------------------------------

IMAGE_TUPLE = "tuple"   # the thaw.json field `thaw checkpoint` records (control/lifecycle/sandbox.py)


def image_tuple(meta: dict, image: str) -> CompatTuple | None:
    """The tuple an image directory's thaw.json records (`thaw checkpoint` since issue 30),
    None for an image that records none; ImageError when it is malformed."""
    d = meta.get(IMAGE_TUPLE)
    if d is None:
        return None
    try:
        return CompatTuple.from_dict(d, IMAGE_TUPLE)
    except ManifestError as e:
        raise ImageError(image, f"thaw.json field {e.field}: {e.message.rsplit(': ', 1)[-1]}") from None


def check_image(meta: dict, image: str, node: CompatTuple) -> None:
    """TupleMismatch (exit 3, one reason per field) unless the image whose thaw.json is `meta`
    restores on `node`: said before runsc runs, which otherwise restored on another runsc or a
    CPU without a saved feature with exit 0, or failed mid-restore with exit 1. An image of an
    older thaw records only runsc's version and platform: those are compared."""
    tup = image_tuple(meta, image)
    if tup is not None:
        bad = [str(m) for m in check(tup, node)]
    else:
        bad = [f"{f}: image has {meta[f]!r}, node has {getattr(node, f)!r}" for f in ("runsc_version", "platform")
               if isinstance(meta.get(f), str) and meta[f] != getattr(node, f)]
    if bad:
        raise TupleMismatch(image, bad)


# -- the node's own tuple ------------------------------------------------------

class _RunscFacts(Protocol):
    def version(self) -> str: ...
    def cpu_features(self) -> list[str]: ...


def node_tuple(settings: Settings, runsc: _RunscFacts | None = None,
               gpus: gpumod.NodeGpus | None = None, arch: str | None = None) -> CompatTuple:
    """This node's tuple. `runsc` (default: the configured runsc) answers the
    version and CPU features; `gpus` (default: nvproxy.gpu.probe(), whose
    GpuError on a broken driver propagates) the GPU half; `arch` defaults to
    uname -m. Callers that already hold these facts (doctor) pass them in."""
    if runsc is None:
        from runsc_hooks.runsc import GlobalOptions, Runsc
        runsc = Runsc(settings.runsc_path, GlobalOptions(root=settings.runsc_root,
                                                         platform=settings.runsc_platform),
                      timeout_s=settings.runsc_timeout_s)
    g = (gpumod.probe() if gpus is None else gpus).compat()
    return CompatTuple(runsc_version=runsc.version(), platform=settings.runsc_platform,
                       arch=arch or _platform.machine(), cpu_features=tuple(sorted(set(runsc.cpu_features()))),
                       gpu_product=g["gpu_product"], gpu_count=g["gpu_count"], driver_version=g["driver_version"],
                       cuda_driver_version=g["cuda_driver_version"], machine_type=settings.machine_type)
