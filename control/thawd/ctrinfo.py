"""Whose a containerd container is and which image it runs, from containerd's
own records: thawd's source of a container's tenant and image digest (issue 13).

The shim hands thawd nothing but a container id, a bundle and the runsc root
it runs the container under. gVisor's shim makes that root
`<runsc.toml root>/<containerd namespace>` (pkg/shim/v1/proc/init.go
NewRunsc: filepath.Join(root, namespace), the namespace from containerd's
request context), so the namespace is the root's last component when the
root sits directly under `containerd.runsc_root`. thawd then asks containerd
itself (thaw-ctrinfo, go/cmd/thaw-ctrinfo, containerd's Go client) for that
container in that namespace: it must exist there, and its records name the
image and the pod. Nothing is read from the container's annotations or
labels that an image or a workload could have written:

- CRI (the namespace is `containerd.cri_namespace` and the container carries
  the CRI plugin's metadata extension): the tenant is the pod sandbox's
  Kubernetes namespace as the CRI plugin recorded it from the kubelet's
  RunPodSandbox request (its sandbox metadata extension); the container's
  `io.kubernetes.pod.namespace` label (set by the kubelet; image labels are
  merged under it, containerd internal/cri/util BuildLabels) must agree. The
  image is the digest the plugin resolved when it created the container
  (container metadata ImageDigest).
- Plain containerd (ctr, nerdctl, any client): the tenant is the containerd
  namespace; the image is the target digest of the image record the container
  names, and that image's rootfs chain must be the parent of the container's
  snapshot: a tag moved to other content after the container was made
  (re-pushed) is refused rather than believed.

Every failure is an IdentityError whose code is the decision reason.
"""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from control.config import Settings
from control.errors import IdentityError
from control.lifecycle import tenant as tenantmod

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Identity:
    tenant: str        # the container's tenant (before any narrowing by annotation)
    image: str         # the image digest in its workload key
    source: str        # how it was established, for logs: "cri pod namespace x", "containerd namespace y"


def namespace_of(runsc_root: Path, containerd_runsc_root: Path) -> str:
    """The containerd namespace of a container the shim runs under `runsc_root`."""
    if runsc_root.parent != containerd_runsc_root:
        raise IdentityError("identity-unknown", f"runsc root {runsc_root} is not <containerd.runsc_root>/<namespace> "
                            f"(containerd.runsc_root is {containerd_runsc_root})")
    return runsc_root.name


def _invoke(settings: Settings, namespace: str, args: list[str], timeout_s: float, fail) -> dict:
    """thaw-ctrinfo's JSON answer to `args` in containerd namespace `namespace`; `fail(detail)`
    makes the exception for every way it can go wrong (not found, no answer, its error)."""
    binary = settings.containerd_info
    argv = [str(binary), "-address", settings.containerd_address, "-namespace", namespace,
            "-timeout", f"{timeout_s:g}s", *args]
    try:
        p = subprocess.run(argv, capture_output=True, timeout=timeout_s + 5, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise fail(f"thaw-ctrinfo not found at {binary} (containerd.info)") from None
    except subprocess.TimeoutExpired:
        raise fail(f"containerd did not answer thaw-ctrinfo {args[0]} within {timeout_s:g}s "
                   "(containerd.info_timeout_s)") from None
    try:
        out = json.loads(p.stdout or b"{}")
    except ValueError:
        out = {}
    if p.returncode != 0 or "error" in out:
        err = out.get("error") or {}
        detail = err.get("detail") or p.stderr.decode(errors="replace").strip()[-500:] or f"exit {p.returncode}"
        raise fail(f"containerd at {settings.containerd_address}: {err.get('kind', 'error')}: {detail}")
    return out


def lookup(settings: Settings, namespace: str, container_id: str) -> dict:
    """thaw-ctrinfo's record of a container (see its doc comment for the fields)."""
    out = _invoke(settings, namespace, [container_id], settings.containerd_info_timeout_s,
                  lambda detail: IdentityError("identity-unknown", detail))
    if out.get("namespace") != namespace or out.get("id") != container_id:
        raise IdentityError("identity-unknown", "thaw-ctrinfo answered for another container")
    return out


def identify(settings: Settings, namespace: str, info: dict, sandbox: bool = False) -> Identity:
    """The tenant and image digest of a container from containerd's record (`lookup`).
    `sandbox`: the container is a CRI pod's sandbox (pause) container, which the CRI
    plugin records with no image digest: only its tenant is told (image ""), for the
    pod's lookup key (control/lifecycle/pod.py lookup); the pod's app containers
    carry the image digests. A record that is no pod sandbox is refused."""
    mapping = settings.tenant_map
    cri = info.get("cri")
    if namespace == settings.containerd_cri_namespace and not cri:
        # Only the CRI plugin's records name a pod; a container made there by
        # another client names nobody (not even "the CRI namespace").
        raise IdentityError("identity-unknown", f"container in containerd's CRI namespace {namespace!r} without "
                            "the CRI plugin's records")
    if namespace == settings.containerd_cri_namespace:
        pod_ns = cri.get("pod_namespace") or ""
        if not pod_ns:
            raise IdentityError("identity-unknown", "the CRI plugin's records name no pod namespace")
        if cri.get("label_namespace") and cri["label_namespace"] != pod_ns:
            raise IdentityError("identity-unknown", f"label io.kubernetes.pod.namespace={cri['label_namespace']!r} "
                                f"disagrees with the pod sandbox's namespace {pod_ns!r}")
        tenant = tenantmod.resolve(tenantmod.ORIGIN_K8S, pod_ns, mapping)
        if sandbox:
            # thaw-ctrinfo names a sandbox's own id as its sandbox_id (go/cmd/thaw-ctrinfo criOf).
            if cri.get("sandbox_id") != info.get("id"):
                raise IdentityError("identity-unknown", f"container {info.get('id')!r} is not a pod sandbox "
                                    f"(its pod sandbox is {cri.get('sandbox_id')!r})")
            return Identity(tenant, "", f"pod namespace {pod_ns} (CRI sandbox)")
        image = cri.get("image_digest") or ""
        if not _DIGEST.match(image):   # a pod's sandbox (pause) container has none
            raise IdentityError("no-image-digest", f"the CRI plugin recorded no image digest for this container "
                                f"(pod {pod_ns}/{cri.get('pod_name', '')})")
        return Identity(tenant, image, f"pod namespace {pod_ns} (CRI)")
    if sandbox:
        raise IdentityError("identity-unknown", f"container in containerd namespace {namespace!r} is no CRI pod "
                            "sandbox")
    image = info.get("image_digest") or ""
    if not info.get("image") or not _DIGEST.match(image):
        raise IdentityError("no-image-digest", "containerd records no image for this container "
                            f"(image {info.get('image')!r}): thaw keys checkpoints by image digest")
    parent = info.get("snapshot_parent") or ""
    if parent != info.get("chain_id"):
        raise IdentityError("image-moved", f"image {info['image']} now names {image}, whose layers "
                            f"({info.get('chain_id')}) are not the container's rootfs ({parent or 'none'}): "
                            "the name was moved to other content after the container was made")
    return Identity(tenantmod.resolve(tenantmod.ORIGIN_CONTAINERD, namespace, mapping), image,
                    f"containerd namespace {namespace}")


def identify_container(settings: Settings, runsc_root: Path, container_id: str, sandbox: bool = False) -> Identity:
    ns = namespace_of(runsc_root, settings.containerd_runsc_root)
    return identify(settings, ns, lookup(settings, ns, container_id), sandbox=sandbox)


# A root filesystem of an image's layers for a sandbox thawd restores ahead of
# demand (control/thawd/parking.py): an active snapshot made by containerd's own
# snapshotter, a GC root, mounted at `target` by thaw-ctrinfo (go/cmd/thaw-ctrinfo
# rootfs.go). Mounting and unpacking can take longer than a lookup.
ROOTFS_TIMEOUT_S = 60.0


def _rootfs(settings: Settings, namespace: str, args: list[str], timeout_s: float | None = None) -> dict:
    from control.errors import ThawError
    return _invoke(settings, namespace, args, ROOTFS_TIMEOUT_S if timeout_s is None else timeout_s,
                   lambda detail: ThawError(f"thaw-ctrinfo {args[0]} (namespace {namespace}): {detail}"))


def rootfs_prepare(settings: Settings, namespace: str, snapshotter: str, parent: str, target: Path,
                   key: str) -> dict:
    """Mount at `target` a writable snapshot `key` of the layers `parent` (a chain id)."""
    return _rootfs(settings, namespace, ["rootfs-prepare", "-snapshotter", snapshotter, "-parent", parent,
                                         "-target", str(target), key])


def rootfs_remove(settings: Settings, namespace: str, snapshotter: str, target: Path, key: str,
                  timeout_s: float | None = None) -> bool:
    """Unmount `target` and remove snapshot `key` (both idempotent); True when the snapshot existed."""
    return bool(_rootfs(settings, namespace, ["rootfs-remove", "-snapshotter", snapshotter, "-target",
                                              str(target), key], timeout_s).get("removed"))
