"""An image directory's metadata, thaw.json: what a restore of a runsc checkpoint
image needs beside runsc's own files, written by both doors at checkpoint
(the CLI, control/lifecycle/sandbox.py; thawd, control/thawd/autocheckpoint.py)
and read back at restore.

Fields: "version" (IMAGE_META_VERSION), "door" ("cli" or "containerd": a
containerd image names its container's root filesystem and mounts and
restores only through containerd), "spec" (the OCI spec runsc validates at
restore), "files" (runsc's files and their sizes), "gpu" (what a restore
needs in GPUs: control/lifecycle/gpus.py needs), "checkpoint_s",
"created_at"; the CLI's also "sandbox", "net", "probes", "runsc_version",
"platform", "network", "nvproxy", "rootfs" (rootfs_layout).

A Kubernetes pod's image (control/thawd/pods.py) is its sandbox's: "spec" is
the pause container's, "containers" maps each app container's name to its spec
as runsc saved it, and "gpu" is {"containers": {name: needs}} for the pod's
GPU containers (None when none holds a GPU).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

from control.config import Settings
from control.errors import ImageError, ThawError
from control.files import write_json_atomic
from control.lifecycle import gpus as gpumod
from nvproxy.cuda import uses_gpu
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import IMAGE_FILES

log = logging.getLogger(__name__)

IMAGE_META = "thaw.json"
IMAGE_META_VERSION = 1
# The workload's log as it was checkpointed (its last node.log_max_bytes): a
# restore replays it into the new sandbox's log first, so `thaw logs` of a
# restored sandbox shows what its process printed before, then what it prints now.
IMAGE_LOG = "workload.log"
DOOR_CLI, DOOR_CONTAINERD = "cli", "containerd"


def write(image: Path, door: str, spec: dict, files: dict[str, int], gpu: dict | None, checkpoint_s: float,
          **more) -> dict:
    """Write `image`'s thaw.json (atomically), the fields every door writes plus `more`."""
    meta = {"version": IMAGE_META_VERSION, "door": door, "spec": spec, "files": files, "gpu": gpu,
            "checkpoint_s": checkpoint_s, "created_at": time.time(), **more}
    write_json_atomic(Path(image) / IMAGE_META, meta)
    return meta


def saved_spec(image: Path, container: str = "") -> dict | None:
    """The spec an image was saved with (`container`: that app container's, in a pod's
    image); None for an image without it (an older thaw)."""
    try:
        meta = json.loads((Path(image) / IMAGE_META).read_text())
        spec = meta["containers"][container] if container else meta["spec"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return spec if isinstance(spec, dict) else None


def spec_mismatch(image: Path, spec: dict, container: str = "") -> str:
    """Why runsc would refuse to restore `image` into a container with `spec`
    (mount destinations/types/options, devices, the GPU count: nvproxy/restore_spec.py
    check_restore_compatible), said before runsc runs; "" when it would not,
    or when the image does not carry its spec (runsc's own validation decides).
    `container`: an app container of a pod's image, by name. One judgement for a
    lone container and a pod's: the GPUs assigned now may be others than at
    checkpoint, never another number of them."""
    from nvproxy import restore_spec
    saved = saved_spec(image, container)
    if saved is None:
        return ""
    try:
        restore_spec.check_restore_compatible(saved, spec)
    except ThawError as e:
        return e.message
    return ""


def read_image(image: Path, memory: bool = True) -> dict:
    """Validate a checkpoint image directory; return its thaw.json. memory=False:
    thaw.json only, not the files it lists (what a cold start from its spec needs)."""
    if not image.is_dir():
        raise ImageError(str(image), "no such directory")
    try:
        meta = json.loads((image / IMAGE_META).read_text())
    except FileNotFoundError:
        raise ImageError(str(image), f"{IMAGE_META} is missing (not written by `thaw checkpoint`?)") from None
    except ValueError as e:
        raise ImageError(str(image), f"{IMAGE_META} is not valid JSON: {e}") from None
    if isinstance(meta, dict) and meta.get("door", "cli") != "cli":
        raise ImageError(str(image), f"made under {meta['door']} (its spec names that container's root "
                         "filesystem and mounts): it restores through containerd, not `thaw restore`")
    if not isinstance(meta, dict) or meta.get("version") != IMAGE_META_VERSION:
        raise ImageError(str(image), f"{IMAGE_META} has unknown version {meta.get('version') if isinstance(meta, dict) else meta!r}")
    files = meta.get("files")
    if not isinstance(files, dict) or "checkpoint.img" not in files:
        raise ImageError(str(image), f"{IMAGE_META} field files must list checkpoint.img")
    for name, size in files.items():
        if name not in IMAGE_FILES:
            raise ImageError(str(image), f"{IMAGE_META} lists unexpected file {name!r}")
        if not memory:
            continue
        p = image / name
        if not p.is_file():
            raise ImageError(str(image), f"{name} is missing")
        actual = p.stat().st_size
        if actual != size:
            raise ImageError(str(image), f"{name} is {actual} bytes, {size} were written (truncated or altered)")
    specmod.validate(meta.get("spec"), f"{image / IMAGE_META}:spec")
    if meta.get("network") not in ("sandbox", "none"):
        raise ImageError(str(image), f"{IMAGE_META} field network must be sandbox or none")
    return meta


def rootfs_layout(spec: dict, settings: Settings) -> dict:
    """How the image's root filesystem is found on the restoring node (thaw.json "rootfs").

    "host": an empty directory thaw made under <state_dir>/rootfs for a command
    sandbox (`thaw run -- CMD`), whose content is the node's own system
    directories, bound read-only; a restore makes a fresh one. "path": a root
    filesystem the user gave (`--bundle`): node-local, it must exist at the same
    place (runsc accepts another root.path; thaw does not move user files).
    """
    root = Path((spec.get("root") or {}).get("path", ""))
    host_dir = settings.state_dir / "rootfs"
    if root.is_absolute() and host_dir in root.parents:
        return {"layout": "host"}
    return {"layout": "path", "path": str(root)}


def gpu_needs(spec: dict, node: Callable[[], gpumod.NodeGpus] | None = None) -> dict | None:
    """What a restore of an image of `spec` needs in GPUs (thaw.json "gpu",
    control/lifecycle/gpus.py needs); None for a CPU spec. `node` answers this
    node's GPUs (default: NVML). NVML failing leaves product, driver and
    indexes empty ("unknown"): the image stays restorable, its metadata says less."""
    if not uses_gpu(spec):
        return None
    try:
        if node is None:
            from nvproxy import gpu
            facts = gpu.probe()
        else:
            facts = node()
    except ThawError as e:
        log.warning("GPU facts for the image metadata: %s", e)
        facts = None
    return gpumod.needs(spec, facts)


def pod_gpu_needs(specs: dict[str, dict], node: Callable[[], gpumod.NodeGpus] | None = None) -> dict | None:
    """thaw.json "gpu" of a pod's image whose app containers had `specs` (by name):
    each GPU container's needs (gpu_needs); None when none holds a GPU."""
    gpu = {n: s for n, s in specs.items() if uses_gpu(s)}
    if not gpu:
        return None
    facts: list = []

    def once() -> gpumod.NodeGpus:   # NVML once for all of them
        if not facts:
            from nvproxy import gpu as nvgpu
            facts.append(node() if node is not None else nvgpu.probe())
        return facts[0]
    return {"containers": {n: gpu_needs(s, once) for n, s in sorted(gpu.items())}}


def injected_devices(spec: dict) -> list[str]:
    """The CDI devices thaw injected into `spec` (nvproxy/cdi.py INJECTED_ANNOTATION)."""
    from nvproxy import cdi
    try:
        rec = json.loads((spec.get("annotations") or {}).get(cdi.INJECTED_ANNOTATION) or "{}")
    except ValueError:
        return []
    return [str(d) for d in rec.get("devices") or []]


def spec_for_node(meta: dict, settings: Settings, sid: str, image: Path,
                   place_gpus: Callable[[dict], dict] | None = None) -> dict:
    """The image's saved spec made to run on this node as sandbox `sid`: a fresh
    host-layout rootfs, this node's GPUs (`place_gpus`), and every host path
    it binds checked, so a missing one is a clear ImageError naming it instead
    of runsc's "client sync file: EOF"."""
    import copy
    spec = copy.deepcopy(meta["spec"])
    layout = (meta.get("rootfs") or {}).get("layout")
    if layout == "host":
        spec["root"]["path"] = str(specmod.prepare_host_rootfs(settings.state_dir / "rootfs" / sid))
    root = Path(spec["root"]["path"])
    if not root.is_dir():
        raise ImageError(str(image), f"its root filesystem {root} is not on this node (a directory of the node "
                         "it was saved on: a --bundle rootfs); restore it where that directory exists")
    if place_gpus is not None:
        spec = place_gpus(spec)
    missing = missing_binds(spec)
    if missing:
        raise ImageError(str(image), f"host path(s) its sandbox binds are not on this node: {', '.join(missing)}")
    return spec


def missing_binds(spec: dict) -> list[str]:
    return [m["source"] for m in spec.get("mounts") or []
            if m.get("type") == "bind" and str(m.get("source", "")).startswith("/")
            and not os.path.exists(m["source"])]


def node_local(meta: dict, settings: Settings | None = None) -> list[str]:
    """What an image needs that only the node it was saved on is sure to have:
    a --bundle root filesystem (a path on that node) and host paths it binds
    beyond the system directories of a command sandbox. Empty: portable (the
    restoring node makes a fresh rootfs and re-injects GPUs and the helper)."""
    from nvproxy import cdi, helper
    out = []
    rootfs = meta.get("rootfs") or {}
    if rootfs.get("layout") != "host":
        out.append(f"root filesystem {rootfs.get('path') or (meta.get('spec') or {}).get('root', {}).get('path')}")
    try:
        injected = json.loads(((meta.get("spec") or {}).get("annotations") or {}).get(cdi.INJECTED_ANNOTATION)
                              or "{}").get("mounts") or []
    except ValueError:
        injected = []
    system = set(specmod.HOST_SYSTEM_DIRS)
    for m in (meta.get("spec") or {}).get("mounts") or []:
        dest, src = m.get("destination", ""), str(m.get("source", ""))
        if m.get("type") != "bind" or not src.startswith("/") or dest in injected or dest == helper.HELPER_DIR:
            continue
        if dest in system or src in system:
            continue
        out.append(f"bind mount {src} -> {dest}")
    return out
