"""The containerd door's container: one record per container the shim runs, its
state and the table of its transitions, behind one lock and one map.

A record is made at the container's `create` (PrepareRestore) and removed at
its `delete` (Release), or when the stand-in that asked for a decision is gone
before the answer reached it (abandon). In between it holds what thawd knows
of the container: how the shim runs runsc for it (`RuntimeRef`), the identity
containerd records for it (asked once: a tag moved later must not change the
key it checkpoints under), its workload key, the image it leases, the gate
closed for its restore, its network namespace's configuration from before
runsc took it over (for a cold start after a failed restore), what the shim
gave it as stdio (for parking) and the parked sandbox it adopted.

The states are the words of the Go stand-in's marker (preparing, restore,
adopt, restored, cold, cold-fallback, satisfied; twin:
go/internal/standin/marker.go marker.Decision) plus the two only thawd sees: restoring (its Restore call is
running, the engine owns the gate) and released (the record is gone). A
decision is *pending* while the record is in restore or adopt: it then ends
in exactly one outcome, RESTORED, RESTORE_FAILED, or ABANDONED when the
container is released first (issue 14). An illegal transition is a bug in
thawd and fails loudly (InvalidTransition), as in the CLI door's sandbox
records (control/lifecycle/sandbox.py).
"""

from __future__ import annotations

import enum
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from control.config import Settings
from control.errors import InvalidTransition, UserError
from control.lifecycle import tenant as tenantmod
from control.lifecycle import workload as workloadmod
from control.lifecycle.engine import Handle
from runsc_hooks import gate as gatemod
from runsc_hooks import netns as netnsmod
from runsc_hooks import network as netmod
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import GlobalOptions, Runsc
from control.logfields import fields

log = logging.getLogger("thawd")

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,255}$")


@dataclass(frozen=True)
class RuntimeRef:
    """How the shim runs runsc for one container (validated request fields)."""
    container_id: str
    bundle: Path
    runsc_root: Path
    global_flags: tuple[str, ...]

    @classmethod
    def validate(cls, container_id: str, bundle: str, runsc_root: str, global_flags: list[str]) -> "RuntimeRef":
        if not _ID_RE.match(container_id or ""):
            raise UserError(f"runtime.container_id {container_id!r} is not a valid container id", field="container_id")
        for fld, val in (("runtime.bundle", bundle), ("runtime.runsc_root", runsc_root)):
            if not val or not val.startswith("/") or "\0" in val or ".." in Path(val).parts:
                raise UserError(f"{fld} {val!r} must be an absolute path", field=fld)
        flags = tuple(global_flags)
        if any(not f or "\0" in f for f in flags) or len(flags) > 128:
            raise UserError("runtime.global_flags must be at most 128 non-empty strings", field="global_flags")
        return cls(container_id, Path(bundle), Path(runsc_root), flags)

    @property
    def k(self) -> tuple[str, str]:
        """The container's place in the map: (runsc root, container id)."""
        return (str(self.runsc_root), self.container_id)

    def runsc(self, binary: Path, timeout_s: float) -> Runsc:
        # The shim's own flags, verbatim: restore and checkpoint need the
        # same global flags as the run (docs/gvisor-notes.md "The pin").
        flags = self.global_flags
        if not any(f.lstrip("-").split("=")[0] == "root" for f in flags):
            flags = (f"--root={self.runsc_root}", *flags)
        return Runsc(binary, GlobalOptions(root=self.runsc_root, extra=flags, verbatim=True), timeout_s)


@dataclass
class Decision:
    """PrepareRestore's answer (thawd.proto PrepareRestoreResponse)."""
    restore: bool
    reason: str
    key: str = ""
    image_path: str = ""
    restore_timeout_s: float = 0.0   # the stand-in's deadline for the Restore call
    # ADOPT: the parked sandbox (control/thawd/parking.py) the container becomes.
    adopt_id: str = ""
    adopt_pid: int = 0
    relay_socket: str = ""
    # SATISFIED: an init container of a restoring pod, answered as done (control/thawd/pods.py).
    satisfied: bool = False


class State(enum.Enum):
    PREPARING = "preparing"          # create asked; thawd decides
    RESTORE = "restore"              # answered RESTORE: an image leased, its gate closed (pending)
    ADOPT = "adopt"                  # answered ADOPT: a parked sandbox promised to it (pending)
    RESTORING = "restoring"          # its Restore runs (or its stand-in's commit is awaited)
    RESTORED = "restored"
    COLD = "cold"                    # answered cold, or started cold
    COLD_FALLBACK = "cold-fallback"  # its restore failed or was never tried: it starts cold
    SATISFIED = "satisfied"          # an init container of a restoring pod, answered as done (pods.py)
    RELEASED = "released"            # deleted (or abandoned): the record is gone


# The one table of allowed transitions (None: no record yet). A new create of
# the same id replaces an earlier decision (PREPARING from any live state but
# RESTORING: a Restore in flight ends first; Containers.begin refuses it).
TRANSITIONS: dict[State | None, frozenset[State]] = {
    None: frozenset({State.PREPARING, State.COLD, State.COLD_FALLBACK, State.RESTORED}),
    State.PREPARING: frozenset({State.PREPARING, State.RESTORE, State.ADOPT, State.COLD, State.COLD_FALLBACK,
                                State.SATISFIED, State.RELEASED}),
    State.SATISFIED: frozenset({State.RELEASED}),
    State.RESTORE: frozenset({State.PREPARING, State.RESTORING, State.COLD_FALLBACK, State.RELEASED}),
    State.ADOPT: frozenset({State.PREPARING, State.RESTORING, State.COLD_FALLBACK, State.RELEASED}),
    State.RESTORING: frozenset({State.RESTORED, State.COLD_FALLBACK, State.RELEASED}),
    # A restore kept, then undone: its stand-in died before it committed the start.
    State.RESTORED: frozenset({State.PREPARING, State.COLD_FALLBACK, State.RELEASED}),
    State.COLD: frozenset({State.PREPARING, State.COLD, State.COLD_FALLBACK, State.RELEASED}),
    State.COLD_FALLBACK: frozenset({State.PREPARING, State.COLD, State.COLD_FALLBACK, State.RELEASED}),
    State.RELEASED: frozenset(),
}
PENDING = frozenset({State.RESTORE, State.ADOPT})


def check_transition(cid: str, current: State | None, wanted: State) -> None:
    if wanted not in TRANSITIONS[current]:
        raise InvalidTransition(cid, current.value if current else "absent", wanted.value)


@dataclass
class Container:
    ref: RuntimeRef
    state: State | None = None
    key: str = ""
    reason: str = ""
    identity: object | None = None    # ctrinfo.Identity, established once
    image: object | None = None       # the leased image (images.source.Restorable)
    gate: str | None = None           # closed for its restore until the engine takes it over
    network: tuple[str, list] | None = None   # (netns path, netns.snapshot) before runsc took it
    stdio: str = ""                   # what the shim gave it (PrepareRestoreRequest.stdio)
    adopted: str = ""                 # the parked sandbox it adopted (its runsc id)

    @property
    def pending(self) -> bool:
        return self.state in PENDING


# What a container's stdin, stdout and stderr can be (PrepareRestoreRequest.stdio; twin:
# go/internal/standin stdioKinds). A restored process uses its stdio as the saved one
# did: gVisor's host inode keeps the saved file's kind and only its descriptor is
# replaced at restore (pkg/sentry/fsimpl/host save_restore.go afterLoad), so a /dev/null
# saved and a pipe restored makes every write fail with ESPIPE (pwrite at an offset).
STDIO_KINDS = ("null", "pipe", "file", "socket", "tty", "char", "none", "other")

_KEEP = object()   # decide(): leave the record's image as it is

# Released with no restore tried: the outcome of a decision its container's delete ended.
RELEASED_UNRESTORED = "released before any restore (create or start did not finish)"


class Containers:
    """Every container of the containerd door this thawd knows, by (runsc root, id)."""

    def __init__(self, settings: Settings, metrics, identify, identify_sandbox) -> None:
        """`identify(rt)` / `identify_sandbox(rt)`: a container's (a CRI pod's pause
        container's) tenant and image digest from what its runtime records
        (control/thawd/ctrinfo.py)."""
        self.s = settings
        self.metrics = metrics
        self.identify = identify
        self.identify_sandbox = identify_sandbox
        self._lock = threading.Lock()
        self._map: dict[tuple[str, str], Container] = {}

    # -- the map -------------------------------------------------------------------

    def get(self, rt: RuntimeRef) -> Container | None:
        with self._lock:
            return self._map.get(rt.k)

    def move(self, rt: RuntimeRef, wanted: State, **fields) -> Container:
        """Move `rt`'s record (made when absent) to `wanted`, setting `fields`."""
        with self._lock:
            return self._move_locked(rt, wanted, **fields)

    def _move_locked(self, rt: RuntimeRef, wanted: State, **fields) -> Container:
        """The one place a record's state changes, through the table (check_transition);
        the lock is held."""
        c = self._map.get(rt.k)
        check_transition(rt.container_id, c.state if c else None, wanted)
        if c is None:
            c = self._map[rt.k] = Container(rt)
        c.state = wanted
        for name, value in fields.items():
            setattr(c, name, value)
        return c

    def state_of(self, rt: RuntimeRef) -> State | None:
        c = self.get(rt)
        return c.state if c else None

    def lease_of(self, rt: RuntimeRef):
        c = self.get(rt)
        return c.image if c else None

    def holds(self, lease) -> bool:
        """Whether any container holds `lease` (one pull's lease is claimed once)."""
        with self._lock:
            return any(c.image is lease for c in self._map.values())

    def leases(self) -> list:
        with self._lock:
            return [c.image for c in self._map.values() if c.image is not None]

    # -- identity ------------------------------------------------------------------

    def workload(self, rt: RuntimeRef, spec: dict) -> "workloadmod.Workload | None":
        """The workload of an opted-in container, keyed by the identity its runtime
        records (asked once per container); IdentityError when that cannot be told
        or its tenant annotation would widen or switch it."""
        if not workloadmod.opted_in(spec):
            return None
        with self._lock:
            c = self._map.get(rt.k)
            ident = c.identity if c else None
        if ident is None:
            ident = self.identify(rt)
            with self._lock:
                c = self._map.get(rt.k)
                if c is None:   # identified before any decision (a restore after a thawd restart)
                    c = self._map[rt.k] = Container(rt)
                c.identity = ident
        return workloadmod.from_spec(spec, ident.tenant, ident.image)

    def key(self, rt: RuntimeRef, spec: dict | None = None) -> str:
        """The container's workload key, "" when it has none thaw may use."""
        from control.errors import IdentityError
        try:
            wl = self.workload(rt, spec if spec is not None else specmod.Bundle(rt.bundle).load())
        except (IdentityError, UserError):
            return ""
        return wl.key if wl else ""

    def sandbox_tenant(self, rt: RuntimeRef, spec: dict) -> str:
        """The tenant of a CRI pod's sandbox (pause) container, narrowed by the pod's
        tenant annotation as its app containers' are (workload.from_spec); IdentityError
        when that cannot be told. The pod's lookup key starts with it (pods.py)."""
        ident = self.identify_sandbox(rt)
        return tenantmod.narrow(ident.tenant, (spec.get("annotations") or {}).get(workloadmod.ANNOTATION_TENANT))

    # -- what the shim gave it --------------------------------------------------------

    def stdio_of(self, rt: RuntimeRef) -> str:
        c = self.get(rt)
        return c.stdio if c else ""

    def remember_network(self, rt: RuntimeRef, spec: dict) -> None:
        """Keep the container's network namespace configuration from before runsc
        takes it over, for a cold start after a failed restore (netns.snapshot)."""
        path = specmod.netns_path(spec)
        if not path:
            return
        try:
            snap = netnsmod.snapshot(path)
        except Exception as e:  # noqa: BLE001 - a namespace thaw cannot read: nothing to put back later
            log.warning("network of %s not recorded: %s", rt.container_id, e)
            return
        with self._lock:
            c = self._map.get(rt.k)
            if c is not None:
                c.network = (path, snap)

    def take_network(self, rt: RuntimeRef) -> tuple[str, list] | None:
        with self._lock:
            c = self._map.get(rt.k)
            net, c.network = (c.network, None) if c else (None, None)
            return net

    def adopted(self, rt: RuntimeRef) -> str:
        c = self.get(rt)
        return c.adopted if c else ""

    def recover_adoption(self, rt: RuntimeRef, parked_id: str) -> None:
        """A container a previous thawd let adopt a parked sandbox still runs: its delete
        releases the sandbox (Parking.recover)."""
        self.move(rt, State.RESTORED, adopted=parked_id)

    # -- decisions -------------------------------------------------------------------

    def begin(self, rt: RuntimeRef, stdio: str = "") -> None:
        """create asked for a decision (PrepareRestore): the record is PREPARING, with
        what the shim gave the container as stdio (STDIO_KINDS; unknown kinds read
        "other"). A pending decision of the same id ends first
        (ABANDONED): a new create replaced it."""
        kinds = stdio.split(",") if stdio else []
        if len(kinds) != 3 or any(k not in STDIO_KINDS for k in kinds):
            kinds = ["other"] * 3 if stdio else []
        self.settle(rt, "a new decision for the same container replaced it")
        with self._lock:
            c = self._map.get(rt.k)
            if c is not None and c.state == State.RESTORING:
                raise UserError(f"container {rt.container_id} is being restored; a second create of it is refused",
                                field="container_id")
            self._move_locked(rt, State.PREPARING, stdio=",".join(kinds), reason="")

    def claim(self, rt: RuntimeRef, lease) -> bool:
        """Attach `lease` to `rt` (an image its restore will read), unless another
        container holds it already (one pull's lease is claimed once); an image the
        record held before goes."""
        with self._lock:
            if any(c.image is lease for k, c in self._map.items() if k != rt.k):
                return False
            c = self._map.get(rt.k)
            if c is None:
                c = self._map[rt.k] = Container(rt)
            old, c.image = c.image, lease
        if old is not None and old is not lease:
            old.release()
        lease.describe(f"container {rt.container_id}")   # what `thaw evict` names when it refuses
        return True

    def decide(self, rt: RuntimeRef, wanted: State, key: str, *, gate: str | None = None, adopted: str = "",
               reason: str = "", image=_KEEP) -> None:
        """Record create's answer for `rt` (RESTORE, ADOPT or COLD). With `image`, the
        record's image becomes it (one it held before goes)."""
        with self._lock:
            c = self._map.get(rt.k)
            fields = {"key": key, "reason": reason, "gate": gate, "adopted": adopted}
            old = None
            if image is not _KEEP:
                old = c.image if c is not None else None
                fields["image"] = image
            self._move_locked(rt, wanted, **fields)
        if old is not None and old is not image:
            old.release()
        if image is not _KEEP and image is not None and adopted:
            image.describe(f"container {rt.container_id} (adopted parked sandbox {adopted})")

    def start_restore(self, rt: RuntimeRef) -> tuple[str, str | None]:
        """Its Restore begins: the pending decision's (key, gate); from here the engine
        (and undo) own the gate. ("", None) when no decision is pending."""
        with self._lock:
            c = self._map.get(rt.k)
            if c is None or not c.pending:
                return (c.key if c else ""), None
            gate, c.gate = c.gate, None
            self._move_locked(rt, State.RESTORING)
            return c.key, gate

    def restored(self, rt: RuntimeRef) -> None:
        """Kept: no cold start will need the namespace's configuration back."""
        with self._lock:
            c = self._map.get(rt.k)
            if c is not None and c.state is not None and State.RESTORED in TRANSITIONS[c.state]:
                self._move_locked(rt, State.RESTORED, network=None)

    def end(self, rt: RuntimeRef, outcome: str, reason: str) -> None:
        """An outcome the stand-in or thawd reported (RESTORE_FAILED, COLD_STARTED):
        a pending decision never restored opens its gate."""
        with self._lock:
            c = self._map.get(rt.k)
            gate = None
            if c is not None and c.pending:
                gate, c.gate = c.gate, None
            wanted = State.COLD_FALLBACK if outcome == "RESTORE_FAILED" else State.COLD
            fits = c is None or wanted in TRANSITIONS[c.state]
            if fits:
                self._move_locked(rt, wanted, reason=reason)
        if not fits:   # a late or repeated report (the stand-in's): what thawd holds stays
            log.warning("outcome %s of %s ignored: its record is %s", outcome, rt.container_id, c.state.value,
                        extra=fields(container=rt.container_id, decision=outcome, reason=f"record is {c.state.value}"))
        if gate is not None:   # the restore was never tried: open its gate
            gatemod.open(gate, f"restore of {rt.container_id} not tried: {outcome}")

    def settle(self, rt: RuntimeRef, why: str) -> None:
        """Record the outcome of a restore decision that will never be restored:
        ABANDONED. The stand-in that asked was killed, or containerd deleted the
        container between create and start (issue 14: thawd hears every outcome)."""
        with self._lock:
            c = self._map.get(rt.k)
            if c is None or not c.pending:
                return
            key, gate = c.key, c.gate
            self._move_locked(rt, State.PREPARING, gate=None)   # no decision now (PREPARING allows every next one)
        if gate is not None:
            gatemod.open(gate, f"restore of {rt.container_id} abandoned")
        log.info("outcome %s key=%s ABANDONED %s", rt.container_id, key, why,
                 extra=fields(container=rt.container_id, key=key or None, decision="ABANDONED", reason=why))
        self.metrics.inc("thaw_restores_abandoned_total")

    def drop_image(self, rt: RuntimeRef) -> Container | None:
        """Its image lease (and the network kept for a cold start) go, the record stays:
        a failed restore, whose container starts cold."""
        with self._lock:
            c = self._map.get(rt.k)
            lease = None
            if c is not None:
                lease, c.image, c.network = c.image, None, None
        if lease is not None:
            lease.release()
        return c

    def release(self, rt: RuntimeRef, why: str = RELEASED_UNRESTORED) -> Container | None:
        """The container was deleted: a pending decision ends (ABANDONED), its lease
        goes, and so does its record (returned, for what else it held: a parked
        sandbox it adopted)."""
        self.settle(rt, why)
        with self._lock:
            c = self._map.get(rt.k)
            if c is not None:
                self._move_locked(rt, State.RELEASED)
                del self._map[rt.k]
        if c is not None and c.image is not None:
            c.image.release()
        return c

    def close(self) -> None:
        with self._lock:
            leases = [c.image for c in self._map.values() if c.image is not None]
            for c in self._map.values():
                c.image = None
        for lease in leases:
            lease.release()

    # -- the engine's view -------------------------------------------------------------

    def handle(self, rt: RuntimeRef, spec: dict, timeout_s: float | None = None, address: str | None = None) -> Handle:
        """The engine's view of a container the shim runs: its runsc root and flags,
        and, when its network namespace is one thaw plumbed, its address and gate.
        `address`: the one its namespace had before runsc took it over (a pod's,
        pods.py), when the namespace shows none now."""
        found, gate = netmod.namespace_address(specmod.netns_path(spec))
        address = found or address
        if not self.s.thawd_gate:  # diagnostics (config thawd.gate): what a door without the gate does
            gate = None
        return Handle(rt.container_id, rt.runsc(self.s.runsc_path, timeout_s or self.s.runsc_timeout_s),
                      rt.bundle, address=address, gate=gate, mark=self.s.network_probe_mark)
