"""thawd's logic, wired: one `Thawd` that the gRPC servicer (control/thawd/server.py)
adapts and that tests drive without gRPC. Every request field is validated at
the edge (containers.RuntimeRef, standin.Standin).

The rooms it wires, each a verb or a noun of the containerd door:
- containers.py: the container record, its state table, one lock, one map;
- prepare.py: create's decision for a lone container (restore, adopt, cold);
- restore.py: start's restore (or wake), the outcome, the undo;
- autocheckpoint.py: a cold start checkpointed once ready;
- pods.py: a Kubernetes pod's decision, restore and checkpoint, by its sandbox;
- parking.py: sandboxes restored ahead of demand (park.enabled);
- quarantine.py, metrics.py, standin.py, ctrinfo.py, exits.py.
A request goes to pods.py or the lone rooms by its container's role
(control/lifecycle/pod.py), decided here and nowhere else.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from control.config import Settings
from control.errors import ThawError, UserError
from control.lifecycle import pod as podmod
from control.lifecycle import workload as workloadmod
from control.thawd import ctrinfo
from control.thawd.autocheckpoint import AutoCheckpointer
from control.thawd.containers import RELEASED_UNRESTORED, Containers, Decision, RuntimeRef
from control.thawd.events import Events
from control.thawd.exits import ExitWatch
from control.thawd.metrics import Metrics
from control.thawd.parking import Parking
from control.thawd.pods import Pods
from control.thawd.podspecs import PodSpecs
from control.thawd.prepare import Preparer
from control.thawd.quarantine import Quarantine
from control.thawd.restore import Restorer
from control.thawd.standin import Standin
from runsc_hooks import spec as specmod
from control.logfields import fields
from control.lifecycle.tenant import store_tenant

log = logging.getLogger("thawd")

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
        from control.thawd.kubeapi import node_name
        self.events = Events(kube if settings.kubernetes_events else None, node_name(settings), self.metrics)
        podspecs = PodSpecs(kube if settings.kubernetes_read_pods else None, self.events, self.metrics)
        self._pool = ThreadPoolExecutor(max_workers=settings.thawd_workers, thread_name_prefix="thawd")
        self.parking = Parking(settings, self.state_dir, self.containers, images, self.metrics, self._pool)
        self.preparer = Preparer(settings, self.containers, images, self.quarantine, self.metrics, self._pool,
                                 self.parking)
        self.restorer = Restorer(settings, self.containers, self.quarantine, self.metrics, self.parking)
        self.autocheckpoint = AutoCheckpointer(settings, self.containers, images, self.quarantine, self.metrics,
                                               self._pool, self.parking, self.events)
        self.pods = Pods(settings, self.state_dir, self.containers, self.preparer, self.restorer,
                         self.autocheckpoint, self.quarantine, self.metrics, store_for=images.store_for,
                         pool=self._pool, events=self.events, podspecs=podspecs)

    # -- create ------------------------------------------------------------------

    def prepare_restore(self, rt: RuntimeRef, stdio: str = "") -> Decision:
        """`stdio`: what the shim gave the container as stdin, stdout, stderr (the stand-in's
        fstat of them: PrepareRestoreRequest.stdio); kept for parking."""
        t0 = time.monotonic()
        self.containers.begin(rt, stdio)
        d = self._decide(rt, t0)
        self.metrics.observe("thaw_prepare_seconds", time.monotonic() - t0)
        if d.restore:
            self.metrics.inc("thaw_restore_decisions_total")
        else:
            self.metrics.inc("thaw_cold_decisions_total", reason=d.reason.split(":")[0])
        log.info("prepare %s key=%s -> %s %s", rt.container_id, d.key, "restore" if d.restore else "cold", d.reason,
                 extra=fields(container=rt.container_id, key=d.key or None, tenant=store_tenant(d.key) if d.key else None,
                              decision=("adopt" if d.adopt_id else "restore") if d.restore else "cold",
                              reason=d.reason or None))
        return d

    def _decide(self, rt: RuntimeRef, t0: float) -> Decision:
        spec = specmod.Bundle(rt.bundle).load()
        if not workloadmod.opted_in(spec):
            return Decision(False, "not-opted-in")
        workloadmod.check_annotation_sizes(spec)   # bounded input: refused before the identity lookup
        role = podmod.role(spec)
        if role == podmod.SANDBOX:       # a Kubernetes pod's pause container: the pod's decision
            d = self.pods.prepare_sandbox(rt, spec)
            if not d.restore:
                self.events.cold(podmod.pod_ref(spec), d.reason)
            return d
        if role == podmod.MEMBER:        # an app container: its pod's decision, checked against the image
            return self.pods.prepare_member(rt, spec)
        return self.preparer.lone(rt, spec, t0)

    # -- start -------------------------------------------------------------------

    def restore(self, rt: RuntimeRef, cancelled=lambda: False, standin: Standin | None = None,
                subcontainer_restored: bool = False) -> tuple[bool, str, float]:
        """start of a container PrepareRestore answered RESTORE (or ADOPT) to; the
        outcome is recorded by the room that restores it. Not restored: the sandbox
        is removed and the caller starts it cold. `cancelled()` tells whether the
        stand-in gave up; with `standin`, the restore is kept only once that stand-in
        exited having committed it. A pod's app container (`subcontainer_restored`):
        the stand-in ran its `runsc restore` itself (control/thawd/pods.py says why)."""
        t0 = time.monotonic()
        if standin is not None:
            standin.observe()   # before anything: its identity, while it surely lives
        try:
            spec, unreadable = specmod.Bundle(rt.bundle).load(), ""
        except ThawError as e:
            if subcontainer_restored:
                raise           # a pod's app container holds no decision of its own to end
            spec, unreadable = None, f"{type(e).__name__}: {e.message}"
        role = podmod.role(spec) if spec is not None else podmod.LONE
        if role == podmod.MEMBER or subcontainer_restored:
            if not (role == podmod.MEMBER and subcontainer_restored):
                raise UserError("subcontainer_restored is for a pod's app container, after its own runsc restore, "
                                "and such a container's Restore must set it", field="subcontainer_restored")
            return self.pods.restore_member(rt, spec, standin)   # the pod's Event: Pods.restore_member
        if role == podmod.SANDBOX:
            ok, detail, secs = self.pods.restore_sandbox(rt, cancelled, standin)
            if not ok:   # the pause container starts cold, and with it the pod
                self.events.cold(podmod.pod_ref(spec), f"the sandbox's restore failed: {detail}")
            return ok, detail, secs
        return self.restorer.lone(rt, spec, unreadable, cancelled, standin, t0)

    def report_outcome(self, rt: RuntimeRef, outcome: str, reason: str, key: str | None = None) -> None:
        """What the stand-in reports: RESTORE_FAILED (it could not do its part of a
        restore) or COLD_STARTED (an opted-in container started cold)."""
        if outcome not in ("RESTORE_FAILED", "COLD_STARTED"):
            raise UserError(f"outcome {outcome!r}: expected RESTORE_FAILED or COLD_STARTED", field="outcome")
        if key is None:
            spec = specmod.Bundle(rt.bundle).load()
            role = podmod.role(spec)
            if role != podmod.LONE:
                log.info("outcome %s (pod %s) %s %s", rt.container_id, role, outcome, reason,
                         extra=fields(container=rt.container_id, role=role, decision=outcome, reason=reason or None))
                self.containers.end(rt, outcome, reason)   # a pod's sandbox whose create failed
                if outcome == "RESTORE_FAILED":
                    self.pods.restore_failed(rt, spec, reason)
                else:
                    self.metrics.inc("thaw_cold_starts_total")
                    self.pods.cold_started(rt, spec)
                return
            key = self.containers.key(rt, spec)
        if outcome == "RESTORE_FAILED":
            self.restorer.failed(rt, key, reason)
            return
        self.containers.end(rt, outcome, reason)
        log.info("outcome %s key=%s %s %s", rt.container_id, key, outcome, reason,
                 extra=fields(container=rt.container_id, key=key or None, decision=outcome, reason=reason or None))
        self.metrics.inc("thaw_cold_starts_total")
        self.autocheckpoint.lone(rt, key)

    # -- delete ------------------------------------------------------------------

    def release(self, container_id: str, runsc_root: str, why: str = RELEASED_UNRESTORED) -> bool:
        """delete of a container: its record, lease, pod membership and adopted parked
        sandbox go. True when it held an image lease."""
        self.pods.forget(runsc_root, container_id)
        c = self.containers.release(RuntimeRef(container_id, Path("/"), Path(runsc_root), ()), why)
        if c is not None and c.adopted:
            self.parking.release(c.adopted, container_id)
        return c is not None and c.image is not None

    def abandon(self, rt: RuntimeRef, why: str) -> bool:
        """The stand-in that asked for `rt`'s decision is gone before the answer reached it
        (SIGKILLed, or past its deadline): nobody will restore the container or report an
        outcome, and containerd's delete may have come while thawd still decided, before
        the decision existed to release (issue 14: every decision ends in one outcome).
        Released now, as a delete would: ABANDONED."""
        return self.release(rt.container_id, str(rt.runsc_root), why)

    # -- explicit ------------------------------------------------------------------

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
        entries = self.images.entries()
        q = self.quarantined()
        for e in entries:
            if e["key"] in q:
                e["state"], e["reason"] = "quarantined", q[e["key"]]
        return {"counters": self.metrics.counters(), "entries": entries}

    def evict(self, key: str) -> bool:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", key or ""):
            raise UserError(f"workload_key {key!r} is not a valid key", field="workload_key")
        removed = self.images.evict(key)
        self.unquarantine(key)
        return removed

    def close(self) -> None:
        self.events.close()
        self.parking.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.containers.close()
