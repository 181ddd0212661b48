"""Workload identity and profile, read from a container's OCI spec.

A container opts in with the annotation `thaw.dev/workload=<name>`. Its
workload key names "the same warm state": the tenant, the workload name, the
image (when the runtime tells it), the command line, the env vars the
workload lists as significant, and the GPU count. Two containers with equal
keys may restore each other's checkpoints (given a matching node tuple).

Annotations (twins: go/internal/standin/standin.go for the opt-in one):
  thaw.dev/workload   opt-in and workload name (required to involve thaw)
  thaw.dev/tenant     tenant (default "default")
  thaw.dev/key-env    comma-separated env var names that belong in the key
  thaw.dev/ready      readiness probe: thawd checkpoints a cold-started workload
                      automatically only once it passes. No default: a workload that
                      declares none is never checkpointed automatically (a fixed delay
                      would save a model server before its model has loaded).
  thaw.dev/health     health probe after a restore (default: the readiness probe, but a
                      delay probe becomes "running")
  thaw.dev/profile    a workload profile name (control/lifecycle/profiles.py)
Probes use the one grammar of runsc_hooks/probe.py: running, tcp:, http:, gpu:,
exec:, file:, delay:.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from control.errors import UserError
from runsc_hooks import probe as probemod

ANNOTATION_WORKLOAD = "thaw.dev/workload"
ANNOTATION_TENANT = "thaw.dev/tenant"
ANNOTATION_KEY_ENV = "thaw.dev/key-env"
ANNOTATION_READY = "thaw.dev/ready"
ANNOTATION_HEALTH = "thaw.dev/health"

# Image identity as runtimes pass it (runsc itself never sees the image name).
_IMAGE_ANNOTATIONS = ("io.kubernetes.cri.image-name", "io.containerd.image.name", "org.opencontainers.image.ref.name")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}$")
# thaw's own annotations hold names and probe expressions: a longer value is
# refused before it is parsed (thawd reads them from any container's spec).
ANNOTATION_PREFIX = "thaw.dev/"
MAX_ANNOTATION_BYTES = 4096


def parse_probe(text: str, field: str):
    """A probe from an annotation; UserError naming the annotation when bad."""
    try:
        return probemod.parse(text)
    except UserError as e:
        raise UserError(f"annotation {field}: {e.message}", field=field) from None


@dataclass(frozen=True)
class Workload:
    name: str
    tenant: str
    key: str
    ready: "probemod.Probe | None"   # None: never checkpointed automatically
    health: "probemod.Probe"


def opted_in(spec: dict) -> bool:
    return ANNOTATION_WORKLOAD in (spec.get("annotations") or {})


def from_spec(spec: dict) -> Workload | None:
    """The workload of an opted-in spec, None if it did not opt in."""
    ann = spec.get("annotations") or {}
    if ANNOTATION_WORKLOAD not in ann:
        return None
    for k, v in ann.items():
        if k.startswith(ANNOTATION_PREFIX) and len(v.encode()) > MAX_ANNOTATION_BYTES:
            raise UserError(f"annotation {k} is {len(v.encode())} bytes, more than {MAX_ANNOTATION_BYTES}",
                            field=k)
    name = ann[ANNOTATION_WORKLOAD]
    if not _NAME_RE.match(name):
        raise UserError(f"annotation {ANNOTATION_WORKLOAD}={name!r} is not a valid workload name",
                        field=ANNOTATION_WORKLOAD)
    tenant = ann.get(ANNOTATION_TENANT, "default")
    if not _NAME_RE.match(tenant):
        raise UserError(f"annotation {ANNOTATION_TENANT}={tenant!r} is not a valid tenant", field=ANNOTATION_TENANT)
    ready = parse_probe(ann[ANNOTATION_READY], ANNOTATION_READY) if ANNOTATION_READY in ann else None
    if ANNOTATION_HEALTH in ann:
        health = parse_probe(ann[ANNOTATION_HEALTH], ANNOTATION_HEALTH)
    elif ready is not None and not isinstance(ready, probemod.DelayProbe):
        health = ready
    else:
        # A restored workload was ready when it was saved: never wait out a
        # readiness delay again (that would only add to the restore).
        health = probemod.RunningProbe()
    return Workload(name=name, tenant=tenant, key=workload_key(spec), ready=ready, health=health)


def workload_key(spec: dict) -> str:
    """<tenant>.<name>.<16 hex of the identity hash>: readable, and stable for equal inputs."""
    ann = spec.get("annotations") or {}
    proc = spec.get("process") or {}
    env = dict(e.split("=", 1) for e in proc.get("env", []) if "=" in e)
    key_env = sorted(n.strip() for n in ann.get(ANNOTATION_KEY_ENV, "").split(",") if n.strip())
    devices = (spec.get("linux") or {}).get("devices") or []
    gpus = sum(1 for d in devices if re.fullmatch(r"/dev/nvidia\d+", d.get("path", "")))
    identity = {
        "tenant": ann.get(ANNOTATION_TENANT, "default"),
        "workload": ann.get(ANNOTATION_WORKLOAD, ""),
        "image": next((ann[a] for a in _IMAGE_ANNOTATIONS if a in ann), ""),
        "args": proc.get("args", []),
        "cwd": proc.get("cwd", "/"),
        "env": {n: env.get(n) for n in key_env},
        "gpus": gpus,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    safe = lambda s: re.sub(r"[^A-Za-z0-9_.-]+", "-", s)[:48]  # noqa: E731
    return f"{safe(identity['tenant'])}.{safe(identity['workload'])}.{digest}"
