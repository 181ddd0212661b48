"""The automatic checkpoint: a workload that started cold is checkpointed once
its readiness probe passes, and its image published, so that its next start
restores.

One job per key at a time, in thawd's worker pool; none for a key that is
quarantined, already has an image for this node, or while automatic
checkpoints are off (thawd.auto_checkpoint). The engine saves with the
workload left running (a failed save never loses it); with
thawd.leave_running off it is stopped only once the image is complete.
runsc writes the image straight into a partial directory of the node cache;
publishing chunks and uploads it from there and the cache adopts it by
rename: one copy of the image, hashed once. A pod's sandbox is checkpointed
through the same path (control/thawd/pods.py), under the pod's key.
"""

from __future__ import annotations

import logging
import threading

from control.errors import ThawError, UserError
from control.lifecycle import image_meta
from control.lifecycle import workload as workloadmod
from control.lifecycle.engine import Engine
from control.thawd.containers import Containers, RuntimeRef
from nvproxy.cuda import uses_gpu
from runsc_hooks import spec as specmod
from control.logfields import fields
from control.lifecycle.workload import workload_of

log = logging.getLogger("thawd")


class AutoCheckpointer:
    def __init__(self, settings, containers: Containers, images, quarantine, metrics, pool, parking,
                 events=None) -> None:
        self.s = settings
        self.containers = containers
        self.images = images
        self.quarantine = quarantine
        self.metrics = metrics
        self._pool = pool
        self.parking = parking
        self.events = events      # control/thawd/events.py: a pod's checkpoint is an Event on it
        self._lock = threading.Lock()
        self._running: set[str] = set()     # keys a job runs for

    def cold_started(self, rt: RuntimeRef, key: str, reason: str) -> None:
        """A lone container started cold (the stand-in's COLD_STARTED): its record ends
        cold, the start is counted, and it is checkpointed once it is ready."""
        self.containers.end(rt, "COLD_STARTED", reason)
        log.info("outcome %s key=%s COLD_STARTED %s", rt.container_id, key, reason,
                 extra=fields(container=rt.container_id, key=key or None, decision="COLD_STARTED",
                              reason=reason or None))
        self.metrics.inc("thaw_cold_starts_total")
        self.lone(rt, key)

    def lone(self, rt: RuntimeRef, key: str) -> None:
        """A lone container of `key` started cold: checkpoint it once it is ready."""
        self.maybe(key, lambda: self._lone_job(rt, key), rt.container_id)

    def maybe(self, key: str, job, what: str = "", pod=None) -> None:
        """Run `job` (it checks readiness and checkpoints) in the background, unless
        automatic checkpoints are off, `key` is quarantined, has an image already, or
        is being checkpointed now. `pod` (lifecycle.pod.PodRef): where its Event goes."""
        if not self.s.thawd_auto_checkpoint or not key or self.quarantine.reason(key) is not None:
            return
        try:
            if self.images.has(key):
                return
        except ThawError as e:
            log.warning("auto-checkpoint of %s skipped: cannot tell whether %s has an image (%s)", what, key, e)
            return
        with self._lock:
            if key in self._running:
                return
            self._running.add(key)
        self._pool.submit(self._run, key, job, what, pod)

    def _run(self, key: str, job, what: str, pod=None) -> None:
        try:
            res = job()
            if res is not None:
                log.info("auto-checkpoint of %s published %s (%d bytes, %.2fs)", what, key,
                         res["image_bytes"], res["seconds"],
                         extra=fields(container=what, key=key, decision="checkpointed", bytes=res["image_bytes"],
                                      duration_s=round(res["seconds"], 3)))
                self.metrics.inc("thaw_auto_checkpoints_total", result="ok")
                if self.events is not None:
                    self.events.checkpointed(pod, key, res["image_bytes"], res["seconds"])
        except Exception as e:  # noqa: BLE001 - a failed auto-checkpoint must not hurt the container
            log.warning("auto-checkpoint of %s failed: %s", what, e,
                        extra=fields(container=what, key=key, decision="checkpoint-failed", reason=str(e)))
            self.metrics.inc("thaw_auto_checkpoints_total", result="error")
            if self.events is not None:
                self.events.checkpoint_failed(pod, f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._running.discard(key)

    def _lone_job(self, rt: RuntimeRef, key: str) -> dict | None:
        """A lone container's: wait for its readiness probe, checkpoint, publish."""
        spec = specmod.Bundle(rt.bundle).load()
        wl = self.containers.workload(rt, spec)
        if wl is None or wl.key != key:
            log.warning("auto-checkpoint of %s skipped: its key is no longer %s", rt.container_id, key)
            return None
        if wl.ready is None:
            log.warning("auto-checkpoint of %s skipped: the workload declares no readiness probe "
                        "(annotation %s); thaw does not guess when it is warm", rt.container_id,
                        workloadmod.ANNOTATION_READY)
            self.metrics.inc("thaw_auto_checkpoints_total", result="no-ready-probe")
            return None
        engine = Engine(self.s)
        h = self.containers.handle(rt, spec)
        ready = engine.check(h, [wl.ready], engine.policy(self.s.thawd_ready_timeout_s))
        if not ready.healthy:
            log.warning("auto-checkpoint of %s skipped: never ready (%s)", rt.container_id, ready.summary(),
                        extra=fields(container=rt.container_id, key=key, decision="not-ready", reason=ready.summary()))
            self.metrics.inc("thaw_auto_checkpoints_total", result="not-ready")
            return None
        res = self.checkpoint(rt, leave_running=self.s.thawd_leave_running)
        self.parking.note_start(rt, spec, key, self.containers.stdio_of(rt))
        return res

    def checkpoint(self, rt: RuntimeRef, leave_running: bool = True, key: str | None = None,
                   hooks_rt: RuntimeRef | None = None, members: dict[str, RuntimeRef] | None = None) -> dict:
        """Checkpoint a running container and publish the image (under `key`, default
        the container's workload key; a pod's sandbox passes the pod's, its hooks run
        against `hooks_rt`, an app container of it, and `members` are its app containers
        by name: the GPU ones get the CUDA helper named, and every one's spec goes into
        the image's metadata).
        The engine saves with the workload
        left running: a failed save never loses it; without `leave_running` it is
        stopped only after the image is complete."""
        spec = specmod.Bundle(rt.bundle).load()
        if not workloadmod.opted_in(spec):
            raise UserError(f"container {rt.container_id} did not opt in (annotation {workloadmod.ANNOTATION_WORKLOAD})")
        # A pod's key was made from its containers' identities (pods.py); its pause
        # container has no image digest of its own to ask for (ctrinfo.identify).
        key = key or self.containers.workload(rt, spec).key
        specs = {n: specmod.Bundle(m.bundle).load() for n, m in (members or {}).items()}
        with self.images.staged(key) as image:
            hooks_on = self.containers.handle(hooks_rt, specmod.Bundle(hooks_rt.bundle).load()) if hooks_rt else None
            cuda_on = [self.containers.handle(members[n], s) for n, s in specs.items() if uses_gpu(s)]
            saved = Engine(self.s).checkpoint(self.containers.handle(rt, spec), image.path,
                                              stop_after=not leave_running, hooks_on=hooks_on, cuda_on=cuda_on)
            # What a restore needs, with the image (thaw.json, as the CLI's images
            # carry it): the spec runsc validates at restore and the GPUs it holds;
            # a pod's, every app container's spec and its GPU containers' needs.
            if members:
                image_meta.write(image.path, image_meta.DOOR_CONTAINERD, spec, saved.files,
                                 image_meta.pod_gpu_needs(specs), saved.seconds, containers=specs)
            else:
                image_meta.write(image.path, image_meta.DOOR_CONTAINERD, spec, saved.files,
                                 image_meta.gpu_needs(spec), saved.seconds)
            published = self.images.publish(image)
        self.metrics.inc("thaw_checkpoints_total")
        self.metrics.observe("thaw_checkpoint_seconds", saved.seconds, workload=workload_of(key))
        return {"workload_key": key, "image_bytes": saved.bytes, "seconds": saved.seconds,
                "published": published}
