"""thawd's logic, wired: one `Thawd` that the gRPC servicer (control/thawd/server.py)
adapts and that tests drive without gRPC. Every request field is validated at
the edge (containers.RuntimeRef, standin.Standin). Nothing is decided here: each
method hands its request to the room that owns it.

The rooms it wires, each a verb or a noun of the containerd door:
- roles.py: which room answers a container, by its role (a pod's or a lone one);
- containers.py: the container record, its state table, one lock, one map;
- prepare.py: create's decision for a lone container (restore, adopt or cold);
- restore.py: start's restore (or wake), the outcome, the undo;
- autocheckpoint.py: a cold start checkpointed once ready;
- pods.py: a Kubernetes pod's decision, restore and checkpoint, by its sandbox;
- events.py, podspecs.py: Events on pods, and a pod's readiness read from its spec (kubernetes.*);
- parking.py: sandboxes restored ahead of demand (park.enabled);
- quarantine.py, metrics.py, standin.py, ctrinfo.py, exits.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from control.config import Settings
from control.thawd import ctrinfo
from control.thawd.autocheckpoint import AutoCheckpointer
from control.thawd.containers import RELEASED_UNRESTORED, Containers, Decision, RuntimeRef
from control.thawd.events import Events
from control.thawd.exits import ExitWatch
from control.thawd.kubeapi import node_name
from control.thawd.metrics import Metrics
from control.thawd.parking import Parking
from control.thawd.pods import Pods
from control.thawd.podspecs import PodSpecs
from control.thawd.prepare import Preparer
from control.thawd.quarantine import Quarantine
from control.thawd.restore import Restorer
from control.thawd.roles import Roles
from control.thawd.standin import Standin

__all__ = ["Thawd", "RuntimeRef", "Decision", "Standin"]


class Thawd:
    def __init__(self, settings: Settings, images, metrics: Metrics | None = None, identify=None,
                 identify_sandbox=None, exits: ExitWatch | None = None, kube=None) -> None:
        """`images` is the image source (control/images/source.py ImageSource).
        `identify(rt)` tells a container's tenant and image digest (ctrinfo.Identity) from
        what its runtime records; default: containerd's records (control/thawd/ctrinfo.py).
        `identify_sandbox(rt)`: the same for a CRI pod's sandbox (pause) container, which
        has a tenant but no image digest (ctrinfo.identify sandbox=True).
        `exits`: process exit statuses (control/thawd/exits.py), which tell a
        stand-in killed after its commit; None: its marker alone decides.
        `kube`: the Kubernetes API client (control/thawd/kubeapi.py) for Events
        (kubernetes.events) and pod specs (kubernetes.read_pods); None: neither."""
        self.s = settings
        self.exits = exits
        self.images = images
        self.metrics = metrics or Metrics()
        self.state_dir = settings.state_dir / "thawd"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.containers = Containers(
            settings, self.metrics,
            identify or (lambda rt: ctrinfo.identify_container(settings, rt.runsc_root, rt.container_id)),
            identify_sandbox or (lambda rt: ctrinfo.identify_container(settings, rt.runsc_root, rt.container_id,
                                                                       sandbox=True)))
        self.quarantine = Quarantine(settings)
        self.events = Events(kube if settings.kubernetes_events else None, node_name(settings), self.metrics)
        podspecs = PodSpecs(kube if settings.kubernetes_read_pods else None, self.events, self.metrics)
        self._pool = ThreadPoolExecutor(max_workers=settings.thawd_workers, thread_name_prefix="thawd")
        self.parking = Parking(settings, self.state_dir, self.containers, images, self.metrics, self._pool)
        self.preparer = Preparer(settings, self.containers, images, self.quarantine, self.metrics, self._pool,
                                 self.parking)
        self.restorer = Restorer(settings, self.containers, self.quarantine, self.metrics, self.parking)
        self.autocheckpoint = AutoCheckpointer(settings, self.containers, images, self.quarantine, self.metrics,
                                               self._pool, self.parking, self.events)
        self.scrub = None   # the cache scrub (control/images/scrub.py): server.build starts it, close stops it
        self.shim_logs = None   # control/thawd/shimlogs.py: the same
        self.pods = Pods(settings, self.state_dir, self.containers, self.preparer, self.restorer,
                         self.autocheckpoint, self.quarantine, self.metrics, store_for=images.store_for,
                         pool=self._pool, events=self.events, podspecs=podspecs)
        self.roles = Roles(self.containers, self.preparer, self.restorer, self.autocheckpoint, self.pods,
                           self.parking, self.metrics, self.events)

    def prepare_restore(self, rt: RuntimeRef, stdio: str = "") -> Decision:
        """create (PrepareRestore). `stdio`: what the shim gave the container as stdin,
        stdout, stderr (the stand-in's fstat of them), kept for parking."""
        return self.roles.prepare(rt, stdio)

    def restore(self, rt: RuntimeRef, cancelled=lambda: False, standin: Standin | None = None,
                subcontainer_restored: bool = False) -> tuple[bool, str, float]:
        """start of a container PrepareRestore answered RESTORE (or ADOPT) to; the
        outcome is recorded by the room that restores it. Not restored: the sandbox
        is removed and the caller starts it cold. `cancelled()` tells whether the
        stand-in gave up; with `standin`, the restore is kept only once that stand-in
        exited having committed it. A pod's app container (`subcontainer_restored`):
        the stand-in ran its `runsc restore` itself (control/thawd/pods.py says why)."""
        return self.roles.restore(rt, cancelled, standin, subcontainer_restored)

    def report_outcome(self, rt: RuntimeRef, outcome: str, reason: str, key: str | None = None) -> None:
        """What the stand-in reports: RESTORE_FAILED (it could not do its part of a
        restore) or COLD_STARTED (an opted-in container started cold)."""
        self.roles.report(rt, outcome, reason, key)

    def release(self, container_id: str, runsc_root: str, why: str = RELEASED_UNRESTORED) -> bool:
        """delete of a container: its record, lease, pod membership and adopted parked
        sandbox go. True when it held an image lease."""
        return self.roles.release(container_id, runsc_root, why)

    def abandon(self, rt: RuntimeRef, why: str) -> bool:
        """The stand-in that asked for `rt`'s decision is gone before the answer reached it
        (SIGKILLed, or past its deadline): nobody will restore the container or report an
        outcome, and containerd's delete may have come while thawd still decided, before
        the decision existed to release (issue 14: every decision ends in one outcome).
        Released now, as a delete would: ABANDONED."""
        return self.roles.release(rt.container_id, str(rt.runsc_root), why)

    def checkpoint(self, rt: RuntimeRef, leave_running: bool = True, key: str | None = None,
                   hooks_rt: RuntimeRef | None = None) -> dict:
        return self.autocheckpoint.checkpoint(rt, leave_running, key, hooks_rt)

    def lease_of(self, rt: RuntimeRef):
        return self.containers.lease_of(rt)

    def quarantined(self) -> dict[str, str]:
        return self.quarantine.items()

    def unquarantine(self, key: str) -> bool:
        return self.quarantine.lift(key)

    def stats(self) -> dict:
        return {"counters": self.metrics.counters(), "entries": self.quarantine.mark(self.images.entries())}

    def evict(self, key: str) -> bool:
        return self.quarantine.evict(key, self.images)

    def close(self) -> None:
        self.events.close()
        for background in (self.scrub, self.shim_logs):
            if background is not None:
                background.stop()
        self.parking.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.containers.close()
