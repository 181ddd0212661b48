"""GPUs for the sandboxes thaw runs itself (the CLI door): which devices a
request names, their injection with the CUDA checkpoint helper, what an
image says it needs, and the checks a restore makes before runsc runs.

A request (`thaw run --gpus`, `thaw restore --gpus`) is comma-separated:
`all`, an NVML index (`0`), a UUID (`GPU-…`) or a CDI name
(`nvidia.com/gpu=0`, any vendor/class). It becomes CDI device names, resolved
against this node's CDI registry (spec files in /etc/cdi and /var/run/cdi, else
a spec generated from NVML: nvproxy/cdi.py node_registry) and injected into
the spec (device nodes, driver files, env). A spec with /dev/nvidiactl gets
the CUDA checkpoint helper mounted at nvproxy.helper.HELPER_DIR, so that
`thaw checkpoint` passes --cuda-checkpoint-path (control/lifecycle/engine.py).

An image's thaw.json "gpu" says what a restore needs: the GPU count, the
product and driver of the node it was saved on (runsc pairs saved and new
GPUs by minor and needs identical models, and refuses another driver
version: docs/notes/gvisor-facts.md), the NVML indexes it ran on and its CDI
devices. `thaw restore` without --gpus restores onto the same indexes:
the one choice that means the same thing on every node (a UUID names one
physical GPU of one node). With --gpus, the GPUs given now, through
nvproxy/restore_spec.py for_restore (strip the saved injection, inject the new
devices, check the mounts and the count). Every refusal happens before runsc
runs and says what the image needs and what the node has.

NVML and the CDI directories are behind `Devices` (tests pass a fake).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from control.errors import ImageError, NotFound, PreconditionError, UserError
from nvproxy import cdi, restore_spec
from nvproxy import cuda as cudamod
from nvproxy.gpu import Gpu, NodeGpus

KIND = cdi.NVIDIA_KIND
_INDEX = re.compile(r"^[0-9]+$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")


def parse_request(text: str) -> list[str]:
    """`--gpus` text -> CDI device names, in order, without repeats.
    UserError for anything that is none of all / N / GPU-UUID / vendor.com/class=name."""
    names: list[str] = []
    for word in (w.strip() for w in (text or "").split(",")):
        if not word:
            continue
        if word == "all" or _INDEX.match(word) or _UUID.match(word):
            name = f"{KIND}={word}"
        elif "=" in word:
            try:
                cdi.parse_qualified(word)
            except UserError:
                raise UserError(f"--gpus {text!r}: {word!r} is not a CDI device name (vendor.com/class=name)") \
                    from None
            name = word
        else:
            raise UserError(f"--gpus {text!r}: {word!r} is none of all, an index (0), a UUID (GPU-...) "
                            "or a CDI device name (nvidia.com/gpu=0)")
        if name not in names:
            names.append(name)
    if not names:
        raise UserError("--gpus needs at least one GPU: all, 0, 0,1, GPU-<uuid> or nvidia.com/gpu=0")
    return names


@dataclass(frozen=True)
class Devices:
    """This node's GPUs (NVML) and CDI devices; `stat` reads device nodes."""
    gpus: NodeGpus
    registry: cdi.Registry
    stat: Callable[[str], os.stat_result] = os.stat


def node_devices(cdi_dirs: Iterable[Path] = cdi.CDI_DIRS) -> Devices:
    """NVML's answer and the node's CDI registry (a spec generated from NVML
    when no spec file defines nvidia.com/gpu)."""
    from nvproxy import gpu
    node = gpu.probe()
    return Devices(node, cdi.node_registry(node, cdi_dirs))


def _require_gpus(names: list[str], dev: Devices, what: str) -> None:
    if any(n.startswith(KIND + "=") for n in names) and not dev.gpus \
            and not dev.registry.names(KIND):
        raise PreconditionError(f"{what}: this node has no NVIDIA GPU (NVML and /proc/driver/nvidia "
                                "found none, and no CDI spec defines nvidia.com/gpu)")


def inject(spec: dict, names: list[str], dev: Devices, helper_host_dir: Path | None) -> dict:
    """A copy of `spec` with the CDI devices `names` and, for a GPU spec, the CUDA helper."""
    _require_gpus(names, dev, f"GPUs {', '.join(names)}")
    out = cdi.inject(spec, dev.registry, names, dev.stat)
    return _with_helper(out, helper_host_dir)


def with_helper(spec: dict, helper_host_dir: Path | None) -> dict:
    """A copy of `spec` with the CUDA helper mounted when it is a GPU spec."""
    import copy
    return _with_helper(copy.deepcopy(spec), helper_host_dir)


def _with_helper(spec: dict, helper_host_dir: Path | None) -> dict:
    cudamod.mount_helper(spec, helper_host_dir)
    return spec


def assigned(spec: dict, node: NodeGpus) -> list[Gpu]:
    """The node's GPUs behind the spec's /dev/nvidiaN, by minor (as runsc pairs them)."""
    by_minor = {g.minor: g for g in node.gpus}
    out = []
    for path in cdi.gpu_nodes(spec):
        g = by_minor.get(int(path[len("/dev/nvidia"):]))
        if g is not None:
            out.append(g)
    return out


def needs(spec: dict, node: NodeGpus | None) -> dict | None:
    """thaw.json "gpu" of an image saved from `spec` on this node; None for a CPU image.

    count: GPUs the sandbox holds; product/driver_version: this node's ("" when
    NVML could not tell); indexes: the NVML indexes of the GPUs it ran on (the
    default of a restore); devices: the CDI devices injected at run.
    """
    if not cudamod.uses_gpu(spec):
        return None
    import json
    nodes = cdi.gpu_nodes(spec)
    held = assigned(spec, node) if node else []
    try:
        injected = json.loads((spec.get("annotations") or {}).get(cdi.INJECTED_ANNOTATION) or "{}")
    except ValueError:
        injected = {}
    products = sorted({g.product for g in held}) if held else \
        sorted({g.product for g in node.gpus}) if node else []
    return {"count": len(nodes), "product": ",".join(products), "driver_version": node.driver_version if node else "",
            "indexes": [g.index for g in held] if len(held) == len(nodes) else [],
            "devices": list(injected.get("devices") or [])}


def default_request(need: dict, image: str) -> list[str]:
    """The CDI names of a restore without --gpus: the indexes the image ran on."""
    idx = need.get("indexes") or []
    if len(idx) != need.get("count"):
        raise ImageError(image, f"it was saved with {need.get('count')} GPU(s) but does not say on which "
                         "indexes: pass --gpus")
    return [f"{KIND}={i}" for i in idx]


def describe(need: dict) -> str:
    """'1 GPU(s) (NVIDIA H200, driver 580.159.04)'."""
    facts = [need.get("product") or "", f"driver {need['driver_version']}" if need.get("driver_version") else ""]
    facts = [f for f in facts if f]
    return f"{need.get('count')} GPU(s)" + (f" ({', '.join(facts)})" if facts else "")


def check_node(need: dict, chosen: list[Gpu], node: NodeGpus, image: str, request: str) -> None:
    """Refuse, before runsc runs, a restore this node's GPUs cannot take."""
    want = describe(need)
    if not node:
        raise PreconditionError(f"image {image} needs {want}; this node has no NVIDIA GPU")
    if len(chosen) != need.get("count"):
        raise ImageError(image, f"it needs {want}; {request} assigns {len(chosen)} "
                         f"({', '.join(str(g.index) for g in chosen) or 'none'}): runsc restores onto as many "
                         "GPUs as were saved")
    if need.get("driver_version") and node.driver_version and node.driver_version != need["driver_version"]:
        raise ImageError(image, f"it was saved with NVIDIA driver {need['driver_version']}; this node has "
                         f"{node.driver_version} (runsc restores only onto the same driver)")
    saved = set((need.get("product") or "").split(",")) - {""}
    other = sorted({g.product for g in chosen if saved and g.product not in saved})
    if other:
        raise ImageError(image, f"it was saved on {need['product']}; {request} assigns {', '.join(other)} "
                         "(runsc restores onto identical GPU models only)")


def for_restore(saved_spec: dict, need: dict, request: list[str] | None, dev: Devices,
                helper_host_dir: Path | None, image: str) -> dict:
    """The image's spec with this node's GPUs: `request` (CDI names) or, when
    None, the indexes it was saved on; checked against what the image needs."""
    names = request or default_request(need, image)
    what = "--gpus " + ",".join(n.removeprefix(KIND + "=") for n in names) if request else \
        f"the image's own GPU indexes ({','.join(str(i) for i in need.get('indexes') or [])}; pass --gpus to choose)"
    if not dev.gpus:
        check_node(need, [], dev.gpus, image, what)
    try:
        probe = cdi.inject(cdi.strip(saved_spec), dev.registry, names, dev.stat)
    except NotFound as e:
        raise NotFound(e.what, e.name, f"{what}: this node has GPUs "
                       f"{', '.join(f'{g.index} ({g.uuid})' for g in dev.gpus.gpus)}") from None
    check_node(need, assigned(probe, dev.gpus), dev.gpus, image, what)
    new = restore_spec.for_restore(saved_spec, saved_spec, dev.registry, names, dev.stat)
    return _with_helper(new, helper_host_dir)


def for_cold(saved_spec: dict, need: dict, request: list[str] | None, dev: Devices,
             helper_host_dir: Path | None, image: str) -> dict:
    """The image's spec with this node's GPUs for a cold start (no restore
    checks: a fresh start takes whatever GPUs it is given)."""
    names = request or default_request(need, image)
    return inject(cdi.strip(saved_spec), names, dev, helper_host_dir)
