"""Kubernetes pods as thaw sees them through CRI: which container of a pod a
spec is, the containers a pod declares, and the pod's workload key.

Under CRI a pod is one gVisor sandbox: its root is the pause container
(`io.kubernetes.cri.container-type=sandbox`), the app containers join it as
subcontainers (`container`, with `io.kubernetes.cri.sandbox-id`). runsc saves
and restores the sandbox with all its containers at once and matches saved and
new containers by `io.kubernetes.cri.container-name` (runsc/boot/loader.go
registerContainer, restore.go restorer). The containerd handler copies the
pod's `thaw.dev/*` annotations into every container's spec
(control/node/containerd_config.py pod_annotations), so each container sees
the pod's opt-in and declarations:

  thaw.dev/workload              opt-in and workload name (control/lifecycle/workload.py)
  thaw.dev/ready.<container>     declares container <container> as one thaw
                                 expects, and its readiness probe: thawd checkpoints
                                 the pod once every declared container has started
                                 and passes its probe. A pod that declares none is
                                 never checkpointed (thaw does not guess how many
                                 containers the kubelet will create, or when they are warm).
  thaw.dev/health.<container>    health probe of that container after a restore
                                 (default: its readiness probe; a delay probe becomes
                                 "running", as for a lone container)
  thaw.dev/ready, thaw.dev/health (no container name), and no thaw.dev/ready.<container>:
                                 the pod's one container, whatever the kubelet names it
                                 (the common single-container pod); a second container
                                 in such a pod is undeclared, and the pod is not
                                 checkpointed

The pod's key composes per-container identities and lives here, not in
workload.py: workload.workload_key(spec, tenant, image) stays the identity of one
container (tenant, workload, image, args, key-env, GPUs), whatever it grows to; the
tenant and image digest come from containerd's records, never from the spec
(control/thawd/ctrinfo.py), so thawd hands each member's workload key in, and the
sandbox's tenant (its pause container has no image digest) for the lookup part.
`key = <lookup>-<10 hex>`, where the lookup part (tenant, workload, the
sandbox's own key and the declared names) is what thawd can compute when the
pause container is created, before the kubelet has created any app container,
and the last part hashes every container's identity: its workload key and a
fingerprint of the spec fields runsc validates at restore
(runsc/specutils/restore.go validateSpecForContainer), so that a pod runsc
would refuse to restore has another key and is known not to match before
anything is restored.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os.path
import re
from dataclasses import dataclass

from control.errors import UserError
from control.lifecycle import workload
from nvproxy import cdi
from runsc_hooks import probe as probemod

# CRI's annotations on every container's OCI spec (containerd internal/cri/annotations;
# runsc/specutils/cri.go reads the same names).
CRI_CONTAINER_TYPE = "io.kubernetes.cri.container-type"
CRI_SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
CRI_SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"        # the pod's name, on each of its containers; `ctr run` never sets it
CRI_SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
CRI_SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"
CRI_CONTAINER_NAME = "io.kubernetes.cri.container-name"    # runsc matches restored containers by it

ANNOTATION_READY_PREFIX = workload.ANNOTATION_READY + "."
ANNOTATION_HEALTH_PREFIX = workload.ANNOTATION_HEALTH + "."

# Kubernetes container names are DNS labels (RFC 1123).
_CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

SANDBOX, MEMBER, LONE = "sandbox", "member", "lone"


def role(spec: dict) -> str:
    """SANDBOX: a pod's pause container (CRI). MEMBER: an app container of a pod.
    LONE: anything else, e.g. a `ctr run` container that is its own sandbox and workload."""
    ann = spec.get("annotations") or {}
    kind = ann.get(CRI_CONTAINER_TYPE)
    if kind == "sandbox" and CRI_SANDBOX_NAME in ann:
        return SANDBOX
    if kind == "container" and ann.get(CRI_SANDBOX_ID):
        return MEMBER
    return LONE


def sandbox_id(spec: dict) -> str:
    return (spec.get("annotations") or {}).get(CRI_SANDBOX_ID, "")


def container_name(spec: dict) -> str:
    return (spec.get("annotations") or {}).get(CRI_CONTAINER_NAME, "")


def pod_uid(spec: dict) -> str:
    """The Kubernetes pod's uid: the same for every sandbox the kubelet makes for that pod."""
    ann = spec.get("annotations") or {}
    return ann.get(CRI_SANDBOX_UID) or ann.get(CRI_SANDBOX_ID, "")


# Set by gVisor's shim on a pod's sandbox spec: the pod's cgroup, which the sandbox
# joins (pkg/shim/v1/runsc/service.go setPodCgroup, runsc/container/container.go
# setupCgroupForRoot). It names the pod's uid, so it differs between any two pods,
# and runsc's restore checks compare it (runsc/specutils/restore.go
# shouldValidateAnnotation exempts linux.cgroupsPath but not this): no pod of a
# kubelet restored ("Annotations" does not match across checkpoint restore).
CGROUP_PARENT = "dev.gvisor.spec.cgroup-parent"


def fold_cgroup_parent(spec: dict) -> bool:
    """Move a sandbox spec's CGROUP_PARENT into linux.cgroupsPath, which runsc then
    gives the sandbox, as it gave it that annotation's path, and which its restore
    checks let change (the pause container's own cgroup below it goes unused). True
    when `spec` changed (write it back)."""
    ann = spec.get("annotations") or {}
    parent = ann.pop(CGROUP_PARENT, None)
    if parent is None:
        return False
    spec.setdefault("linux", {})["cgroupsPath"] = parent
    return True


@dataclass(frozen=True)
class PodRef:
    """The Kubernetes pod a CRI container belongs to, as containerd's CRI plugin wrote it
    into every container's spec from the kubelet's RunPodSandbox request (containerd
    internal/cri/annotations DefaultCRIAnnotations): where thawd's Events go and whose
    spec it reads (control/thawd/events.py, podspecs.py)."""
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_ref(spec: dict | None) -> PodRef | None:
    """The pod of a CRI container (its pause container or an app container); None for
    anything else (`ctr run`), which has no pod to post on."""
    ann = (spec or {}).get("annotations") or {}
    ns, name, uid = (ann.get(k, "") for k in (CRI_SANDBOX_NAMESPACE, CRI_SANDBOX_NAME, CRI_SANDBOX_UID))
    return PodRef(ns, name, uid) if ns and name and uid else None


@dataclass(frozen=True)
class Member:
    """A container a pod declares (thaw.dev/ready.<name>)."""
    name: str
    ready: "probemod.Probe"
    health: "probemod.Probe"


ANY = ""   # the declared name of a pod's one container declared by thaw.dev/ready alone


def declared(spec: dict) -> dict[str, Member]:
    """The containers the pod declares, by name (ANY: the pod's one container, named
    when the kubelet creates it); UserError naming the annotation when one is bad."""
    ann = spec.get("annotations") or {}
    out: dict[str, Member] = {}
    for k in sorted(ann):
        if not k.startswith(ANNOTATION_READY_PREFIX):
            continue
        name = k[len(ANNOTATION_READY_PREFIX):]
        if not _CONTAINER_NAME.match(name):
            raise UserError(f"annotation {k}: {name!r} is not a container name (a DNS label)", field=k)
        ready = workload.parse_probe(ann[k], k)
        hk = ANNOTATION_HEALTH_PREFIX + name
        if hk in ann:
            health = workload.parse_probe(ann[hk], hk)
        elif isinstance(ready, probemod.DelayProbe):
            health = probemod.RunningProbe()  # never wait out a readiness delay again after a restore
        else:
            health = ready
        out[name] = Member(name, ready, health)
    for k in ann:
        if k.startswith(ANNOTATION_HEALTH_PREFIX) and k[len(ANNOTATION_HEALTH_PREFIX):] not in out:
            raise UserError(f"annotation {k}: no {ANNOTATION_READY_PREFIX}{k[len(ANNOTATION_HEALTH_PREFIX):]} "
                            "declares that container", field=k)
    if not out and workload.ANNOTATION_READY in ann:
        # as workload.from_spec reads a lone container's probes (which also needs its identity)
        ready = workload.parse_probe(ann[workload.ANNOTATION_READY], workload.ANNOTATION_READY)
        if workload.ANNOTATION_HEALTH in ann:
            health = workload.parse_probe(ann[workload.ANNOTATION_HEALTH], workload.ANNOTATION_HEALTH)
        elif isinstance(ready, probemod.DelayProbe):
            health = probemod.RunningProbe()
        else:
            health = ready
        out[ANY] = Member(ANY, ready, health)
    return out


# -- identity and key ----------------------------------------------------------

def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _gvisor_annotations(ann: dict) -> dict:
    """The annotations runsc compares across a restore (restore.go shouldValidateAnnotation)."""
    allowed_flags = {f"dev.gvisor.flag.{f}" for f in ("debug", "debug-log", "debug-command", "debug-log-format",
                                                      "strace", "strace-syscalls", "strace-log-size", "log-packets")}
    return {k: v for k, v in ann.items()
            if k.startswith("dev.gvisor.") and not k.startswith("dev.gvisor.internal.")
            and not k.startswith("dev.gvisor.container-name-remap.")
            and not (k.startswith("dev.gvisor.spec.mount.") and k.endswith(".source")) and k not in allowed_flags}


def fingerprint(spec: dict) -> dict[str, str]:
    """Short hashes of the spec fields runsc validates at restore, one per field group
    (runsc/specutils/restore.go validateSpecForContainer): what may differ between the
    saved and the restoring container (hostname, env, cgroups path, hooks, resources,
    root and mount sources, namespace paths) is left out; arrays runsc compares as sets
    are sorted. GPU device nodes (/dev/nvidiaN) are left out too: runsc pairs saved
    and new GPUs by minor whatever their numbers (specutils removeNvproxyFrontendDevices),
    so a pod saved on GPU 0 restores onto GPU 1; how many a container holds is in its
    identity, and the GPUs it holds now are judged at its create as a lone container's
    are (control/thawd/pods.py, nvproxy/cdi.py check_restore_compatible)."""
    s = copy.deepcopy(spec)
    proc = s.get("process") or {}
    linux = s.get("linux") or {}
    args = list(proc.get("args") or [])
    if args:
        args[0] = os.path.basename(args[0])  # runsc accepts another path to the same executable name
    caps = {k: sorted(v or []) for k, v in (proc.get("capabilities") or {}).items()}
    mounts = sorted((m.get("destination", ""), m.get("type", ""), sorted(m.get("options") or []),
                     m.get("uidMappings") or [], m.get("gidMappings") or []) for m in s.get("mounts") or [])
    rest_proc = {k: v for k, v in proc.items() if k not in ("args", "env", "capabilities", "rlimits")}
    rest_linux = {k: v for k, v in linux.items()
                  if k not in ("cgroupsPath", "resources", "namespaces", "devices", "sysctl", "seccomp")}
    return {
        "version": _h(s.get("ociVersion", "")),
        "root.readonly": _h(bool((s.get("root") or {}).get("readonly"))),
        "mounts": _h(mounts),
        "annotations": _h(_gvisor_annotations(s.get("annotations") or {})),
        "args": _h(args),
        "process": _h(rest_proc),
        "capabilities": _h(caps),
        "rlimits": _h(sorted(json.dumps(r, sort_keys=True) for r in proc.get("rlimits") or [])),
        "linux.sysctl": _h(linux.get("sysctl") or {}),
        "linux.seccomp": _h(linux.get("seccomp")),
        "linux.devices": _h(sorted((d.get("path", ""), d.get("type", "")) for d in linux.get("devices") or []
                                   if not cdi.is_gpu_node(str(d.get("path", ""))))),
        "linux.namespaces": _h(sorted(n.get("type", "") for n in linux.get("namespaces") or [])),
        "linux": _h(rest_linux),
    }


def identity(spec: dict, key: str) -> dict:
    """One container's part of its pod's key: its own workload key (`key`, thawd's
    from the container's recorded tenant and image), the fingerprint, and how many
    GPUs it holds (in the key too; said on its own so that a mismatch names it)."""
    return {"key": key, "spec": fingerprint(spec), "gpus": len(cdi.gpu_nodes(spec))}


def lookup(sandbox_spec: dict, names, tenant: str) -> str:
    """<tenant>.<workload>.<10 hex>: the sandbox's own identity (its tenant, pod-wide
    annotations, args) and the names the pod declares; known when the pause container
    is created. The pause container has no image digest (ctrinfo.identify sandbox=True)."""
    base = workload.workload_key(sandbox_spec, tenant, "")
    prefix = base.rsplit(".", 1)[0]
    return f"{prefix}.{_h({'sandbox': base, 'containers': sorted(names)})[:10]}"


def key(lookup_id: str, identities: dict[str, dict]) -> str:
    """The pod's workload key: its lookup part and every container's identity, by name."""
    return f"{lookup_id}-{_h(identities)[:10]}"


def differences(saved: dict, new: dict) -> list[str]:
    """What differs between two identities of one container, as field names for a log line."""
    out = []
    if saved.get("gpus", 0) != new.get("gpus", 0):
        out.append(f"GPU count {saved.get('gpus', 0)} (the image's) vs {new.get('gpus', 0)} (this container's)")
    elif saved.get("key") != new.get("key"):
        out.append("workload key (image, args, cwd, key-env)")
    s, n = saved.get("spec") or {}, new.get("spec") or {}
    out += [f for f in sorted(set(s) | set(n)) if s.get(f) != n.get(f)]
    return out
