"""The records of thaw's own sandboxes (the CLI door, control/lifecycle/sandbox.py):
their ids, the state enum and its one transition table, the record a sandbox
keeps on disk, and the leases its record holds (one sandbox address, its node
ports) under the node's network lock.

Records live in <state_dir>/sandboxes/<id>.json, written atomically. A record in
a transitional state (created, restoring, checkpointing) names its owner
process; `Sandboxes.recover` removes what an owner that died left.
"""

from __future__ import annotations

import enum
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from control.config import Settings
from control.errors import InUse, InvalidTransition, ThawError, UserError
from control.files import write_json_atomic
from runsc_hooks import network as netmod
from runsc_hooks import probe as probemod

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# runsc at the pin resolves a container id by prefix and fails when it is the
# prefix of another id (runsc/container/state_file.go findContainerID: `web`
# is ambiguous beside `web-2`; an exact match does not win). thaw's sandbox ids
# cannot contain "+", which runsc ids may: `<id>+` is never a prefix of another
# `<id>+`, so every runsc call names exactly one sandbox.
RUNSC_ID_SUFFIX = "+"
# The lock around leasing addresses and node ports (Sandboxes._claim_net), in the state dir.
NET_LOCK = "network.lock"
NET_LOCK_TIMEOUT_S = 60.0


def runsc_id(sid: str) -> str:
    """The runsc container id of thaw sandbox `sid`."""
    return sid + RUNSC_ID_SUFFIX


def sandbox_id(cid: str) -> str | None:
    """The thaw sandbox id of runsc container `cid`; None for a container thaw did not make."""
    return cid[:-len(RUNSC_ID_SUFFIX)] if cid.endswith(RUNSC_ID_SUFFIX) and _ID_RE.match(cid[:-1]) else None


class State(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    RESTORING = "restoring"
    STOPPED = "stopped"
    DELETED = "deleted"


# The one table of allowed transitions (None: the sandbox does not exist yet).
TRANSITIONS: dict[State | None, frozenset[State]] = {
    None: frozenset({State.CREATED, State.RESTORING}),
    State.CREATED: frozenset({State.RUNNING, State.DELETED}),
    State.RUNNING: frozenset({State.CHECKPOINTING, State.STOPPED, State.DELETED}),
    State.CHECKPOINTING: frozenset({State.RUNNING, State.STOPPED, State.DELETED}),
    State.RESTORING: frozenset({State.RUNNING, State.DELETED}),
    State.STOPPED: frozenset({State.DELETED}),
    State.DELETED: frozenset(),
}


def check_transition(sid: str, current: State | None, wanted: State) -> None:
    if wanted not in TRANSITIONS[current]:
        raise InvalidTransition(sid, current.value if current else "absent", wanted.value)


def validate_id(sid: str) -> str:
    if not _ID_RE.match(sid or ""):
        raise UserError(f"sandbox id {sid!r} is invalid: use 1-128 letters, digits, '_', '.', '-' "
                        "(starting with a letter or digit)", id=sid)
    return sid


# States in which a live thaw process is working on the sandbox (Record.owner).
TRANSITIONAL = frozenset({State.CREATED, State.CHECKPOINTING, State.RESTORING})


@dataclass(frozen=True)
class Mitigations:
    """thaw's fixes for the TCP restore races (docs/network.md). All on is the product;
    all off is what a naive implementation does, kept to measure the difference."""
    gate: bool = True             # no packet in while saving, nor before the health check passes
    stable_address: bool = True   # restore into the checkpoint's sandbox address (off: a new one)
    health_check: bool = True     # probe before letting traffic in; unhealthy -> removed

    @classmethod
    def off(cls) -> "Mitigations":
        return cls(gate=False, stable_address=False, health_check=False)


@dataclass
class Record:
    id: str
    state: State
    bundle: str
    net: dict | None = None
    created_at: float = field(default_factory=time.time)
    restored_from: str | None = None
    probes: list[str] = field(default_factory=list)
    health: dict | None = None    # the last health check's result
    owner: dict | None = None     # {"pid", "start"} of the process in a transitional state
    monitor: dict | None = None   # {"pid", "start"} of its thaw-monitor (control/lifecycle/logs.py)
    gpus: list[str] = field(default_factory=list)  # CDI devices injected (nvidia.com/gpu=0, ...)
    nvproxy: bool = False         # runsc ran it with --nvproxy=true

    def to_dict(self) -> dict:
        return {"id": self.id, "state": self.state.value, "bundle": self.bundle, "net": self.net,
                "created_at": self.created_at, "restored_from": self.restored_from, "probes": self.probes,
                "health": self.health, "owner": self.owner, "monitor": self.monitor, "gpus": self.gpus,
                "nvproxy": self.nvproxy}

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        return cls(id=d["id"], state=State(d["state"]), bundle=d["bundle"], net=d.get("net"),
                   created_at=d.get("created_at", 0.0), restored_from=d.get("restored_from"),
                   probes=list(d.get("probes") or []), health=d.get("health"), owner=d.get("owner"),
                   monitor=d.get("monitor"), gpus=list(d.get("gpus") or []), nvproxy=bool(d.get("nvproxy")))


@dataclass(frozen=True)
class CheckpointResult:
    image: Path
    seconds: float
    image_bytes: int
    gate_closed_s: float | None = None   # how long the gate was closed (leave_running only)
    gate_dropped: int | None = None      # packets the gate held off during the save


@dataclass(frozen=True)
class RestoreResult:
    id: str
    seconds: float                       # the whole restore: plumbing, runsc, health check, gate
    sandbox_ip: str | None
    runsc_s: float = 0.0                 # `runsc restore` alone
    health: probemod.HealthResult | None = None
    ready_at: float = 0.0                # time.monotonic() when traffic was let in (the gate opened)
    gate_dropped: int | None = None      # packets the gate held off during the restore
    loaded_s: float | None = None        # from the start until every page was in (a --background restore)

    def to_dict(self) -> dict:
        d = {"id": self.id, "restore_s": round(self.seconds, 4), "runsc_restore_s": round(self.runsc_s, 4),
             "address": self.sandbox_ip, "health": self.health.to_dict() if self.health else None,
             "gate_dropped_packets": self.gate_dropped}
        if self.loaded_s is not None:
            d["loaded_s"] = round(self.loaded_s, 4)
        return d


@dataclass(frozen=True)
class StartResult:
    """What warm_start did: restored, or started cold after the restore failed."""
    id: str
    mode: str                            # "restored" | "cold"
    seconds: float
    sandbox_ip: str | None
    restore: RestoreResult | None = None
    fallback_reason: str | None = None   # why the restore was not used

    def to_dict(self) -> dict:
        return {"id": self.id, "mode": self.mode, "seconds": round(self.seconds, 4), "address": self.sandbox_ip,
                "restore": self.restore.to_dict() if self.restore else None, "fallback_reason": self.fallback_reason}


class Records:
    """The sandbox records of one state dir."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dir = settings.state_dir / "sandboxes"

    def path(self, sid: str) -> Path:
        return self.dir / f"{sid}.json"

    def get(self, sid: str) -> Record | None:
        try:
            return Record.from_dict(json.loads(self.path(sid).read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError) as e:
            raise ThawError(f"sandbox record {self.path(sid)} is corrupt: {e}") from None

    def save(self, rec: Record) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path(rec.id), rec.to_dict())

    def move(self, rec: Record, wanted: State) -> None:
        check_transition(rec.id, rec.state, wanted)
        rec.state = wanted
        if wanted is State.DELETED:
            self.path(rec.id).unlink(missing_ok=True)
        else:
            self.save(rec)

    def net_lock(self):
        """Held while a sandbox's address and node ports are chosen and written into
        its record. The records are the leases (one address, one node port each):
        without the lock two thaw processes (one image restored 10 times at once)
        both saw the saved address free and both took it (issue 14). Held for
        milliseconds: the plumbing runs after it is released."""
        from filelock import FileLock
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(self.settings.state_dir / NET_LOCK, timeout=NET_LOCK_TIMEOUT_S)

    def claim_net(self, rec: Record, ports: tuple[netmod.Port, ...], address: tuple[str, str, int] | None = None,
                   stable: bool = False, avoid: frozenset[str] = frozenset()) -> tuple[str, str, int]:
        """Lease an address and `ports` for `rec`: check, choose and write them into its
        record under the network lock. `address` with `stable` (a restore's saved
        address): that address, or InUse naming who holds it; without
        `stable` (a cold start): that address when it is free, else a fresh one."""
        with self.net_lock():
            others = [q for q in self.list() if q.net and q.id != rec.id]
            held = {q.net["host_ip"]: q.id for q in others}
            on_node = netmod.addresses_in_use(exclude_if=netmod.host_if_name(rec.id))
            if address is not None and (address[0] in held or address[0] in on_node):
                if stable:
                    who = f"sandbox {held[address[0]]!r}" if address[0] in held else "a thaw interface"
                    raise InUse(f"sandbox address {address[1]} (this image's)", f"{who} on this node",
                                "delete it first: a restore keeps the address it was saved with")
                address = None
            self.check_ports_locked(ports, others)
            if address is None:
                address = self._allocate_address_locked(frozenset(held) | on_node | avoid)
            rec.net = netmod.SandboxNet(name=rec.id, netns=netmod.netns_name(rec.id),
                                        host_if=netmod.host_if_name(rec.id), host_ip=address[0],
                                        sandbox_ip=address[1], prefixlen=address[2], ports=tuple(ports),
                                        publish_address=self.settings.network_publish_address).to_dict()
            self.save(rec)
        return address

    def _allocate_address_locked(self, used: frozenset[str]) -> tuple[str, str, int]:
        """The first free /30 of network.subnet. Caller holds the network lock."""
        slot = 0
        while True:
            host_ip, sandbox_ip, plen = netmod.slot_addresses(self.settings.network_subnet, slot)
            if host_ip not in used:
                return host_ip, sandbox_ip, plen
            slot += 1

    def check_ports_locked(self, ports: tuple[netmod.Port, ...], others: list[Record]) -> None:
        """Each node port once on this node: not published by another sandbox, and no
        host process listens on it (a DNAT would take its traffic over). Caller holds
        the network lock."""
        taken = {}
        for rec in others:
            for p in rec.net.get("ports", []):
                taken[netmod.Port.parse(p).node] = rec.id
        for p in ports:
            if p.node in taken:
                raise InUse(f"node port {p.node}", f"sandbox {taken[p.node]!r} (published)")
            busy = netmod.listeners(p.node, self.settings.network_publish_address)
            if busy:
                raise InUse(f"node port {p.node}", f"a host process listening on {', '.join(busy)}",
                            "publishing it would take that traffic over")

    def list(self) -> list[Record]:
        if not self.dir.is_dir():
            return []
        out = []
        for p in sorted(self.dir.glob("*.json")):
            rec = self.get(p.stem)
            if rec:
                out.append(rec)
        return out
