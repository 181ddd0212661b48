"""Parked sandboxes: restored ahead of demand, adopted by the next container of
their workload (config [park], off by default; docs/parking.md).

A restore under containerd pays, before the workload answers, `runsc restore`
until the CUDA helper runs (0.32-0.43 s on the H200), the helper's start, and
a CUDA restore that right after `runsc restore` runs 0.25-0.6 s slower than
the same step in a sandbox that has run since (the GPU restore journal,
docs/notes/2026-11-29-gpu-restore-journal.md, "Measured ... third session"). A
parked sandbox has paid all of that before any container
asked: thawd restored it from the node cache under an id of its own, waited
until every page was in, and toggled its CUDA processes back to checkpointed
(GPU memory free, the device state in host memory). When containerd's shim
creates a container of the same workload whose spec matches, thawd answers
ADOPT: the stand-in creates no sandbox, hands the container's stdio to the
sandbox's relay (go/cmd/thaw-relay), writes the shim's pid file and an alias in
the runsc root (go/internal/runscargv Alias) so that every runsc call the shim
makes for the container goes to the parked sandbox. At start, `wake` restores
the CUDA state of exactly the processes the park toggled, runs the workload's
health probe and post-restore hooks: that is all a request waits for.

What is parked: lone containers only (a Kubernetes pod's sandbox joins the
network namespace CNI made for it at RunPodSandbox, which does not exist ahead
of demand, and a runsc sandbox cannot move to another one), whose spec asks
for a new network namespace (no path: the parked sandbox gets its own, as the
container would) and no terminal. The template is the last container of the
workload key this node restored or checkpointed: its spec, its runsc root and
global flags, its image's layers (containerd's snapshot chain, for a root
filesystem of the same layers made through containerd's snapshotter by
thaw-ctrinfo rootfs-prepare). A new container adopts a parked sandbox only
when its runsc root, its global flags (less the per-container log paths) and
its spec (less its root path and cgroups path) equal the template's.

Costs, each bounded: host memory, the parked sandbox's memory file (about its
image's pages; `park.memory_budget_bytes` over all of them, the least recently
started workload's go first); the GPU for a few seconds while a park restores
the device state before checkpointing it again; one relay process each. An
adopted container keeps the parked sandbox's cgroup (the template's cgroup
parent, named after the parked id): its limits are the container's, since the
specs are equal, but its cgroup path is not the one containerd chose.

Records live in <state_dir>/thawd/parked/<id>/parked.json. A thawd that starts
removes every parked sandbox a previous thawd left; adopted ones belong to
their containers and are only released when containerd deletes them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path

from control.errors import ThawError
from control.files import write_json_atomic
from control.lifecycle import image_meta
from control.lifecycle.engine import Engine
from control.thawd.containers import Containers, RuntimeRef
from control.thawd.parked import (ADOPTED, ADOPTING, ALIAS_PREFIX, CLOSE_TIMEOUT_S, EXPIRE_EVERY_S, ID_PREFIX,
                                  NETNS_PREFIX, PARKABLE_STDIO, PARKED, PARKED_DIR, PARKING, RECORD, RELAY_BINARY,
                                  RELAY_READY_TIMEOUT_S, RUNSC_LOG, ParkError, Parked, Template, _kill_relay,
                                  _kill_sandbox_processes, _read_line, _unmount, cgroups_path, fingerprint, flag_set,
                                  host_memory, park_flags, parkable, spec_differences)
from nvproxy import cuda as cudamod
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import CreateOptions, GlobalOptions, RestoreOptions, Runsc, cgroup_dirs, remove_cgroups
from control.logfields import fields

log = logging.getLogger("thawd")


class Parking:
    def __init__(self, settings, state_dir: Path, containers: Containers, images, metrics, pool) -> None:
        """`containers`: the containerd door's records (an adopter's stdio and the parked
        sandbox it adopted live there); `images`: the image source (a park pulls from
        the node cache); `pool`: thawd's workers (a park job runs there)."""
        self.s = settings
        self.containers = containers
        self.images = images
        self.metrics = metrics
        self._pool = pool
        self.dir = state_dir / PARKED_DIR
        self._lock = threading.Lock()
        self._parked: dict[str, Parked] = {}      # parked id -> record
        self._templates: dict[str, Template] = {}
        self._filling: set[str] = set()             # keys a park job runs for
        self._leases: dict[str, object] = {}          # parked id -> its image's cache lease
        self._stop = threading.Event()
        self._expirer: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.s.park_enabled

    # -- start / stop -------------------------------------------------------------

    def recover(self) -> None:
        """At thawd's start: remove what a previous thawd parked and nobody adopted;
        keep the records of adopted ones (their containers still run, and their
        delete releases them)."""
        if not self.dir.is_dir():
            return
        for d in sorted(self.dir.iterdir()):
            try:
                p = Parked(**json.loads((d / RECORD).read_text()))
            except (OSError, ValueError, TypeError):
                log.warning("park: removing %s, which has no readable record", d)
                self._remove_dir(d, None)
                continue
            if p.state == ADOPTED and p.adopted_by and Path(p.root, ALIAS_PREFIX + p.adopted_by).is_symlink():
                with self._lock:
                    self._parked[p.id] = p
                self.containers.recover_adoption(RuntimeRef(p.adopted_by, Path(p.dir), Path(p.root), tuple(p.flags)),
                                                 p.id)
                log.info("park: %s still serves container %s", p.id, p.adopted_by)
                continue
            self._destroy(p, "left by a previous thawd")

    def start(self) -> None:
        if not self.enabled or self._expirer is not None:
            return
        self._expirer = threading.Thread(target=self._expire_loop, daemon=True, name="park-expire")
        self._expirer.start()

    def close(self) -> None:
        """thawd stops: parked sandboxes go (nothing would adopt them), adopted ones stay.
        All at once and bounded (CLOSE_TIMEOUT_S for containerd's part: a snapshot
        containerd cannot remove now stays recorded, and the next thawd's `recover`
        removes it)."""
        self._stop.set()
        with self._lock:
            victims = [p for p in self._parked.values() if p.state in (PARKED, PARKING)]
        threads = [threading.Thread(target=self._destroy, args=(p, "thawd stops"),
                                    kwargs={"timeout_s": CLOSE_TIMEOUT_S}, daemon=True) for p in victims]
        for th in threads:
            th.start()
        for th in threads:
            th.join(CLOSE_TIMEOUT_S + 10)

    # -- policy -------------------------------------------------------------------

    def note_start(self, rt: RuntimeRef, spec: dict, key: str, stdio: str) -> None:
        """A lone container of `key` started (restored, adopted or checkpointed after a
        cold start) with `stdio` (its kinds, Containers.stdio_of): remember it as the
        key's template and park more if wanted."""
        if not self.enabled or not key:
            return
        why = parkable(spec)
        if not why and not stdio:
            why = "its stdio is unknown (a stand-in that did not say)"
        elif not why and any(k not in PARKABLE_STDIO for k in stdio.split(",")):
            why = f"its stdio ({stdio}) is not /dev/null or pipes"
        if why:
            log.info("park: %s (%s) is not parked: %s", key, rt.container_id, why,
                 extra=fields(key=key, container=rt.container_id, decision="not-parked", reason=why))
            return
        now = time.time()
        with self._lock:
            tpl = self._templates.get(key)
        if tpl is None or tpl.root != str(rt.runsc_root) or fingerprint(tpl.spec) != fingerprint(spec) \
                or flag_set(tpl.flags) != flag_set(rt.global_flags) or tpl.stdio != stdio:
            try:
                info = self._layers(rt)
            except ThawError as e:
                log.warning("park: %s: cannot tell its image's layers: %s", key, e)
                return
            tpl = Template(key, str(rt.runsc_root), list(rt.global_flags), copy.deepcopy(spec), info["namespace"],
                           info["snapshotter"], info["snapshot_parent"], stdio=stdio)
        tpl.last_demand = now
        with self._lock:
            self._templates[key] = tpl
            if key in self._filling:
                return
            self._filling.add(key)
        self._pool.submit(self._fill, key)

    def _layers(self, rt: RuntimeRef) -> dict:
        from control.thawd import ctrinfo
        ns = ctrinfo.namespace_of(Path(rt.runsc_root), self.s.containerd_runsc_root)
        info = ctrinfo.lookup(self.s, ns, rt.container_id)
        if not info.get("snapshotter") or not info.get("snapshot_parent"):
            raise ParkError(f"containerd records no snapshotter or layers for {rt.container_id}")
        return {"namespace": ns, "snapshotter": info["snapshotter"], "snapshot_parent": info["snapshot_parent"]}

    def _count(self, key: str) -> int:
        return sum(1 for p in self._parked.values() if p.key == key and p.state in (PARKING, PARKED))

    def _fill(self, key: str) -> None:
        """Park sandboxes of `key` until it has park.per_key of them or the budget is spent."""
        try:
            while not self._stop.is_set():
                with self._lock:
                    tpl = self._templates.get(key)
                    if tpl is None or self._count(key) >= self.s.park_per_key:
                        return
                try:
                    self.park(tpl)
                except ThawError as e:
                    log.warning("park of %s failed: %s", key, e.message)
                    self.metrics.inc("thaw_parks_total", result="failed")
                    return
        except Exception:  # noqa: BLE001 - a background job: log it, keep thawd
            log.exception("park of %s", key)
        finally:
            with self._lock:
                self._filling.discard(key)

    def _make_room(self, tpl: Template, need: int) -> bool:
        """Free budget for `need` bytes by removing parked sandboxes of keys started
        less recently than tpl's; False when it cannot fit."""
        budget = self.s.park_memory_budget_bytes
        while True:
            with self._lock:
                used = sum(p.cost() for p in self._parked.values() if p.state in (PARKING, PARKED))
                if used + need <= budget:
                    return True
                older = [p for p in self._parked.values() if p.state == PARKED and p.key != tpl.key and
                         self._templates.get(p.key, tpl).last_demand < tpl.last_demand]
                if not older:
                    return False
                victim = min(older, key=lambda p: self._templates[p.key].last_demand)
                victim.state = "evicting"
            self._destroy(victim, f"its budget went to {tpl.key}, started more recently")
            self.metrics.inc("thaw_parked_evicted_total", reason="budget")

    # -- park ---------------------------------------------------------------------

    def park(self, tpl: Template) -> Parked:
        """Restore one sandbox of tpl ahead of demand: every page in, CUDA state
        checkpointed again. ParkError (or another ThawError) when it could not;
        then nothing of it is left."""
        t0 = time.monotonic()
        lease = self.images.pull(tpl.key)
        image = Path(lease.path)
        estimate = sum(f.stat().st_size for f in image.iterdir() if f.is_file())
        if not self._make_room(tpl, estimate):
            lease.release()
            self.metrics.inc("thaw_parks_total", result="no-budget")
            raise ParkError(f"{estimate} bytes do not fit park.memory_budget_bytes "
                            f"({self.s.park_memory_budget_bytes}) beside more recently started workloads")
        pid = ID_PREFIX + hashlib.sha256(tpl.key.encode()).hexdigest()[:8] + "-" + secrets.token_hex(4)
        lease.describe(f"parked sandbox {pid}")   # what `thaw evict` names when it refuses (issue 33)
        d = self.dir / pid
        d.mkdir(parents=True, mode=0o700)
        p = Parked(pid, tpl.key, tpl.root, list(tpl.flags), str(d), fingerprint(tpl.spec), estimate_bytes=estimate,
                   created=time.time(), snapshotter=tpl.snapshotter, namespace=tpl.namespace, stdio=tpl.stdio)
        with self._lock:
            self._parked[pid] = p
        self._save(p)
        relay = None
        try:
            from control.thawd import ctrinfo
            ctrinfo.rootfs_prepare(self.s, tpl.namespace, tpl.snapshotter, tpl.parent, d / "rootfs", pid)
            spec = copy.deepcopy(tpl.spec)
            spec["root"]["path"] = str(d / "rootfs")
            if specmod.netns_path(spec):      # loopback-only (parkable): one like it of its own
                from runsc_hooks import netns as netnsmod
                p.netns = NETNS_PREFIX + pid[len(ID_PREFIX):]
                self._save(p)
                spec = specmod.with_netns(spec, netnsmod.create_loopback(p.netns))
            if (spec.get("linux") or {}).get("cgroupsPath"):
                spec["linux"]["cgroupsPath"] = cgroups_path(spec["linux"]["cgroupsPath"], pid)
            specmod.Bundle(d).write(spec)
            why = image_meta.spec_mismatch(image, spec)
            if why:
                raise ParkError(f"the image does not restore into the template's spec: {why}")
            relay, stdio = self._start_relay(p)
            runsc = self.runsc(p)
            # A cache entry served through thaw-gofer (control/images/served.py) names it in env.
            opts = RestoreOptions(image_path=image, create=CreateOptions(bundle=d), detach=True,
                                  background=self.s.restore_background, env=tuple(lease.env().items()))
            try:
                runsc.restore(pid, opts, stdio=stdio)
            finally:
                for fd in stdio:
                    os.close(fd)
            runsc.wait(pid, restore=True)      # every page in; on a GPU the CUDA state is back
            p.pid = runsc.state(pid).pid
            helper = cudamod.helper_path(spec)
            if helper:
                try:
                    p.cuda_pids = cudamod.CudaProcesses(runsc, pid, helper).checkpoint_running(self.s.runsc_timeout_s)
                except ThawError as e:
                    raise ParkError(f"parking: {e.message}") from e
            p.host_bytes = host_memory(p.pid)["memfd_bytes"]
        except BaseException as e:
            with self._lock:
                p.state = "failed"
            self._destroy(p, f"park failed: {e}", relay=relay)
            lease.release()
            if isinstance(e, ThawError):
                raise
            if isinstance(e, Exception):
                raise ParkError(f"{type(e).__name__}: {e}") from e
            raise
        p.parked_s = round(time.monotonic() - t0, 3)
        with self._lock:
            p.state = PARKED
            self._leases[pid] = lease
        self._save(p)
        self.metrics.inc("thaw_parks_total", result="parked")
        self.metrics.observe("thaw_park_seconds", p.parked_s)
        log.info("park %s key=%s: parked in %.2fs, %d bytes of host memory, CUDA pids %s", pid, tpl.key,
                 p.parked_s, p.host_bytes, p.cuda_pids or "none",
                 extra=fields(parked=pid, key=tpl.key, decision="parked", duration_s=round(p.parked_s, 3),
                              bytes=p.host_bytes))
        self._gauges()
        return p

    def runsc(self, p: Parked) -> Runsc:
        flags = tuple(park_flags(p.flags, Path(p.dir)))
        if not any(f.lstrip("-").split("=")[0] == "root" for f in flags):
            flags = (f"--root={p.root}", *flags)
        return Runsc(self.s.runsc_path, GlobalOptions(root=Path(p.root), log_path=Path(p.dir) / RUNSC_LOG,
                                                      extra=flags, verbatim=True), self.s.runsc_timeout_s)

    def _start_relay(self, p: Parked) -> tuple[subprocess.Popen | None, tuple[int, int, int]]:
        """The parked sandbox's stdio, of p.stdio's kinds: /dev/null, or a pipe whose far
        end its stdio relay (go/cmd/thaw-relay) holds; returns the relay (None when
        nothing is a pipe) and the sandbox's ends (stdin, stdout, stderr)."""
        kinds = p.stdio.split(",")
        if "pipe" not in kinds:
            null_r = os.open(os.devnull, os.O_RDONLY)
            return None, (null_r, os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY))
        binary = self.s.runsc_path.parent / RELAY_BINARY
        if not binary.is_file():
            raise ParkError(f"{RELAY_BINARY} not found beside runsc ({binary})")
        in_r, in_w = os.pipe() if kinds[0] == "pipe" else (os.open(os.devnull, os.O_RDONLY), -1)
        out_r, out_w = os.pipe() if kinds[1] == "pipe" else (-1, os.open(os.devnull, os.O_WRONLY))
        err_r, err_w = os.pipe() if kinds[2] == "pipe" else (-1, os.open(os.devnull, os.O_WRONLY))
        # Beside thawd's socket (a root-only directory), not in the parked directory: a
        # Unix socket's path has at most 107 bytes (sun_path), and state_dir can be deep.
        sock = str(self.s.thawd_socket.parent / f"{p.id}.relay.sock")
        try:
            relay = subprocess.Popen(
                [str(binary), "-socket", sock, "-stdin-fd", str(in_w), "-stdout-fd", str(out_r),
                 "-stderr-fd", str(err_r)],
                pass_fds=tuple(fd for fd in (in_w, out_r, err_r) if fd >= 0), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=open(Path(p.dir) / "relay.log", "ab"), start_new_session=True)
        except OSError as e:
            for fd in (in_r, in_w, out_r, out_w, err_r, err_w):
                if fd >= 0:
                    os.close(fd)
            raise ParkError(f"starting {binary}: {e}") from e
        for fd in (in_w, out_r, err_r):
            if fd >= 0:
                os.close(fd)
        line = _read_line(relay.stdout, RELAY_READY_TIMEOUT_S)
        if line != "ready":
            relay.kill()
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            raise ParkError(f"{RELAY_BINARY} did not get ready (it said {line!r}; see {p.dir}/relay.log)")
        p.relay_pid, p.relay_socket = relay.pid, sock
        return relay, (in_r, out_w, err_w)

    # -- adopt --------------------------------------------------------------------

    def take(self, rt: RuntimeRef, spec: dict, key: str, stdio: str) -> Parked | None:
        """A parked sandbox container `rt` (with `spec`, of `key`, whose stdio kinds are
        `stdio`) may adopt, now promised to it; None when there is none that matches.
        The container's record (Containers.decide ADOPT) names the one it took."""
        if not self.enabled or parkable(spec):
            return None
        fp = fingerprint(spec)
        flags = flag_set(rt.global_flags)
        self._drop_dead(key)
        with self._lock:
            for p in sorted(self._parked.values(), key=lambda p: p.created):
                if p.state == PARKED and p.key == key and p.root == str(rt.runsc_root) and p.fingerprint == fp \
                        and flag_set(p.flags) == flags and p.stdio == stdio:
                    p.state, p.adopted_by = ADOPTING, rt.container_id
                    break
            else:
                same_key = [p for p in self._parked.values() if p.state == PARKED and p.key == key]
                if same_key:
                    self._why_not(same_key[0], rt, spec, fp, flags, stdio)
                return None
        self._save(p)
        self._gauges()
        return p

    def _why_not(self, p: Parked, rt: RuntimeRef, spec: dict, fp: str, flags: list[str], stdio: str) -> None:
        """Log why container `rt` did not adopt parked sandbox `p` of its key."""
        why = []
        if p.root != str(rt.runsc_root):
            why.append(f"runsc root {rt.runsc_root} vs {p.root}")
        if flag_set(p.flags) != flags:
            why.append(f"global flags {flags} vs {flag_set(p.flags)}")
        if p.stdio != stdio:
            why.append(f"stdio {stdio or 'unknown'} vs {p.stdio}")
        if p.fingerprint != fp:
            try:
                parked_spec = specmod.Bundle(Path(p.dir)).load()
                why.append("spec: " + "; ".join(spec_differences(spec, parked_spec)))
            except Exception as e:  # noqa: BLE001 - only a log line
                why.append(f"spec (the parked one unreadable: {e})")
        log.info("park: %s restores instead of adopting %s: %s", rt.container_id, p.id, "; ".join(why),
                 extra=fields(container=rt.container_id, parked=p.id, decision="not-adopted", reason="; ".join(why)))

    def _drop_dead(self, key: str) -> None:
        """Parked sandboxes of `key` whose sandbox process is gone (the workload exited or
        was killed while parked) are removed before one is handed out."""
        with self._lock:
            dead = [p for p in self._parked.values() if p.key == key and p.state == PARKED and
                    not Path(f"/proc/{p.pid}").exists()]
            for p in dead:
                p.state = "dead"
        for p in dead:
            self._destroy(p, "its sandbox process is gone")
            self.metrics.inc("thaw_parked_evicted_total", reason="dead")

    def lease_of(self, p: Parked):
        with self._lock:
            return self._leases.pop(p.id, None)

    def get(self, parked_id: str) -> Parked | None:
        """The parked sandbox `parked_id` ("" names none)."""
        with self._lock:
            return self._parked.get(parked_id) if parked_id else None

    def wake(self, p: Parked, rt: RuntimeRef, probes: list) -> tuple[float, float, object, list]:
        """start of the container that adopted `p`: its CUDA processes back (each
        with the helper, at once), the health probe, the post-restore hooks.
        Returns (cuda seconds, total seconds, health result, hook records).
        Raises on failure; the caller removes the sandbox (`discard`)."""
        from control.errors import UnhealthyRestore
        t0 = time.monotonic()
        runsc = self.runsc(p)
        spec = specmod.Bundle(Path(p.dir)).load()
        h = self.handle(p)
        helper = cudamod.helper_path(spec) if p.cuda_pids else None
        if helper:
            errors = cudamod.CudaProcesses(runsc, p.id, helper).restore(p.cuda_pids, self.s.runsc_timeout_s)
            if errors:
                raise UnhealthyRestore(p.id, p.dir, {}, "CUDA state did not come back: " + "; ".join(errors))
        cuda_s = time.monotonic() - t0
        engine = Engine(self.s)
        health = engine.check(h, probes) if (probes and self.s.thawd_health_check) else None
        if health is not None and not health.healthy:
            raise UnhealthyRestore(p.id, p.dir, health.to_dict(), health.summary())
        hooks = engine.hooks(h, spec, "post_restore")
        with self._lock:
            p.state = ADOPTED
        self._save(p)
        return cuda_s, time.monotonic() - t0, health, hooks

    def handle(self, p: Parked):
        from control.lifecycle.engine import Handle
        return Handle(p.id, self.runsc(p), Path(p.dir), mark=self.s.network_probe_mark)

    def release(self, parked_id: str, container_id: str) -> bool:
        """The container that adopted parked sandbox `parked_id` was deleted (runsc
        deleted the sandbox) or its restore failed: its root filesystem, relay and
        record go. True when it was still there."""
        p = self.get(parked_id)
        if p is None:
            return False
        self._destroy(p, f"container {container_id} was deleted")
        return True

    def discard(self, p: Parked, why: str) -> None:
        """A parked sandbox that will not be used (its adoption failed): removed."""
        self._destroy(p, why)

    # -- teardown -----------------------------------------------------------------

    def _destroy(self, p: Parked, why: str, relay: subprocess.Popen | None = None,
                 timeout_s: float | None = None) -> None:
        log.info("park %s key=%s removed: %s", p.id, p.key, why,
                 extra=fields(parked=p.id, key=p.key, decision="unparked", reason=why))
        runsc = self.runsc(p)
        try:
            if runsc.exists(p.id):
                runsc.delete(p.id, force=True)
        except ThawError as e:
            log.warning("park %s: runsc delete: %s", p.id, e)
        # A sandbox runsc no longer knows (its root's state gone: /run cleared, the root
        # removed) still runs and holds its memory: its processes go by name.
        killed = _kill_sandbox_processes(p.root, p.id)
        if killed:
            log.info("park %s: killed sandbox processes %s that runsc no longer knew", p.id, killed)
        # runsc removes the cgroups it made at its delete; not those of a sandbox it no
        # longer knew (killed by name above), which would stay on the node for good.
        try:
            cg = (specmod.Bundle(Path(p.dir)).load().get("linux") or {}).get("cgroupsPath", "")
        except (ThawError, OSError):
            cg = ""
        removed, left = remove_cgroups(cgroup_dirs(cg), wait_s=2.0 if killed else 0.0)
        if removed or left:
            log.info("park %s: cgroups removed %s, left %s", p.id, removed, left)
        if p.adopted_by:
            try:
                os.unlink(Path(p.root) / (ALIAS_PREFIX + p.adopted_by))
            except OSError:
                pass
        if relay is not None:
            relay.kill()
            relay.wait(timeout=5)
        elif p.relay_pid:
            _kill_relay(p.relay_pid, p.relay_socket)
        if p.netns:
            from runsc_hooks import netns as netnsmod
            try:
                netnsmod.remove(p.netns)
            except Exception as e:  # noqa: BLE001 - a namespace file left: logged, nothing else holds it
                log.warning("park %s: network namespace %s stays: %s", p.id, p.netns, e)
        with self._lock:
            self._parked.pop(p.id, None)
            lease = self._leases.pop(p.id, None)
        if lease is not None:
            lease.release()
        self._remove_dir(Path(p.dir), p, timeout_s)
        self._gauges()

    def _remove_dir(self, d: Path, p: Parked | None, timeout_s: float | None = None) -> None:
        """The parked directory, after its root filesystem's snapshot (containerd's). When
        containerd cannot remove the snapshot now, the mount goes and the record stays
        (state "removing"): the next `recover` asks containerd again."""
        if p is not None and p.snapshotter:
            from control.thawd import ctrinfo
            try:
                ctrinfo.rootfs_remove(self.s, p.namespace, p.snapshotter, d / "rootfs", p.id, timeout_s=timeout_s)
            except ThawError as e:
                log.warning("park %s: its root filesystem's snapshot stays until thawd's next start: %s", p.id, e)
                _unmount(d / "rootfs")
                p.state = "removing"
                self._save(p)
                return
        elif (d / "rootfs").is_dir() and os.path.ismount(d / "rootfs"):
            log.warning("park: %s is still mounted and has no record naming its snapshot; left", d / "rootfs")
            return
        shutil.rmtree(d, ignore_errors=True)

    def _save(self, p: Parked) -> None:
        if Path(p.dir).is_dir():
            write_json_atomic(Path(p.dir) / RECORD, asdict(p))

    # -- expiry -------------------------------------------------------------------

    def _expire_loop(self) -> None:
        while not self._stop.wait(EXPIRE_EVERY_S):
            self.expire()

    def expire(self, now: float | None = None) -> list[str]:
        """Remove parked sandboxes whose workload has not started for park.idle_s."""
        now = time.time() if now is None else now
        with self._lock:
            idle = [p for p in self._parked.values() if p.state == PARKED and
                    now - max(p.created, self._templates.get(p.key, Template(p.key, "", [], {}, "", "", "")).
                              last_demand) > self.s.park_idle_s]
            for p in idle:
                p.state = "expiring"
        for p in idle:
            self._destroy(p, f"its workload was not started for {self.s.park_idle_s:g} s (park.idle_s)")
            self.metrics.inc("thaw_parked_evicted_total", reason="idle")
        return [p.id for p in idle]

    def _gauges(self) -> None:
        with self._lock:
            live = [p for p in self._parked.values() if p.state in (PARKING, PARKED)]
        self.metrics.set("thaw_parked", len(live))
        self.metrics.set("thaw_parked_host_bytes", sum(p.cost() for p in live))

    def stats(self) -> list[dict]:
        with self._lock:
            return [{"id": p.id, "key": p.key, "state": p.state, "host_bytes": p.host_bytes,
                     "parked_s": p.parked_s, "adopted_by": p.adopted_by} for p in self._parked.values()]
