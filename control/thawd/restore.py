"""start of a lone container create answered RESTORE or ADOPT to: the restore
(runsc restore, the health check, the post-restore hooks, the gate opened:
control/lifecycle/engine.py) or the wake of the parked sandbox it adopted,
and the outcome recorded once.

Not restored, the sandbox is removed, the namespace's addresses and routes
put back (runsc took them), the gate opened, the lease released and the
failure counted towards the key's quarantine; the stand-in then starts the
container cold. A restore is kept only once the stand-in that asked for it
has exited having committed it (control/thawd/standin.py): a stand-in killed
between thawd's answer and its commit made containerd report a failed start,
and the container must not run (issue 14). A pod's sandbox restores through
control/thawd/pods.py, which uses `restore_options`, `restore_failure`,
`undo_restore` and `count_stream` from here.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from control.errors import IntegrityError, ThawError
from control.lifecycle.engine import Engine, Handle, Restored
from control.thawd.containers import Containers, RuntimeRef
from control.thawd.standin import CONFIRM_TIMEOUT_S, Standin
from runsc_hooks import gate as gatemod
from runsc_hooks import netns as netnsmod
from runsc_hooks.runsc import RestoreOptions
from control.logfields import fields
from control.lifecycle.workload import workload_of

log = logging.getLogger("thawd")


def restore_options(settings, lease) -> RestoreOptions:
    """`runsc restore`'s options for a leased image. A streamed one (store.stream):
    runsc takes thaw-gofer as its checkpoint-gofer for this call (the sidecar
    directory in its environment) and restores in the background (the image is still
    arriving). A pod's sandbox takes the same (Pods.restore_sandbox): at the pin only
    the root's `runsc restore` reads the image (docs/store.md "Pods")."""
    return RestoreOptions(image_path=Path(lease.path), detach=True,
                          background=settings.restore_background or lease.streamed,
                          env=tuple(lease.env().items()))


def restore_failure(lease, reason: str) -> tuple[str, bool]:
    """Why a restore from `lease` failed, and whether that counts towards the key's
    quarantine. When its stream failed, the gofer failed the sentry's reads and runsc
    killed the sandbox: the stream's error is the reason, and it counts as a pull's
    failure would (prepare.claim_image): only when the store served bytes that are not
    the image's, never for a full cache file system (NoSpace) or a store that stalled.
    A cache entry whose checked read found an altered chunk (control/images/served.py)
    is `corrupt: ...`, not counted: the entry is marked corrupt and the next start
    fetches it again (issue 30). Otherwise `reason`, counted."""
    failed = lease.verdict()
    if failed is None:
        return reason, True
    from control.images.stream import failure_reason
    return failure_reason(failed), isinstance(failed, IntegrityError) and failed.where == "store"


class Restorer:
    def __init__(self, settings, containers: Containers, quarantine, metrics, parking) -> None:
        self.s = settings
        self.containers = containers
        self.quarantine = quarantine
        self.metrics = metrics
        self.parking = parking

    def lone(self, rt: RuntimeRef, spec: dict | None, unreadable: str, cancelled, standin: Standin | None,
             t0: float) -> tuple[bool, str, float]:
        """The restore (or wake) of a lone container; `spec` None: its bundle could not
        be read (`unreadable` says why)."""
        from control.errors import IdentityError
        lease = self.containers.lease_of(rt)
        if lease is None:
            return False, "thawd holds no restore decision for this container (thawd restarted?)", 0.0
        key, gate = self.containers.start_restore(rt)   # from here, the engine and undo_restore own the gate
        log.info("restore %s key=%s starting", rt.container_id, key,
                 extra=fields(container=rt.container_id, key=key, decision="restoring"))
        if spec is None:
            return self._not_tried(rt, key, gate, unreadable, t0)
        try:
            # The identity established at create: a tag moved since must not change
            # the key; an error here means thawd restarted.
            wl = self.containers.workload(rt, spec)
        except IdentityError as e:
            return self._not_tried(rt, key, gate, f"{type(e).__name__}: {getattr(e, 'message', e)}", t0)
        key = wl.key if wl else key
        parked = self.parking.get(self.containers.adopted(rt))
        if parked is not None:
            return self._wake(rt, spec, key, wl, parked, cancelled, standin, t0)
        h = Handle(rt.container_id, rt.runsc(self.s.runsc_path, self.s.runsc_timeout_s), rt.bundle)
        image = Path(lease.path)
        try:
            h = self.containers.handle(rt, spec)
            done = Engine(self.s).restore(h, image, [wl.health] if wl else [], opts=restore_options(self.s, lease),
                                          health_check=self.s.thawd_health_check)
        except Exception as e:  # noqa: BLE001 - every decision ends in one recorded outcome
            if not isinstance(e, ThawError):
                log.exception("restore of %s failed unexpectedly", rt.container_id)
            reason, counts = restore_failure(lease, f"{type(e).__name__}: {getattr(e, 'message', e)}")
            self.undo_restore(h, rt, key, reason, quarantine=counts)
            return False, reason, time.monotonic() - t0
        if cancelled():
            self.undo_restore(h, rt, key, "the stand-in gave up before the restore finished")
            return False, "cancelled", time.monotonic() - t0
        secs = time.monotonic() - t0
        self.count_stream(lease)
        if standin is None:
            self._restored(rt, key, done, secs)
        else:
            threading.Thread(target=self._confirm, args=(rt, h, key, standin, done, secs), daemon=True,
                             name=f"confirm-{rt.container_id}"[:15]).start()
        self.parking.note_start(rt, spec, key, self.containers.stdio_of(rt))
        return True, done.health.summary() if done.health else "", secs

    def _wake(self, rt: RuntimeRef, spec: dict, key: str, wl, parked, cancelled, standin, t0: float):
        """start of a container that adopted a parked sandbox: its CUDA state back, the
        health probe, the post-restore hooks (Parking.wake). Not woken: the sandbox is
        removed, and the stand-in starts the container cold."""
        undo = lambda why, counts=True: self._undo_adoption(rt, key, parked, why, counts)  # noqa: E731
        try:
            cuda_s, _, health, hooks = self.parking.wake(parked, rt, [wl.health] if wl else [])
        except Exception as e:  # noqa: BLE001 - every decision ends in one recorded outcome
            if not isinstance(e, ThawError):
                log.exception("wake of %s (parked %s) failed unexpectedly", rt.container_id, parked.id)
            reason = f"adopting parked sandbox {parked.id}: {type(e).__name__}: {getattr(e, 'message', e)}"
            undo(reason)
            return False, reason, time.monotonic() - t0
        if cancelled():
            undo("the stand-in gave up before the adoption finished")
            return False, "cancelled", time.monotonic() - t0
        secs = time.monotonic() - t0
        done = Restored(secs, 0.0, health, hooks)
        log.info("outcome %s key=%s adopted parked %s: CUDA %.4fs", rt.container_id, key, parked.id, cuda_s,
                 extra=fields(container=rt.container_id, key=key, decision="adopted", parked=parked.id,
                              duration_s=round(secs, 4)))
        self.metrics.inc("thaw_adoptions_total")
        self.metrics.observe("thaw_adopt_seconds", secs)
        if standin is None:
            self._restored(rt, key, done, secs)
        else:
            threading.Thread(target=self._confirm, args=(rt, None, key, standin, done, secs, undo), daemon=True,
                             name=f"confirm-{rt.container_id}"[:15]).start()
        self.parking.note_start(rt, spec, key, self.containers.stdio_of(rt))
        return True, health.summary() if health else "", secs

    def _undo_adoption(self, rt: RuntimeRef, key: str, parked, reason: str, quarantine: bool = True) -> None:
        """An adoption that will not be used: the parked sandbox goes (its alias too),
        the outcome is recorded (the container's lease released)."""
        self.parking.discard(parked, f"adoption by {rt.container_id} ended: {reason}")
        self.failed(rt, key, reason, quarantine=quarantine)

    def _not_tried(self, rt: RuntimeRef, key: str, gate, reason: str, t0: float):
        """End a restore that never reached runsc: the cold start needs its network
        (the gate opened), and the outcome is recorded."""
        if gate is not None:
            gatemod.open(gate, f"restore of {rt.container_id} not tried: {reason}")
        self.failed(rt, key, reason)
        return False, reason, time.monotonic() - t0

    def undo_restore(self, h: Handle, rt: RuntimeRef, key: str, reason: str, quarantine: bool = True) -> None:
        """A restore that will not be used: kill and delete the sandbox (the stand-in
        creates it again, cold), put the namespace's addresses and routes back
        (runsc removed them), open the gate, release the lease, count the failure
        (towards the key's quarantine too, unless `quarantine` is False)."""
        try:
            if h.runsc.exists(h.id):
                h.runsc.delete(h.id, force=True)
        except ThawError as e:
            log.warning("removing the failed restore of %s: %s", rt.container_id, e)
        net = self.containers.take_network(rt)
        if net is not None:
            try:
                netnsmod.reapply(*net)
            except Exception as e:  # noqa: BLE001 - the cold start goes on; it may lack its network
                log.warning("network of %s not put back after its failed restore: %s", rt.container_id, e)
        if h.gate is not None:
            gatemod.open(h.gate, f"restore of {rt.container_id} failed; starting cold")
        self.failed(rt, key, reason, quarantine=quarantine)

    def failed(self, rt: RuntimeRef, key: str, reason: str, quarantine: bool = True) -> None:
        """The outcome RESTORE_FAILED of a lone container (thawd's own, or the
        stand-in's report): counted, its image lease and any parked sandbox it adopted
        released, towards the key's quarantine unless `quarantine` is False."""
        self.containers.end(rt, "RESTORE_FAILED", reason)
        log.info("outcome %s key=%s RESTORE_FAILED %s", rt.container_id, key, reason,
                 extra=fields(container=rt.container_id, key=key or None, decision="RESTORE_FAILED", reason=reason))
        self.metrics.inc("thaw_fallbacks_total", reason=reason.split(":")[0])
        c = self.containers.drop_image(rt)
        if c is not None and c.adopted:
            adopted, c.adopted = c.adopted, ""
            self.parking.release(adopted, rt.container_id)
        if key and quarantine and self.quarantine.failed(key, reason):
            self.metrics.inc("thaw_quarantined_total")

    def count_stream(self, lease) -> None:
        """thaw_streams_total{result}: how the stream of a restore that succeeded ended
        (installed in the cache, or failed while the sandbox loaded its pages)."""
        if lease.streamed:
            lease.add_done_callback(lambda st: self.metrics.inc(
                "thaw_streams_total", result="installed" if st.error is None else "failed"))

    def _restored(self, rt: RuntimeRef, key: str, done, secs: float) -> None:
        self.containers.restored(rt)
        # Four decimals: the flood benchmark's containerd door reads its runsc and health split from here.
        log.info("outcome %s key=%s RESTORED %.4fs (runsc %.4fs, health %s)", rt.container_id, key, secs,
                 done.runsc_s, f"{done.health.seconds:.4f}s: {done.health.summary()}" if done.health else "off",
                 extra=fields(container=rt.container_id, key=key, decision="RESTORED", duration_s=round(secs, 4),
                              runsc_s=round(done.runsc_s, 4)))
        self.metrics.inc("thaw_restores_total")
        self.metrics.observe("thaw_restore_seconds", secs, workload=workload_of(key))
        self.metrics.observe("thaw_health_seconds", done.health.seconds if done.health else 0.0)
        self.quarantine.succeeded(key)

    def _confirm(self, rt: RuntimeRef, h: Handle | None, key: str, standin: Standin, done, secs: float,
                 undo=None) -> None:
        """Keep the restore once its stand-in has exited having committed it (its
        marker says "restored"); remove it when the stand-in died first (SIGKILL
        between thawd's answer and its exit): containerd then reports the start
        failed, and the container must not run (issue 14). A stand-in still alive
        after CONFIRM_TIMEOUT_S (stopped?) is trusted: removing a restore it may
        still report would be the opposite mismatch."""
        try:
            if not standin.watchable:   # not a stand-in this thawd can see: keep what it restored
                self._restored(rt, key, done, secs)
                return
            exited = standin.wait_exit(CONFIRM_TIMEOUT_S)
            if not exited:
                log.warning("stand-in %d of %s still runs %.0f s after its restore; keeping the restore",
                            standin.pid, rt.container_id, CONFIRM_TIMEOUT_S)
            elif standin.committed(rt.container_id) is False:
                why = "the stand-in died after the restore, before it could report it"
                if undo is not None:
                    undo(why)
                else:
                    self.undo_restore(h, rt, key, why)
                return
            self._restored(rt, key, done, secs)
        except Exception:  # noqa: BLE001 - a thread of its own: log, never lose the outcome
            log.exception("confirming the restore of %s", rt.container_id)
            self._restored(rt, key, done, secs)
