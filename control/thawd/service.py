"""thawd's logic: decide restore vs cold, check health, record outcomes,
checkpoint automatically, quarantine images that keep failing.

`Thawd` holds the logic and is testable without gRPC; `ThawdServicer`
(control/daemon.py) adapts it to the generated gRPC service and converts
errors once. Every request field is validated here, at the edge.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from control.lifecycle import workload as workloadmod
from control.config import Settings
from control.errors import NotFound, ThawError, UserError
from control.thawd.metrics import Metrics
from control.thawd.quarantine import Quarantine
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import CheckpointOptions, GlobalOptions, Runsc

log = logging.getLogger("thawd")

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,255}$")
# The shim's config.json as it was before thawd rewrote it. Twin:
# go/internal/standin/standin.go origConfigName.
ORIG_CONFIG = "config.json.thaw-orig"
# Installed beside runsc (build/ or <node.install_dir>/bin). Twin: control/provision.py CUDA_HELPER.
CUDA_HELPER_BINARY = "thaw-cuda-checkpoint"


def uses_gpu(spec: dict) -> bool:
    """nvproxy is on for specs listing /dev/nvidiactl (docs/gvisor-facts.md)."""
    return any(d.get("path") == "/dev/nvidiactl" for d in (spec.get("linux") or {}).get("devices") or [])


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

    def runsc(self, binary: Path, timeout_s: float) -> Runsc:
        # The shim's own flags, verbatim: restore and checkpoint need the
        # same global flags as the run (docs/gvisor-facts.md).
        flags = self.global_flags
        if not any(f.lstrip("-").split("=")[0] == "root" for f in flags):
            flags = (f"--root={self.runsc_root}", *flags)
        return Runsc(binary, GlobalOptions(root=self.runsc_root, extra=flags, verbatim=True), timeout_s)


@dataclass
class Decision:
    restore: bool
    reason: str
    key: str = ""
    image_path: str = ""
    lease_id: str = ""
    background: bool = False


class Thawd:
    def __init__(self, settings: Settings, images, metrics: Metrics | None = None) -> None:
        """`images` is the image source (control/images.py adapter: pull/publish/evict/entries)."""
        self.s = settings
        self.images = images
        self.metrics = metrics or Metrics()
        self.state_dir = settings.state_dir / "thawd"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._leases: dict[tuple[str, str], object] = {}        # (root, id) -> lease
        self._fetches: dict[str, Future] = {}                    # key -> background pull
        self._checkpointing: set[str] = set()
        self.quarantine = Quarantine(settings)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="thawd")

    # -- quarantine ------------------------------------------------------------

    def quarantined(self) -> dict[str, str]:
        return self.quarantine.items()

    def unquarantine(self, key: str) -> bool:
        return self.quarantine.lift(key)

    # -- create ------------------------------------------------------------------

    def prepare_restore(self, rt: RuntimeRef) -> Decision:
        t0 = time.monotonic()
        d = self._decide(rt)
        self.metrics.observe("thaw_prepare_seconds", time.monotonic() - t0)
        if d.restore:
            self.metrics.inc("thaw_restore_decisions_total")
        else:
            self.metrics.inc("thaw_cold_decisions_total", reason=d.reason.split(":")[0])
        log.info("prepare %s key=%s -> %s %s", rt.container_id, d.key, "restore" if d.restore else "cold", d.reason)
        return d

    def _decide(self, rt: RuntimeRef) -> Decision:
        spec = specmod.Bundle(rt.bundle).load()
        wl = workloadmod.from_spec(spec)
        if wl is None:
            return Decision(False, "not-opted-in")
        self._prepare_gpu_spec(rt, spec)
        why = self.quarantine.reason(wl.key)
        if why is not None:
            return Decision(False, f"quarantined: {why}", wl.key)
        fut = self._fetch(wl.key)
        try:
            lease = fut.result(timeout=self.s.thawd_prepare_timeout_s)
        except TimeoutError:
            return Decision(False, "fetch-in-progress: the image is still being fetched", wl.key)
        except NotFound:
            return Decision(False, "no-image", wl.key)
        except ThawError as e:
            reason = "tuple-mismatch" if type(e).__name__ == "TupleMismatch" else "fetch-failed"
            return Decision(False, f"{reason}: {e}", wl.key)
        lease_id = uuid.uuid4().hex
        k = (str(rt.runsc_root), rt.container_id)
        with self._lock:  # claim the fetched lease, unless another container already did
            shared = any(v is lease for v in self._leases.values())
            if not shared:
                old = self._leases.pop(k, None)
                self._leases[k] = lease
        if shared:
            # The entry is local now: this pull is a cache hit with its own lease.
            try:
                lease = self.images.pull(wl.key)
            except ThawError as e:
                return Decision(False, f"fetch-failed: {e}", wl.key)
            with self._lock:
                old = self._leases.pop(k, None)
                self._leases[k] = lease
        if old is not None:
            old.release()
        self.metrics.inc("thaw_cache_hits_total" if getattr(lease, "hit", True) else "thaw_cache_misses_total")
        return Decision(True, "image-ready", wl.key, str(lease.path), lease_id, self.s.restore_background)

    def _prepare_gpu_spec(self, rt: RuntimeRef, spec: dict) -> None:
        """A GPU container gets the CUDA checkpoint helper mounted at its fixed
        path, cold or restored alike: runsc runs it inside the sandbox at
        checkpoint and restore, and restore validation wants the same mounts
        as at checkpoint. The shim's original config.json is kept beside it
        (the stand-in puts it back when it falls back to a cold start)."""
        if not uses_gpu(spec):
            return
        from nvproxy import helper
        before = json.dumps(spec.get("mounts", []), sort_keys=True)
        helper.add_to_spec(spec, self._helper_dir())
        if json.dumps(spec["mounts"], sort_keys=True) == before:
            return
        orig = rt.bundle / ORIG_CONFIG
        if not orig.exists():
            shutil.copy2(rt.bundle / "config.json", orig)
        specmod.Bundle(rt.bundle).write(spec)

    def _helper_dir(self) -> Path:
        """The host directory holding the staged helper (staged once per thawd)."""
        from nvproxy import helper
        d = self.state_dir / "cuda-helper"
        if not (d / helper.HELPER_NAME).is_file():
            helper.stage(self.s.runsc_path.parent / CUDA_HELPER_BINARY, d)
        return d

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
            with self._lock:
                taken = any(v is lease for v in self._leases.values())
            if not taken:
                threading.Timer(1.0, self._release_if_untaken, args=(lease,)).start()

    def _release_if_untaken(self, lease) -> None:
        with self._lock:
            if any(v is lease for v in self._leases.values()):
                return
        lease.release()

    # -- start -----------------------------------------------------------------

    def _run_hooks(self, spec: dict, r: Runsc, cid: str, phase: str) -> None:
        """The workload profile's hooks (thaw.dev/profile), run inside the sandbox:
        thawd does not know a containerd sandbox's address, so HTTP hooks go to
        the sandbox's own loopback from a python3 it runs there."""
        from control.lifecycle import profiles
        profile = profiles.for_spec(spec)
        if not profile.hooks(phase):
            return
        records = profiles.run_hooks(profile, phase, profiles.Target(
            exec_in_sandbox=profiles.runsc_exec(r, cid), http_via_exec=True))
        log.info("%s hooks of %s (%s): %s", phase, cid, profile.name, records)

    def check_health(self, rt: RuntimeRef, key: str) -> tuple[bool, str, float]:
        t0 = time.monotonic()
        spec = specmod.Bundle(rt.bundle).load()
        wl = workloadmod.from_spec(spec)
        probe = wl.health if wl else workloadmod.Probe("delay", "0")
        ok, detail = self._probe(rt, probe, deadline_s=self.s.thawd_health_timeout_s)
        if ok:
            try:
                self._run_hooks(spec, rt.runsc(self.s.runsc_path, 60), rt.container_id, "post_restore")
            except ThawError as e:
                ok, detail = False, f"post-restore hook failed: {e}"
        dt = time.monotonic() - t0
        self.metrics.observe("thaw_health_seconds", dt)
        return ok, detail, dt

    def _probe(self, rt: RuntimeRef, probe: workloadmod.Probe, deadline_s: float) -> tuple[bool, str]:
        """A workload probe (thaw.dev/ready, thaw.dev/health) run by runsc_hooks/health.py's
        retry loop: the container must be running, then exec/file probes run in it."""
        from control.lifecycle import profiles
        from runsc_hooks import health
        r = rt.runsc(self.s.runsc_path, 30)
        if probe.kind == "delay":
            time.sleep(min(float(probe.arg), deadline_s))
        try:
            status = r.state(rt.container_id).status
            if status != "running":
                return False, f"container is {status}"  # it will not come back: do not wait
        except ThawError:
            pass  # the running probe below retries runsc state until the deadline

        def running() -> bool:
            try:
                return r.state(rt.container_id).status == "running"
            except ThawError:
                return False
        in_sandbox = profiles.runsc_exec(r, rt.container_id)

        def exec_in(argv: list[str], timeout_s: float) -> tuple[int, str]:
            try:
                return in_sandbox(argv, timeout_s)
            except ThawError as e:  # e.g. the container went away: a failed attempt, retried
                return -1, str(e)
        probes: list = [health.RunningProbe()]
        if probe.kind != "delay":
            cmd = probe.arg if probe.kind == "exec" else f"test -e {shlex.quote(probe.arg)}"
            probes.append(health.ExecProbe(("/bin/sh", "-c", cmd)))
        result = health.check(probes, health.Target(exec=exec_in, running=running),
                              health.Policy(timeout_s=deadline_s, attempt_timeout_s=deadline_s))
        return result.healthy, f"{probe.kind} probe: {result.summary()}"

    def report_outcome(self, rt: RuntimeRef, key: str, outcome: str, seconds: float, reason: str) -> None:
        log.info("outcome %s key=%s %s %.3fs %s", rt.container_id, key, outcome, seconds, reason)
        if outcome == "RESTORED":
            self.metrics.inc("thaw_restores_total")
            self.metrics.observe("thaw_restore_seconds", seconds)
            self.quarantine.succeeded(key)
        elif outcome == "RESTORE_FAILED":
            self.metrics.inc("thaw_fallbacks_total", reason=reason.split(":")[0])
            self._release(rt)
            if key and self.quarantine.failed(key, reason):
                self.metrics.inc("thaw_quarantined_total")
        elif outcome == "COLD_STARTED":
            self.metrics.inc("thaw_cold_starts_total")
            self._maybe_auto_checkpoint(rt, key)

    def _maybe_auto_checkpoint(self, rt: RuntimeRef, key: str) -> None:
        if not self.s.thawd_auto_checkpoint or not key or self.quarantine.reason(key) is not None:
            return
        try:
            if self.images.has(key):
                return
        except ThawError as e:
            log.warning("auto-checkpoint of %s skipped: cannot tell whether %s has an image (%s)",
                        rt.container_id, key, e)
            return
        with self._lock:
            if key in self._checkpointing:
                return
            self._checkpointing.add(key)
        self._pool.submit(self._auto_checkpoint, rt, key)

    def _auto_checkpoint(self, rt: RuntimeRef, key: str) -> None:
        try:
            wl = workloadmod.from_spec(specmod.Bundle(rt.bundle).load())
            ok, detail = self._probe(rt, wl.ready, deadline_s=self.s.thawd_ready_timeout_s)
            if not ok:
                log.warning("auto-checkpoint of %s skipped: never ready (%s)", rt.container_id, detail)
                self.metrics.inc("thaw_auto_checkpoints_total", result="not-ready")
                return
            res = self.checkpoint(rt, leave_running=self.s.thawd_leave_running)
            log.info("auto-checkpoint of %s published %s (%d bytes, %.2fs)", rt.container_id, key,
                     res["image_bytes"], res["seconds"])
            self.metrics.inc("thaw_auto_checkpoints_total", result="ok")
        except Exception as e:  # noqa: BLE001 - a failed auto-checkpoint must not hurt the container
            log.warning("auto-checkpoint of %s failed: %s", rt.container_id, e)
            self.metrics.inc("thaw_auto_checkpoints_total", result="error")
        finally:
            with self._lock:
                self._checkpointing.discard(key)

    # -- delete / explicit -------------------------------------------------------

    def release(self, container_id: str, runsc_root: str) -> bool:
        return self._release_key((runsc_root, container_id))

    def _release(self, rt: RuntimeRef) -> bool:
        return self._release_key((str(rt.runsc_root), rt.container_id))

    def _release_key(self, k: tuple[str, str]) -> bool:
        with self._lock:
            lease = self._leases.pop(k, None)
        if lease is None:
            return False
        lease.release()
        return True

    def checkpoint(self, rt: RuntimeRef, leave_running: bool = True) -> dict:
        spec = specmod.Bundle(rt.bundle).load()
        wl = workloadmod.from_spec(spec)
        if wl is None:
            raise UserError(f"container {rt.container_id} did not opt in (annotation {workloadmod.ANNOTATION_WORKLOAD})")
        r = rt.runsc(self.s.runsc_path, self.s.runsc_timeout_s)
        t0 = time.monotonic()
        # runsc writes the image straight into a partial directory of the node
        # cache; publishing chunks and uploads it from there and the cache adopts
        # the directory by rename: one copy of the image, hashed once.
        with self.images.staged(wl.key) as image:
            self._run_hooks(spec, r, rt.container_id, "pre_checkpoint")
            cuda = None
            if uses_gpu(spec):
                from nvproxy import helper
                cuda = helper.HELPER_PATH
            r.checkpoint(rt.container_id, CheckpointOptions(image_path=image.path, leave_running=leave_running,
                                                            compression=self.s.checkpoint_compression,
                                                            cuda_checkpoint_path=cuda))
            seconds = time.monotonic() - t0
            size = sum(p.stat().st_size for p in image.path.iterdir())
            published = self.images.publish(image)
        self.metrics.inc("thaw_checkpoints_total")
        self.metrics.observe("thaw_checkpoint_seconds", seconds)
        return {"workload_key": wl.key, "image_path": "", "image_bytes": size, "seconds": seconds,
                "published": published}

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
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            leases = list(self._leases.values())
            self._leases.clear()
        for lease in leases:
            lease.release()
