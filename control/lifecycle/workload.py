"""Workload identity and profile, read from a container's OCI spec and from
what the runtime, not the workload, says about it.

A container opts in with the annotation `thaw.dev/workload=<name>`. Its
workload key names "the same warm state": the tenant, the workload name, the
image digest, the command line, the env vars the workload lists as
significant, and the GPU count. Two containers with equal keys may restore
each other's checkpoints (given a matching node tuple). The tenant and the
image digest come from the caller (thawd asks containerd's records:
control/thawd/ctrinfo.py), never from the spec, whose annotations the
workload's author writes (issue 13, docs/security.md).

Annotations (twins: go/internal/standin/standin.go for the opt-in one):
  thaw.dev/workload   opt-in and workload name (required to involve thaw)
  thaw.dev/tenant     optional narrowing of the tenant: the tenant itself or
                      <tenant>.<sub>; anything else is refused
                      (control/lifecycle/tenant.py narrow)
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
from control.lifecycle import tenant as tenantmod
from runsc_hooks import probe as probemod

ANNOTATION_WORKLOAD = "thaw.dev/workload"
ANNOTATION_TENANT = "thaw.dev/tenant"
ANNOTATION_KEY_ENV = "thaw.dev/key-env"
ANNOTATION_READY = "thaw.dev/ready"
ANNOTATION_HEALTH = "thaw.dev/health"

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
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
    tenant: str        # narrowed: <tenant> or <tenant>.<sub>
    image: str         # the image digest the key was made with
    key: str
    ready: "probemod.Probe | None"   # None: never checkpointed automatically
    health: "probemod.Probe"


def opted_in(spec: dict) -> bool:
    return ANNOTATION_WORKLOAD in (spec.get("annotations") or {})


def check_annotation_sizes(spec: dict) -> None:
    """UserError for a thaw.dev/* annotation over MAX_ANNOTATION_BYTES: refused before
    anything else is asked about the container (thawd's bounded inputs, issue 14)."""
    for k, v in (spec.get("annotations") or {}).items():
        if k.startswith(ANNOTATION_PREFIX) and len(v.encode()) > MAX_ANNOTATION_BYTES:
            raise UserError(f"annotation {k} is {len(v.encode())} bytes, more than {MAX_ANNOTATION_BYTES}",
                            field=k)


def from_spec(spec: dict, tenant: str, image: str) -> Workload | None:
    """The workload of an opted-in spec, None if it did not opt in. `tenant` and
    `image` (a sha256 digest) are what the runtime's records say; the spec's
    own tenant annotation may only narrow `tenant` (IdentityError otherwise)."""
    ann = spec.get("annotations") or {}
    if ANNOTATION_WORKLOAD not in ann:
        return None
    check_annotation_sizes(spec)
    name = ann[ANNOTATION_WORKLOAD]
    if not _NAME_RE.match(name):
        raise UserError(f"annotation {ANNOTATION_WORKLOAD}={name!r} is not a valid workload name",
                        field=ANNOTATION_WORKLOAD)
    if not tenantmod.TENANT_RE.fullmatch(tenant):
        raise UserError(f"tenant {tenant!r} is not a tenant id", field="tenant")
    if not _DIGEST_RE.match(image):
        raise UserError(f"image {image!r} is not a sha256 digest", field="image")
    narrowed = tenantmod.narrow(tenant, ann.get(ANNOTATION_TENANT))
    ready = parse_probe(ann[ANNOTATION_READY], ANNOTATION_READY) if ANNOTATION_READY in ann else None
    if ANNOTATION_HEALTH in ann:
        health = parse_probe(ann[ANNOTATION_HEALTH], ANNOTATION_HEALTH)
    elif ready is not None and not isinstance(ready, probemod.DelayProbe):
        health = ready
    else:
        # A restored workload was ready when it was saved: never wait out a
        # readiness delay again (that would only add to the restore).
        health = probemod.RunningProbe()
    return Workload(name=name, tenant=narrowed, image=image, key=workload_key(spec, narrowed, image), ready=ready,
                    health=health)


# workload_key's last field, or a pod key's two (control/lifecycle/pod.py key:
# `<lookup>-<10 hex>`, its lookup `<tenant>.<name>.<10 hex>`): without the second, every
# version of a pod would be a workload of its own, out of reach of retention by count.
_DIGEST_TAIL = re.compile(r"\.(?:[0-9a-f]{16}|[0-9a-f]{10}-[0-9a-f]{10})$")


def workload_of(key: str) -> str:
    """The workload a key is an image of: the key less its identity digest
    (`<tenant>.<name>.<16 hex>`, workload_key); a key without one (the CLI's
    `user-root.myapp`) is its own workload; a pod's key (`<tenant>.<name>.<10 hex>-<10
    hex>`) is an image of `<tenant>.<name>`. Retention counts images per
    workload (control/images/gc.py) and the per-workload histograms use it as
    their label (control/metrics.py): bounded by the workloads, not the keys."""
    return _DIGEST_TAIL.sub("", key)


def workload_key(spec: dict, tenant: str, image: str) -> str:
    """<tenant>.<name>.<16 hex of the identity hash>: readable, and stable for equal
    inputs. The tenant (at most one '.', before a sub-tenant) comes first: the
    store, the node cache and the dedup domain find an image's tenant there
    (control/lifecycle/tenant.py store_tenant). At most 65 + 1 + 40 + 1 + 16
    characters (manifest.validate_key allows 128)."""
    ann = spec.get("annotations") or {}
    proc = spec.get("process") or {}
    env = dict(e.split("=", 1) for e in proc.get("env", []) if "=" in e)
    key_env = sorted(n.strip() for n in ann.get(ANNOTATION_KEY_ENV, "").split(",") if n.strip())
    devices = (spec.get("linux") or {}).get("devices") or []
    gpus = sum(1 for d in devices if re.fullmatch(r"/dev/nvidia\d+", d.get("path", "")))
    identity = {
        "tenant": tenant,
        "workload": ann.get(ANNOTATION_WORKLOAD, ""),
        "image": image,
        "args": proc.get("args", []),
        "cwd": proc.get("cwd", "/"),
        "env": {n: env.get(n) for n in key_env},
        "gpus": gpus,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", identity["workload"])[:40]
    return f"{tenant}.{safe}.{digest}"
