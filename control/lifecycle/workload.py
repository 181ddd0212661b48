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
  thaw.dev/ready      readiness probe before the automatic checkpoint
  thaw.dev/health     health probe after a restore (default: the readiness probe, but a
                      delay probe becomes "running")
  thaw.dev/profile    a workload profile name (control/profiles.py, where present)
Probes: "exec:<shell command>", "file:<path in container>", "delay:<seconds>".
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from control.errors import UserError

ANNOTATION_WORKLOAD = "thaw.dev/workload"
ANNOTATION_TENANT = "thaw.dev/tenant"
ANNOTATION_KEY_ENV = "thaw.dev/key-env"
ANNOTATION_READY = "thaw.dev/ready"
ANNOTATION_HEALTH = "thaw.dev/health"
ANNOTATION_PROFILE = "thaw.dev/profile"

# Image identity as runtimes pass it (runsc itself never sees the image name).
_IMAGE_ANNOTATIONS = ("io.kubernetes.cri.image-name", "io.containerd.image.name", "org.opencontainers.image.ref.name")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}$")
DEFAULT_READY = "delay:2"


@dataclass(frozen=True)
class Probe:
    kind: str    # exec | file | delay
    arg: str

    @classmethod
    def parse(cls, text: str, field: str) -> "Probe":
        kind, sep, arg = text.partition(":")
        if not sep or kind not in ("exec", "file", "delay") or not arg:
            raise UserError(f"annotation {field}={text!r}: expected exec:<cmd>, file:<path> or delay:<seconds>",
                            field=field)
        if kind == "delay":
            try:
                if not 0 <= float(arg) <= 3600:
                    raise ValueError
            except ValueError:
                raise UserError(f"annotation {field}: delay must be 0..3600 seconds, got {arg!r}",
                                field=field) from None
        if kind == "file" and not arg.startswith("/"):
            raise UserError(f"annotation {field}: file probe needs an absolute path", field=field)
        return cls(kind, arg)


@dataclass(frozen=True)
class Workload:
    name: str
    tenant: str
    key: str
    ready: Probe
    health: Probe
    profile: str | None


def opted_in(spec: dict) -> bool:
    return ANNOTATION_WORKLOAD in (spec.get("annotations") or {})


def from_spec(spec: dict) -> Workload | None:
    """The workload of an opted-in spec, None if it did not opt in."""
    ann = spec.get("annotations") or {}
    if ANNOTATION_WORKLOAD not in ann:
        return None
    name = ann[ANNOTATION_WORKLOAD]
    if not _NAME_RE.match(name):
        raise UserError(f"annotation {ANNOTATION_WORKLOAD}={name!r} is not a valid workload name",
                        field=ANNOTATION_WORKLOAD)
    tenant = ann.get(ANNOTATION_TENANT, "default")
    if not _NAME_RE.match(tenant):
        raise UserError(f"annotation {ANNOTATION_TENANT}={tenant!r} is not a valid tenant", field=ANNOTATION_TENANT)
    ready = Probe.parse(ann.get(ANNOTATION_READY, DEFAULT_READY), ANNOTATION_READY)
    if ANNOTATION_HEALTH in ann:
        health = Probe.parse(ann[ANNOTATION_HEALTH], ANNOTATION_HEALTH)
    else:
        # A restored workload was ready when it was saved: re-run a real probe,
        # but never wait out a readiness delay again (that would only add to the restore).
        health = ready if ready.kind != "delay" else Probe("delay", "0")
    return Workload(name=name, tenant=tenant, key=workload_key(spec), ready=ready, health=health,
                    profile=ann.get(ANNOTATION_PROFILE))


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
