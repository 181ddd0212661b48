"""Tenants: whose a checkpoint image is, decided from what the workload cannot set.

A checkpoint image is a process's memory (weights, but also tokens, keys, user
data): it may only ever restore into a container of the tenant that saved it
(issue 13). The tenant comes from the door the container came through:

    containerd, CRI (Kubernetes)  k8s-<pod namespace>, from the CRI plugin's own records
    containerd, plain (ctr, ...)  ctr-<containerd namespace>
    thaw's CLI                    user-<local user>; root may name any tenant (--tenant)

`tenancy.map` maps "<origin>:<name>" to a tenant chosen by the operator (two
namespaces of one team may share one). A name outside the tenant alphabet
(upper case, '.', '_', too long) becomes `<origin>x-<readable part>-<hash of
the exact name>`: no two names share a derived tenant, and no derived id of
one kind looks like another's.

The workload's own `thaw.dev/tenant` annotation can only narrow: it may
repeat the tenant or name a sub-tenant `<tenant>.<sub>`; anything else is
refused (IdentityError tenant-refused: the container starts cold and is never
checkpointed). A sub-tenant separates checkpoints inside a tenant; the store
prefix, the dedup domain and the encryption key stay the tenant's.
"""
from __future__ import annotations

import hashlib
import re

from control.config import TENANT_PATTERN, Pairs
from control.errors import IdentityError, UserError

ORIGIN_K8S = "k8s"
ORIGIN_CONTAINERD = "ctr"
ORIGIN_USER = "user"
ORIGINS = (ORIGIN_K8S, ORIGIN_CONTAINERD, ORIGIN_USER)

TENANT_RE = re.compile(TENANT_PATTERN)
SUB_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,14}[a-z0-9])?")   # a sub-tenant label: 1-16 characters
_MAX = 48


def derive(origin: str, name: str) -> str:
    """The tenant id of `name` at `origin`, before any mapping."""
    if origin not in ORIGINS:
        raise ValueError(f"unknown tenant origin {origin!r}")
    if not name:
        raise IdentityError("identity-unknown", f"an empty {origin} name names no tenant")
    plain = f"{origin}-{name}"
    if TENANT_RE.fullmatch(plain):
        return plain
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    head = f"{origin}x-"
    room = _MAX - len(head) - 1 - len(digest)
    readable = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:room].strip("-")
    return f"{head}{readable}-{digest}" if readable else f"{head}{digest}"


def resolve(origin: str, name: str, mapping: Pairs) -> str:
    """The tenant of `name` at `origin`: the operator's mapping, else the derived id."""
    mapped = mapping.get(f"{origin}:{name}")
    return mapped if mapped else derive(origin, name)


def narrow(tenant: str, annotation: str | None) -> str:
    """The tenant a workload's `thaw.dev/tenant` annotation asks for, which may
    only be `tenant` itself or `tenant.<sub>`; IdentityError otherwise."""
    if annotation is None or annotation == tenant:
        return tenant
    if annotation.startswith(tenant + ".") and SUB_RE.fullmatch(annotation[len(tenant) + 1:]):
        return annotation
    raise IdentityError("tenant-refused", f"annotation thaw.dev/tenant={annotation!r} is not this container's "
                        f"tenant {tenant!r} nor a sub-tenant of it ({tenant}.<sub>, sub 1-16 of a-z 0-9 -): "
                        "a workload may narrow its tenant, never widen or switch it")


def store_tenant(tenant_or_key: str) -> str:
    """The tenant whose store prefix, dedup domain and key hold an image: the part
    before the first '.' of a (narrowed) tenant or of a workload key."""
    return tenant_or_key.split(".", 1)[0]


def cli_tenant(requested: str | None, user: str, uid: int, mapping: Pairs) -> str:
    """The tenant of thaw's own CLI: the local user's; root may name any tenant,
    anyone else only their own or a sub-tenant of it."""
    own = resolve(ORIGIN_USER, user, mapping)
    if requested is None:
        return own
    if uid == 0:
        if not TENANT_RE.fullmatch(store_tenant(requested)) or (
                "." in requested and not SUB_RE.fullmatch(requested.split(".", 1)[1])):
            raise UserError(f"--tenant {requested!r}: expected a tenant id (1-48 of a-z 0-9 -) "
                            "optionally followed by .<sub>", field="tenant")
        return requested
    try:
        return narrow(own, requested)
    except IdentityError as e:
        raise UserError(f"--tenant: only root may name another tenant than {own!r} ({e.message})",
                        field="tenant") from None
