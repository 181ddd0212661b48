"""Sandboxes thaw runs directly: run, checkpoint, restore, list, delete.

The lifecycle is an explicit state enum with one transition table; asking for
an illegal transition is a user error (InvalidTransition), and every
operation that fails half-way undoes what it did (runsc container, netns,
bundle, record), so a failed restore leaves nothing behind.

Records (their states, ids and address leases: control/lifecycle/records.py)
live in <state_dir>/sandboxes/<id>.json, bundles in <state_dir>/bundles/<id>/.
A checkpoint image is a directory holding runsc's files plus `thaw.json`
(control/lifecycle/image_meta.py: the spec, the sandbox address, published
ports, health probes, file sizes, timings); it is written under a `.partial-`
name and renamed into place last.

Network on checkpoint and restore (docs/network.md): the sandbox's ingress
gate is closed from before `runsc checkpoint` until the image is written; a
restore closes the gate before plumbing, reuses the checkpoint's sandbox
address, restores, runs the health check through the closed gate and only
then opens it. An unhealthy restore is removed and raises UnhealthyRestore;
`warm_start` turns that (and any other restore failure) into a cold start.

A record in a transitional state (created, restoring, checkpointing) names
its owner process; `recover` removes what an owner that died (kill -9) left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Callable

from control.config import Settings
from control.files import Owner, fsync_path, untrusted
from control.lifecycle import gpus as gpumod
from control.lifecycle import image_meta as metamod
from control.lifecycle.records import (TRANSITIONAL, CheckpointResult, Mitigations, Record, Records,  # noqa: F401
                                       RestoreResult, StartResult, State, check_transition, runsc_id, sandbox_id,
                                       validate_id)
from control.lifecycle import logs as logsmod
from control.lifecycle import profiles
from control.lifecycle import recovery
from control.lifecycle import status as statusmod
from control.lifecycle.engine import Engine, Handle, status as engine_status
from nvproxy.cuda import stage_for, uses_gpu
from control.errors import (AlreadyExists, CheckpointFailed, ImageError, InUse, InvalidTransition, NotFound,
                            PreconditionError, ThawError, TupleMismatch, UnhealthyRestore, UserError)
from runsc_hooks import gate as gatemod
from runsc_hooks import probe as probemod
from runsc_hooks import network as netmod
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import CreateOptions, GlobalOptions, RestoreOptions, Runsc
from control.logfields import fields

log = logging.getLogger(__name__)


class Sandboxes:
    """thaw's own sandboxes on this node (one runsc root, one state dir)."""

    def __init__(self, settings: Settings, debug_log: bool = False) -> None:
        self.settings = settings
        self.records = Records(settings)
        self.records_dir = self.records.dir
        self.bundles_dir = settings.state_dir / "bundles"
        self.debug_log = debug_log
        # This node's GPUs and CDI devices, asked only when a sandbox or an
        # image uses GPUs (NVML and the CDI directories: unit tests replace it).
        self.devices: Callable[[], gpumod.Devices] = gpumod.node_devices

    # -- plumbing --------------------------------------------------------------

    def runsc(self, network: str = "sandbox", nvproxy: bool = False) -> Runsc:
        s = self.settings
        if os.geteuid() != 0:
            raise PreconditionError("thaw needs root: runsc refuses create and restore with --rootless")
        if not s.runsc_available:
            raise PreconditionError(f"runsc not found at {s.runsc_path}: run `make setup` or set "
                                    "runsc.path / THAW_RUNSC_PATH", path=str(s.runsc_path))
        opts = GlobalOptions(root=s.runsc_root, platform=s.runsc_platform, network=network, nvproxy=nvproxy,
                             debug_log=(s.log_dir / "%ID%" / "%COMMAND%.log") if self.debug_log else None,
                             extra=s.runsc_flags)
        return Runsc(s.runsc_path, opts, s.runsc_timeout_s)

    def _record_path(self, sid: str) -> Path:
        return self.records.path(sid)

    def get(self, sid: str, reap: bool = True) -> Record | None:
        """Sandbox `sid`'s record. With `reap`, one a thaw process that died left in a
        transitional state is settled first (_reap), so it is never seen half-made."""
        rec = self.records.get(sid)
        return self._reap(rec) if reap and rec is not None else rec

    def _reap(self, rec: Record) -> Record | None:
        return recovery.reap(self, rec)

    def recover(self, orphans: bool = False, prefix: str = "") -> list[dict]:
        return recovery.recover(self, orphans, prefix)

    def _save(self, rec: Record) -> None:
        self.records.save(rec)

    def _move(self, rec: Record, wanted: State) -> None:
        self.records.move(rec, wanted)

    def _claim_net(self, rec: Record, ports: tuple[netmod.Port, ...], address: tuple[str, str, int] | None = None,
                   stable: bool = False, avoid: frozenset[str] = frozenset()) -> tuple[str, str, int]:
        return self.records.claim_net(rec, ports, address, stable, avoid)

    def _plumb(self, sid: str, host_ip: str, sandbox_ip: str, prefixlen: int,
               ports: tuple[netmod.Port, ...]) -> netmod.SandboxNet:
        s = self.settings
        return netmod.plumb(sid, host_ip, sandbox_ip, prefixlen, subnet=s.network_subnet, ports=ports,
                            publish_address=s.network_publish_address, egress=s.network_egress)

    def list_records(self, reap: bool = True) -> list[Record]:
        """Every record; with `reap`, those a dead owner left half-made settled first (_reap)."""
        recs = self.records.list()
        return [x for x in (self._reap(r) for r in recs) if x is not None] if reap else recs

    # -- operations -------------------------------------------------------------

    def handle(self, rec: Record, r: Runsc | None = None) -> Handle:
        """The engine's view of sandbox `rec`: exact runsc id, bundle, address, gate."""
        r = r or self.runsc("sandbox" if rec.net else "none", rec.nvproxy)
        logs = logsmod.SandboxLogs.of(self.settings, rec.id)
        return Handle(runsc_id(rec.id), r, Path(rec.bundle), address=(rec.net or {}).get("sandbox_ip"),
                      gate=rec.id if rec.net else None, mark=self.settings.network_probe_mark,
                      exited=lambda: logs.exit() is not None)

    def _logged(self, r: Runsc, sid: str) -> Runsc:
        """`r` with runsc's own errors in the sandbox's runsc.log (--log, JSON): for
        create and restore, whose stderr is the workload's log pipe."""
        path = logsmod.SandboxLogs.of(self.settings, sid).runsc_log
        return Runsc(r.binary, dataclasses.replace(r.options, log_path=path), r.timeout_s)

    def run(self, sid: str, spec: dict, network: bool = True, nvproxy: bool = False, probes: tuple = (),
            ports: tuple[netmod.Port, ...] = (), address: tuple[str, str, int] | None = None,
            gpus: tuple[str, ...] = ()) -> Record:
        """Create and start a sandbox from `spec` (its netns is replaced by thaw's).

        `probes` (text or Probe) are the workload's health check, kept for its
        checkpoints' restores; `ports` are published on the node. `gpus` (CDI
        device names, control/lifecycle/gpus.py parse_request) and the spec's
        own `cdi.k8s.io/*` requests are injected from this node's CDI registry;
        a GPU spec gets the CUDA checkpoint helper and runs with nvproxy.
        """
        validate_id(sid)
        specmod.validate(spec)
        from nvproxy import cdi
        names = list(dict.fromkeys([*gpus, *cdi.requested_devices(spec)]))
        if names:
            spec = gpumod.inject(spec, names, self.devices(), stage_for(self.settings))
        elif uses_gpu(spec):  # a hand-written GPU spec (--bundle): the helper follows from it
            spec = gpumod.with_helper(spec, stage_for(self.settings))
        # The workload profile's environment (thaw.dev/profile), as under thawd (prepare.py).
        spec = profiles.apply_env(spec, profiles.for_spec(spec))
        return self._run_spec(sid, spec, network, nvproxy or uses_gpu(spec), probes, ports, address)

    def _run_spec(self, sid: str, spec: dict, network: bool, nvproxy: bool, probes: tuple,
                  ports: tuple[netmod.Port, ...], address: tuple[str, str, int] | None) -> Record:
        """run() of a spec whose devices are in place already."""
        probe_texts = [str(p) for p in probemod.parse_all(probes)]
        ports = tuple(ports)
        if ports and not network:
            raise UserError("published ports need the sandbox network (--network)")
        r = self.runsc("sandbox" if network else "none", nvproxy)
        if self.get(sid) is not None or r.exists(runsc_id(sid)):
            raise AlreadyExists("sandbox", sid, "delete it first or pick another id")
        with self.records.net_lock():  # fail before anything is made; _claim_net checks again, leasing
            self.records.check_ports_locked(ports, [q for q in self.list_records() if q.net and q.id != sid])
        check_transition(sid, None, State.CREATED)
        bundle = specmod.Bundle(self.bundles_dir / sid)
        rec = Record(id=sid, state=State.CREATED, bundle=str(bundle.path), probes=probe_texts,
                     owner=Owner.me().to_dict(), gpus=metamod.injected_devices(spec), nvproxy=nvproxy)
        mon = None
        try:
            self._save(rec)  # first: whatever a crash leaves from here on, `recover` finds by this record
            net = None
            if network:
                net = self._plumb(sid, *self._claim_net(rec, ports, address), ports)
                rec.net = net.to_dict()
                self._save(rec)
            bundle.write(specmod.with_netns(spec, net.netns_path if net else None))
            mon = logsmod.Monitor(self.settings, sid, r.argv("wait", runsc_id(sid)))
            rec.monitor = mon.to_dict()
            self._save(rec)
            try:
                self._logged(r, sid).create(runsc_id(sid), CreateOptions(bundle=bundle.path,
                                                                         pid_file=bundle.path / "init.pid"),
                                            stdio=mon.stdio)
            finally:
                mon.created()
            r.start(runsc_id(sid))
            mon.started()
            rec.owner = None
            self._move(rec, State.RUNNING)
        except BaseException:
            if mon is not None:
                mon.abandon()
            self._undo(r, rec)
            raise
        return rec

    def checkpoint(self, sid: str, out: Path, leave_running: bool = False,
                   mitigations: Mitigations = Mitigations()) -> CheckpointResult:
        """Save sandbox `sid` into the new directory `out` (atomically: all or nothing).

        The engine saves with the workload left running (GPU sandboxes with the
        CUDA helper), so a failed save never loses the workload: the record goes
        back to running and CheckpointFailed says so. Without `leave_running` the
        sandbox is removed only after the image is complete and renamed into place.
        """
        rec = self.require(sid)
        out = Path(out)
        if os.path.lexists(out):   # a dangling symbolic link too: it is someone's name
            raise AlreadyExists("image directory", str(out), "checkpoint writes a new directory")
        if not out.parent.is_dir():
            raise NotFound("directory", str(out.parent), "the image directory's parent must exist")
        if out.name in ("", ".", ".."):
            raise UserError(f"--out {out}: name a new directory", path=str(out))
        # The image is the workload's memory: written only where no other user can redirect it
        # or swap it (issue 30), into a directory born 0700 (runsc runs with umask 077).
        parent, why = untrusted(out.parent)
        if why:
            raise UserError(f"--out {out}: {why}; write images under a directory only root can change",
                            path=str(out))
        out = parent / out.name
        r = self.runsc("sandbox" if rec.net else "none", rec.nvproxy)
        st = _status(r, runsc_id(sid))
        if st != "running":
            raise UserError(f"sandbox {sid!r} is {st}, not running: nothing to checkpoint", id=sid)
        h = self.handle(rec, r)
        if not (rec.net and mitigations.gate):
            h = dataclasses.replace(h, gate=None)
        spec = h.spec()
        gpu_need = self._gpu_needs(spec)  # NVML before the save: what the image will say it needs
        from control.node import compat
        tup = compat.node_tuple(self.settings)   # the tuple travels with the image (issue 30)
        rec.owner = Owner.me().to_dict()
        self._move(rec, State.CHECKPOINTING)
        partial = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
        t0 = time.monotonic()
        try:
            saved = Engine(self.settings).checkpoint(h, partial, stays=leave_running)
            # Right after the save: lines the workload printed while runsc wrote the
            # image are in it, and so may come again from the restored process.
            logsmod.keep_log(logsmod.SandboxLogs.of(self.settings, sid), partial / metamod.IMAGE_LOG,
                             self.settings.log_max_bytes)
            metamod.write(partial, metamod.DOOR_CLI, spec, saved.files, gpu_need, saved.seconds, sandbox=sid,
                          net=rec.net, probes=rec.probes, runsc_version=r.version(),
                          platform=self.settings.runsc_platform, network="sandbox" if rec.net else "none",
                          nvproxy=rec.nvproxy or saved.gpu, rootfs=metamod.rootfs_layout(spec, self.settings),
                          **{compat.IMAGE_TUPLE: tup.to_dict()})
            fsync_path(partial)
            os.rename(partial, out)
            fsync_path(out.parent)
        except BaseException as e:
            shutil.rmtree(partial, ignore_errors=True)
            # The engine saved with --leave-running: the workload runs on unless it died by itself.
            rec.owner = None
            now = _status(r, runsc_id(sid))
            self._move(rec, State.RUNNING if now == "running" else State.STOPPED)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(e, CheckpointFailed):  # named by the user's id, not runsc's
                raise type(e)(sid, e.reason, now) from e.__cause__   # CheckpointNoSpace stays itself (exit 4)
            # The save worked but the image could not be completed (thaw.json on a full disk).
            why = f"{e.strerror or e} writing {Path(e.filename).name if e.filename else metamod.IMAGE_META}" \
                if isinstance(e, OSError) else \
                (e.message if isinstance(e, ThawError) else f"{type(e).__name__}: {e}")
            raise CheckpointFailed(sid, why, now) from e
        rec.owner = None
        self._move(rec, State.RUNNING)
        dropped = saved.gate_dropped
        if not leave_running:
            # Only now, with the image complete and in place, does the workload go.
            if h.gate is not None:
                gatemod.close(sid, self.settings.network_probe_mark, "checkpointed; stopping")
            self._move(rec, State.STOPPED)
            self.delete(sid, force=True)
        return CheckpointResult(out, saved.seconds, saved.bytes, time.monotonic() - t0 if h.gate else None, dropped)

    def restore(self, image: Path, sid: str, probes: list | None = None,
                mitigations: Mitigations = Mitigations(), policy: probemod.Policy | None = None,
                gpus: list[str] | None = None, runsc_env: tuple[tuple[str, str], ...] = (),
                background: bool | None = None, source: Path | None = None, settle: bool = True) -> RestoreResult:
        """Restore the image directory `image` as a new sandbox `sid`.

        With the gate closed: plumb the checkpoint's address, `runsc restore`,
        health check (`probes`, default: the image's); then open the gate. An
        unhealthy restore is removed and raises UnhealthyRestore. A GPU image
        gets `gpus` (CDI names), or the GPU indexes it was saved on, re-injected
        and checked against what it needs before runsc runs (gpus.py). `runsc_env`
        and `background` (default: checkpoint.restore_background) are for a
        streamed image (control/images/stream.py) or one read through thaw-gofer
        (control/images/served.py), whose `source` (the cache entry, the user's
        directory) is what messages and the record name instead of its view.
        Without `settle` the record stays `restoring` (this process its owner) until
        `settled`: a caller that waits for the last pages (a stream, a checked read)
        owns the restore until then, so being killed meanwhile leaves a record the
        next command removes (_reap), never one that looks done.
        """
        validate_id(sid)
        shown = Path(source) if source is not None else Path(image)
        with _named(Path(image), shown):
            meta = metamod.read_image(Path(image))
        nvproxy = bool(meta.get("nvproxy", False))
        r = self.runsc(meta["network"], nvproxy)
        if self.get(sid) is not None or r.exists(runsc_id(sid)):
            raise AlreadyExists("sandbox", sid, "restore creates a new sandbox")
        from control.node import compat
        compat.check_image(meta, str(shown), compat.node_tuple(self.settings))   # before runsc: exit 3
        probe_list = probemod.parse_all(meta.get("probes") or [] if probes is None else probes)
        with _named(Path(image), shown):
            spec = metamod.spec_for_node(meta, self.settings, sid, Path(image),
                                         self._placer(meta, gpus, Path(image), cold=False))
        check_transition(sid, None, State.RESTORING)
        bundle = specmod.Bundle(self.bundles_dir / sid)
        rec = Record(id=sid, state=State.RESTORING, bundle=str(bundle.path), restored_from=str(shown),
                     probes=[str(p) for p in probe_list], owner=Owner.me().to_dict(),
                     gpus=metamod.injected_devices(spec), nvproxy=nvproxy)
        saved = meta.get("net")
        gated = bool(saved) and mitigations.gate
        t0 = time.monotonic()
        mon = None
        try:
            self._save(rec)  # first: whatever a crash leaves from here on, `recover` finds by this record
            net = None
            if saved:
                ports = tuple(netmod.Port.parse(p) for p in saved.get("ports", []))
                saved_addr = (saved["host_ip"], saved["sandbox_ip"], saved["prefixlen"])
                # Same address as at checkpoint: restored listeners and routes stay
                # valid (docs/network.md). It is leased once: a second restore of the
                # image while the first lives is refused, not given the same address.
                addr = self._claim_net(rec, ports, saved_addr if mitigations.stable_address else None,
                                       stable=mitigations.stable_address, avoid=frozenset({saved["host_ip"]}))
                if gated:  # before the veth exists: not one packet reaches the restored stack early
                    gatemod.close(sid, self.settings.network_probe_mark, "restore")
                net = self._plumb(sid, *addr, ports)
                rec.net = net.to_dict()
                self._save(rec)
            bundle.write(specmod.with_netns(spec, net.netns_path if net else None))
            mon = logsmod.Monitor(self.settings, sid, r.argv("wait", runsc_id(sid)))
            rec.monitor = mon.to_dict()
            self._save(rec)
            logsmod.replay_log(Path(image) / metamod.IMAGE_LOG, mon.stdio, self.settings.log_max_bytes)
            h = dataclasses.replace(self.handle(rec, self._logged(r, sid)), gate=rec.id if gated else None)
            done = Engine(self.settings).restore(
                h, Path(image), probe_list, policy=policy, health_check=mitigations.health_check,
                opts=RestoreOptions(image_path=Path(image), create=CreateOptions(
                    bundle=bundle.path, pid_file=bundle.path / "init.pid"), detach=True,
                    background=self.settings.restore_background if background is None else background,
                    env=runsc_env), stdio=mon.stdio)
            mon.started()
            if done.health is not None:
                rec.health = done.health.to_dict()
            if settle:
                rec.owner = None
                self._move(rec, State.RUNNING)
            else:
                self._save(rec)
            # The gate opened (bench/network_flood.py measures from here), before the wait
            # for the last pages of a --background restore (Engine.restore).
            loaded_at = time.monotonic()
            ready_at = loaded_at - (done.seconds - done.ready_s if done.ready_s is not None else 0.0)
        except BaseException as e:
            if isinstance(e, UnhealthyRestore):
                rec.health = e.health
            if mon is not None:
                mon.abandon()
            self._undo(r, rec)
            raise
        log.info("restored %s from %s in %.3fs (runsc %.3fs%s)", sid, image, ready_at - t0, done.runsc_s,
                 f", health {done.health.seconds:.3f}s" if done.health else "",
                 extra=fields(container=sid, path=str(image), decision="restored", duration_s=round(ready_at - t0, 4),
                              runsc_s=round(done.runsc_s, 4)))
        return RestoreResult(sid, ready_at - t0, net.sandbox_ip if net else None, done.runsc_s, done.health,
                             ready_at, done.gate_dropped, loaded_at - t0 if done.loaded_s is not None else None)

    def warm_start(self, image: Path, sid: str, probes: list | None = None,
                   gpus: list[str] | None = None, **restore_kw) -> StartResult:
        """Restore `image` as `sid`; when that fails for any reason the image's
        workload can still start from (unhealthy, runsc error, corrupt pages,
        GPUs the image cannot be restored onto), start it cold from the image's
        spec instead, with the same GPUs re-injected: the caller gets one
        container either way."""
        t0 = time.monotonic()
        try:
            res = self.restore(image, sid, probes=probes, gpus=gpus, **restore_kw)
            return StartResult(sid, "restored", time.monotonic() - t0, res.sandbox_ip, res)
        except TupleMismatch as e:   # not restorable here, and nothing was made: start it cold
            log.warning("restore of %s as %s: %s; starting cold", image, sid, e.message)
            return self.cold_start(image, sid, f"TupleMismatch: {e.message}", probes, gpus, t0,
                                   restore_kw.get("source"))
        except (AlreadyExists, InUse, PreconditionError, InvalidTransition):
            raise
        except ThawError as e:
            reason = f"{type(e).__name__}: {e.message}"
            log.warning("restore of %s as %s failed, starting cold: %s", image, sid, reason,
                        extra=fields(container=sid, path=str(image), decision="cold-fallback", reason=reason))
            try:
                return self.cold_start(image, sid, reason, probes, gpus, t0, restore_kw.get("source"))
            except ImageError:
                raise e from None  # no spec to start from either

    def cold_start(self, image: Path, sid: str, reason: str, probes: list | None = None,
                   gpus: list[str] | None = None, t0: float | None = None,
                   source: Path | None = None) -> StartResult:
        """Start the workload of `image` cold as `sid` from its saved spec, `reason` saying
        why it was not restored (ImageError when the image has no spec either; `source`
        as for restore)."""
        t0 = time.monotonic() if t0 is None else t0
        # A cold start needs the spec, not the memory (a failed stream's image
        # directory keeps thaw.json only: control/images/stream.py).
        with _named(Path(image), Path(source) if source is not None else Path(image)):
            meta = metamod.read_image(Path(image), memory=False)
        saved = meta.get("net") or {}
        addr = (saved["host_ip"], saved["sandbox_ip"], saved["prefixlen"]) if saved else None  # if free (_claim_net)
        spec = metamod.spec_for_node(meta, self.settings, sid, Path(image),
                              self._placer(meta, gpus, Path(image), cold=True))
        rec = self._run_spec(sid, spec, meta["network"] == "sandbox", bool(meta.get("nvproxy", False)),
                             tuple(meta.get("probes") or [] if probes is None else probes),
                             tuple(netmod.Port.parse(p) for p in saved.get("ports", [])), addr)
        return StartResult(sid, "cold", time.monotonic() - t0, (rec.net or {}).get("sandbox_ip"),
                           fallback_reason=reason)

    def watch(self, sid: str, seconds: float, poll_s: float = 0.05) -> logsmod.Exit | None:
        return statusmod.watch(self, sid, seconds, poll_s)

    def settled(self, sid: str) -> None:
        """A restore made with settle=False is complete (every page in): running."""
        rec = self.require(sid)
        if rec.state is State.RESTORING:
            rec.owner = None
            self._move(rec, State.RUNNING)

    def wait_restored(self, sid: str, timeout_s: float | None = None) -> None:
        """Until the sandbox's restore is complete, every page loaded (`runsc wait
        --restore`); RunscError when it failed, when runsc killed the sandbox."""
        rec = self.require(sid)
        self.handle(rec).runsc.wait(runsc_id(sid), timeout_s, restore=True)

    def health(self, sid: str, probes: list | None = None,
               policy: probemod.Policy | None = None) -> tuple[probemod.HealthResult, bool | None]:
        """Run the sandbox's health check now (probes default to its own); (result,
        gate closed?). Fails at once when the workload has exited. The result is
        recorded in the sandbox's record."""
        rec = self.require(sid)
        result = Engine(self.settings).check(self.handle(rec), rec.probes if probes is None else probes, policy)
        closed = gatemod.is_closed(sid) if rec.net else None
        current = self.get(sid)
        if current is not None:
            current.health = result.to_dict()
            self._save(current)
        return result, closed

    def _gpu_needs(self, spec: dict) -> dict | None:
        return metamod.gpu_needs(spec, lambda: self.devices().gpus)

    def _placer(self, meta: dict, request: list[str] | None, image: Path,
                cold: bool) -> Callable[[dict], dict] | None:
        """How `_spec_for_node` puts this node's GPUs into a GPU image's spec:
        for a restore (checked: count, model, driver, mounts) or a cold start."""
        need = meta.get("gpu")
        if not need:
            if request:
                raise UserError(f"image {image} was saved without GPUs; --gpus is for GPU images")
            return None
        place = gpumod.for_cold if cold else gpumod.for_restore

        def placed(spec: dict) -> dict:
            return place(spec, need, request, self.devices(), stage_for(self.settings), str(image))
        return placed

    def delete(self, sid: str, force: bool = False) -> None:
        validate_id(sid)
        rec = self.get(sid)
        r = self.runsc("sandbox" if (rec is None or rec.net) else "none")
        if rec is None and not r.exists(runsc_id(sid)):
            raise NotFound("sandbox", sid)
        if rec is not None and rec.state is State.RUNNING and not force \
                and _status(r, runsc_id(sid)) in ("running", "paused"):
            raise UserError(f"sandbox {sid!r} is running; use --force to kill and delete it", id=sid)
        self._undo(r, rec or Record(id=sid, state=State.STOPPED, bundle=str(self.bundles_dir / sid)))

    def ps(self) -> list[dict]:
        return statusmod.rows(self)

    def logs(self, sid: str) -> tuple[logsmod.SandboxLogs, Callable[[], bool]]:
        return statusmod.logs(self, sid)

    def gone(self, sid: str) -> bool:
        return statusmod.gone(self, sid)

    def exit_of(self, sid: str) -> logsmod.Exit | None:
        return statusmod.exit_of(self, sid)

    def address(self, sid: str) -> str:
        return statusmod.address(self, sid)

    # -- helpers ----------------------------------------------------------------

    def require(self, sid: str) -> Record:
        """Sandbox `sid`'s record; NotFound when thaw manages none of that id."""
        validate_id(sid)  # before the id names a path
        rec = self.get(sid)
        if rec is None:
            raise NotFound("sandbox", sid, "`thaw ps` lists the sandboxes thaw manages")
        return rec

    def _undo(self, r: Runsc, rec: Record) -> None:
        """Remove every trace of `rec`: runsc container, netns, veth, gate and NAT rules, bundle, record."""
        try:
            if r.exists(runsc_id(rec.id)):
                r.delete(runsc_id(rec.id), force=True)
        except ThawError as e:
            log.warning("runsc delete %s during cleanup: %s", rec.id, e, extra=fields(container=rec.id, reason=str(e)))
        netmod.unplumb(rec.id)  # whatever of it exists; a gate closed before plumbing too
        # The sandbox is gone, so its log pipe closes: the monitor drains it and exits.
        logsmod.stop_monitor(rec.monitor)
        shutil.rmtree(logsmod.SandboxLogs.of(self.settings, rec.id).dir, ignore_errors=True)
        shutil.rmtree(self.bundles_dir / rec.id, ignore_errors=True)
        # The empty host-layout root thaw made for a command sandbox (a --bundle's is the user's).
        shutil.rmtree(self.settings.state_dir / "rootfs" / rec.id, ignore_errors=True)
        self._record_path(rec.id).unlink(missing_ok=True)


def _status(r: Runsc, cid: str) -> str:
    return engine_status(r, cid)


@contextlib.contextmanager
def _named(image: Path, shown: Path):
    """ImageError about `image` (a view thaw made of `shown`, control/images/served.py)
    names `shown`: the directory the user gave, the cache entry."""
    try:
        yield
    except ImageError as e:
        if image == shown:
            raise
        raise ImageError(str(shown), e.message.removeprefix(f"checkpoint image {image}: ")) from None
