"""create of a lone container (PrepareRestore): restore, adopt or cold, decided
before runsc runs.

A lone container that opted in (thaw.dev/workload) is keyed by the identity
containerd records for it (control/thawd/containers.py). A GPU container gets
the CUDA checkpoint helper mounted, cold or restored alike (nvproxy/cuda.py).
With parking on, a parked sandbox of its key whose spec matches is taken
(ADOPT); else the key's image is leased from the node cache, fetched from the
store if need be (one pull per key however many ask; with store.stream a miss
is a Stream), its spec checked against the one the image was saved with, its
gate closed (RESTORE). Anything else is cold, with the reason. A Kubernetes
pod's containers are decided by control/thawd/pods.py, which leases its
image here too (`claim_image`).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from control.errors import (IntegrityError, KeyMissing, ManifestError, ManifestRefused, NotFound, ThawError, Timeout,
                            TupleMismatch)
from control.lifecycle import image_meta
from control.lifecycle import deadlines, profiles
from control.thawd.containers import Containers, Decision, RuntimeRef, State
from nvproxy import cdi
from nvproxy import cuda as cudamod
from runsc_hooks import gate as gatemod
from runsc_hooks import spec as specmod

log = logging.getLogger("thawd")

# The shim's config.json as it was before thawd rewrote it. Twin:
# go/internal/standin/standin.go origConfigName.
ORIG_CONFIG = "config.json.thaw-orig"


def fetch_reason(e: ThawError) -> str:
    """The decision reason (and metrics label) of a failed pull."""
    if isinstance(e, ManifestRefused):
        return "manifest-refused"
    if isinstance(e, KeyMissing):
        return "no-tenant-key"
    if isinstance(e, ManifestError):   # the reason's text names the manifest (issue 30)
        return "manifest-invalid"
    if isinstance(e, TupleMismatch):
        return "tuple-mismatch"
    if isinstance(e, Timeout):   # another pull or stream holds the key's lock (images/source.py)
        return "fetch-in-progress"
    return "fetch-failed"


class Preparer:
    def __init__(self, settings, containers: Containers, images, quarantine, metrics, pool, parking) -> None:
        """`images`: the image source (control/images/source.py ImageSource: pull/has/...)."""
        self.s = settings
        self.containers = containers
        self.images = images
        self.quarantine = quarantine
        self.metrics = metrics
        self._pool = pool
        self.parking = parking
        self._lock = threading.Lock()
        self._fetches: dict[str, Future] = {}    # key -> background pull
        self._node_devices = None                # lifecycle/gpus.py Devices, once asked

    def lone(self, rt: RuntimeRef, spec: dict, t0: float) -> Decision:
        """The decision for a lone (not a pod's) opted-in container."""
        from control.errors import IdentityError
        try:
            wl = self.containers.workload(rt, spec)
        except IdentityError as e:
            return Decision(False, str(e))
        try:
            self.prepare_spec(rt, spec)
        except ThawError as e:   # an unknown profile, a GPU request thaw cannot read: cold, said why
            return self._cold(rt, wl.key, f"spec: {e.message}")
        if self.parking.enabled and self.quarantine.reason(wl.key) is None:
            parked = self.parking.take(rt, spec, wl.key, self.containers.stdio_of(rt))
            if parked is not None:
                return self._adopt(rt, spec, wl.key, parked)
        return self.claim_image(rt, spec, wl.key, t0)

    def _adopt(self, rt: RuntimeRef, spec: dict, key: str, parked) -> Decision:
        """Container `rt` becomes parked sandbox `parked` (taken for it): the sandbox's
        image lease becomes the container's, as a restore's would (released at its delete)."""
        self.containers.decide(rt, State.ADOPT, key, adopted=parked.id, image=self.parking.lease_of(parked))
        self.metrics.inc("thaw_cache_hits_total")
        return Decision(True, f"parked: adopts {parked.id}", key, "", self.restore_deadline_s(spec),
                        adopt_id=parked.id, adopt_pid=parked.pid, relay_socket=parked.relay_socket)

    def claim_image(self, rt: RuntimeRef, spec: dict, key: str, t0: float | None = None) -> Decision:
        """A leased local image of `key` for container `rt` (fetched if need be, one pull
        per key; with store.stream a miss is a Stream: restore.restore_options), its gate
        closed; or cold with the reason. A lone container's and a pod's sandbox's alike."""
        why = self.quarantine.reason(key)
        if why is not None:
            return self._cold(rt, key, f"quarantined: {why}")
        # The identity lookup comes out of the same budget (t0, taken before it):
        # the stand-in waits thawd.prepare_timeout_s + 1 s for the whole answer.
        deadline = (t0 if t0 is not None else time.monotonic()) + self.s.thawd_prepare_timeout_s
        fut = self._fetch(key)
        try:
            lease = fut.result(timeout=max(0.05, deadline - time.monotonic()))
        except TimeoutError:
            return self._cold(rt, key, "fetch-in-progress: the image is still being fetched")
        except NotFound:
            return self._cold(rt, key, "no-image")
        except IntegrityError as e:
            # The store served bytes that are not the image's (thaw-fetch and the stream
            # check every chunk; neither retries a mismatch): every pull of this
            # image fails alike, so it counts towards quarantine like a failed restore,
            # and a quarantined key stops costing a download at every start.
            # A refused manifest (ManifestRefused, where "manifest") keeps its own reason,
            # manifest-refused, and counts only as a cold start.
            reason = f"{fetch_reason(e)}: {e}"
            if e.where == "store" and self.quarantine.failed(key, reason):
                self.metrics.inc("thaw_quarantined_total")
            return self._cold(rt, key, reason)
        except ThawError as e:
            return self._cold(rt, key, f"{fetch_reason(e)}: {e}")
        except Exception as e:  # noqa: BLE001 - a bug in the image path is a cold start naming it, not thawd-unavailable
            log.exception("fetch of %s failed unexpectedly", key)
            return self._cold(rt, key, f"fetch-failed: internal error: {type(e).__name__}: {str(e)[:300]}")
        if not self.containers.claim(rt, lease):
            # Another container took this pull's lease. The entry is local now: this pull
            # is a cache hit with its own lease, bounded by the same deadline (it may wait
            # for the key's lock behind another pull); a lease that comes too late goes.
            second = self._pool.submit(self.images.pull, key)
            try:
                lease = second.result(timeout=max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                second.add_done_callback(lambda f: f.exception() is None and f.result().release())
                return self._cold(rt, key, "fetch-in-progress: the image's cache entry is busy")
            except ThawError as e:
                return self._cold(rt, key, f"{fetch_reason(e)}: {e}")
            self.containers.claim(rt, lease)
        self.metrics.inc("thaw_cache_hits_total" if lease.hit else "thaw_cache_misses_total")
        h = self.containers.handle(rt, spec)
        why = image_meta.spec_mismatch(lease.path, spec)
        if why:
            self.containers.drop_image(rt)
            return self._cold(rt, key, f"spec-mismatch: {why}")
        self.containers.decide(rt, State.RESTORE, key, gate=h.gate)
        if h.gate is not None:  # no packet reaches the sandbox until the restore is healthy
            gatemod.close(h.gate, self.s.network_probe_mark, f"restore of {rt.container_id}")
        self.containers.remember_network(rt, spec)
        return Decision(True, "image-ready", key, str(lease.path), self.restore_deadline_s(spec, Path(lease.path)))

    def _cold(self, rt: RuntimeRef, key: str, reason: str) -> Decision:
        self.containers.decide(rt, State.COLD, key, reason=reason)
        return Decision(False, reason, key)

    def restore_deadline_s(self, spec: dict, image: Path | None = None) -> float:
        """How long a Restore call may take: runsc restore (its deadline scaled by the
        image's size, control/lifecycle/deadlines.py, as the engine scales it), the health
        check, the post-restore hooks (the stand-in's deadline; PrepareRestore tells it)."""
        hooks = sum(h.timeout_s + 5 for h in profiles.for_spec(spec).hooks("post_restore"))
        runsc_s = deadlines.for_restore(self.s, image).seconds if image is not None else self.s.runsc_timeout_s
        return runsc_s + self.s.thawd_health_timeout_s + hooks + 5.0

    def prepare_spec(self, rt: RuntimeRef, spec: dict, *, visible_devices: bool = False) -> None:
        """What thaw adds to an opted-in container's config.json at its create, cold or
        restored alike. Its workload profile's environment (thaw.dev/profile:
        control/lifecycle/profiles.py; vLLM's loopback host IP, spawned workers and
        IPC path, so that a user sets none of it). A GPU container gets the CUDA
        checkpoint helper mounted at its fixed path: runsc runs it inside the sandbox at
        checkpoint and restore, and restore validation wants the same mounts
        as at checkpoint. The shim's original config.json is kept beside it
        (the stand-in puts it back when a lone container falls back to a cold start).

        `visible_devices` (a pod's container): GPUs the NVIDIA device plugin named
        in NVIDIA_VISIBLE_DEVICES (its default "envvar" strategy, which only the
        NVIDIA container runtime turns into devices) are injected first, through
        this node's CDI registry (nvproxy/cdi.py visible_devices). `spec` is
        changed in place, as config.json is. ThawError (a value that names no GPU of
        this node) before anything is written."""
        names = cdi.visible_devices(spec) if visible_devices else []
        profile = profiles.for_spec(spec)
        env = list((spec.get("process") or {}).get("env") or [])
        with_env = profiles.apply_env(spec, profile)
        changed = with_env["process"]["env"] != env
        if changed:
            spec["process"] = with_env["process"]
        if names:
            dev = self._devices()
            injected = cdi.inject(spec, dev.registry, names, dev.stat)
            spec.clear()
            spec.update(injected)
            changed = True
        if cudamod.uses_gpu(spec):   # staged only where a GPU asks: a CPU node need not have the helper
            changed = cudamod.mount_helper(spec, cudamod.stage_for(self.s)) or changed
        if not changed:
            return
        orig = rt.bundle / ORIG_CONFIG
        if not orig.exists():
            shutil.copy2(rt.bundle / "config.json", orig)
        specmod.Bundle(rt.bundle).write(spec)

    def _devices(self):
        """This node's GPUs and CDI devices, asked once (NVML, the CDI directories)."""
        with self._lock:
            if self._node_devices is None:
                from control.lifecycle import gpus as gpumod
                self._node_devices = gpumod.node_devices()
            return self._node_devices

    # -- one pull per key ------------------------------------------------------------

    def _fetch(self, key: str) -> Future:
        """One pull per key however many ask; the pull goes on past a caller's deadline."""
        with self._lock:
            fut = self._fetches.get(key)
            new = fut is None or fut.done()
            if new:
                fut = self._pool.submit(self.images.pull, key)
                self._fetches[key] = fut
        if new:
            # Outside the lock: a future that is already done runs the
            # callback right here, and the callback takes the lock.
            fut.add_done_callback(lambda f, k=key: self._fetch_done(k, f))
        return fut

    def _fetch_done(self, key: str, fut: Future) -> None:
        with self._lock:
            if self._fetches.get(key) is fut:
                del self._fetches[key]
        # A lease nobody took (the caller timed out) must not pin the entry.
        if not fut.cancelled() and fut.exception() is None:
            lease = fut.result()
            if not self.containers.holds(lease):
                threading.Timer(1.0, self._release_if_untaken, args=(lease,)).start()

    def _release_if_untaken(self, lease) -> None:
        if not self.containers.holds(lease):
            lease.release()
