"""Which room answers a request of the containerd door: a container's role
(control/lifecycle/pod.py) decides it, here and nowhere else. A Kubernetes
pod's sandbox (pause) or app container goes to control/thawd/pods.py; a lone
container to prepare.py (create), restore.py (start, a failed restore) and
autocheckpoint.py (a cold start, checkpointed once ready).

Create's decision is logged and counted here, once for every role: its line
carries the container, key, tenant, decision and reason as fields
(control/logfields.py), and thaw_prepare_seconds, thaw_restore_decisions_total
and thaw_cold_decisions_total{reason} count it. What the stand-in reports later
(ReportOutcome) is logged and counted by the room it goes to. A pod's cold start
(its sandbox's create decided cold, or its sandbox's restore failed) is an Event
on the pod too (control/thawd/events.py); its restore and checkpoint are posted
by the rooms that do them.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from control.errors import ThawError, UserError
from control.lifecycle import pod as podmod
from control.lifecycle import workload as workloadmod
from control.lifecycle.tenant import store_tenant
from control.logfields import fields
from control.thawd.containers import RELEASED_UNRESTORED, Containers, Decision, RuntimeRef
from control.thawd.standin import Standin
from runsc_hooks import spec as specmod

log = logging.getLogger("thawd")

OUTCOMES = ("RESTORE_FAILED", "COLD_STARTED")


class Roles:
    def __init__(self, containers: Containers, preparer, restorer, autocheckpoint, pods, parking, metrics,
                 events) -> None:
        self.containers = containers
        self.preparer = preparer
        self.restorer = restorer
        self.autocheckpoint = autocheckpoint
        self.pods = pods
        self.parking = parking
        self.metrics = metrics
        self.events = events

    def prepare(self, rt: RuntimeRef, stdio: str = "") -> Decision:
        """create: the container's record begins (PREPARING, with what the shim gave it as
        stdio), its role's room decides, and the decision is logged and counted."""
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

    def restore(self, rt: RuntimeRef, cancelled=lambda: False, standin: Standin | None = None,
                subcontainer_restored: bool = False) -> tuple[bool, str, float]:
        """start of a container create answered RESTORE (or ADOPT) to (Thawd.restore says
        what each argument is), sent to its role's room, which records the outcome."""
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

    def report(self, rt: RuntimeRef, outcome: str, reason: str, key: str | None = None) -> None:
        """What the stand-in reports (one of OUTCOMES), sent to its role's room; `key`
        given: a lone container's, its role not read again."""
        if outcome not in OUTCOMES:
            raise UserError(f"outcome {outcome!r}: expected RESTORE_FAILED or COLD_STARTED", field="outcome")
        if key is None:
            spec = specmod.Bundle(rt.bundle).load()
            if podmod.role(spec) != podmod.LONE:
                self.pods.outcome(rt, spec, outcome, reason)
                return
            key = self.containers.key(rt, spec)
        if outcome == "RESTORE_FAILED":
            self.restorer.failed(rt, key, reason)
        else:
            self.autocheckpoint.cold_started(rt, key, reason)

    def release(self, container_id: str, runsc_root: str, why: str = RELEASED_UNRESTORED) -> bool:
        """delete of a container: its record, lease, pod membership and adopted parked
        sandbox go. True when it held an image lease."""
        self.pods.forget(runsc_root, container_id)
        c = self.containers.release(RuntimeRef(container_id, Path("/"), Path(runsc_root), ()), why)
        if c is not None and c.adopted:
            self.parking.release(c.adopted, container_id)
        return c is not None and c.image is not None
