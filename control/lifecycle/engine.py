"""The one sandbox lifecycle: checkpoint, restore, probe, with the network gate,
the workload profile's hooks and the GPU helper, whichever door asked.

Two doors drive it and differ only in how they are asked:
- the CLI (`thaw run/checkpoint/restore/health`, control/lifecycle/sandbox.py),
  for sandboxes thaw runs itself under its own runsc root;
- thawd (control/thawd/service.py), for containers containerd's shim runs,
  asked by the Go stand-in over gRPC (PrepareRestore, Restore, ReportOutcome).

A `Handle` names one sandbox as runsc knows it (root, global flags, exact id,
bundle) and how the node reaches it (address, gate name). The engine never
plumbs networks, never keeps records and never decides restore-or-cold: the
doors do that around it.

Checkpoint never loses the workload: `runsc checkpoint` always runs with
`--leave-running`, so a failed save (ENOSPC, a GPU sandbox without the CUDA
helper, a driver error) leaves the workload serving; a sandbox that was asked
to stop after the save is stopped only once the image is complete and its
files checked (docs/notes/gvisor-facts.md: without --leave-running a failed save
kills the workload, seen on the H200). GPU sandboxes get the CUDA helper
(`--cuda-checkpoint-path`) because their spec lists /dev/nvidiactl, in every
door.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from control.config import Settings
from control.errors import (CheckpointFailed, CheckpointNoSpace, HookError, NotFound, RunscError,
                            ThawError)
from control.files import fsync_path
from control.lifecycle import deadlines, profiles
from nvproxy import cuda as cudamod
from runsc_hooks import gate as gatemod
from runsc_hooks import probe as probemod
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import IMAGE_FILES, CheckpointOptions, RestoreOptions, Runsc
from control.logfields import fields

log = logging.getLogger(__name__)

# The image file runsc cannot restore without (docs/notes/gvisor-facts.md: the
# sentry refuses an empty checkpoint.img).
REQUIRED_IMAGE_FILE = "checkpoint.img"


@dataclass(frozen=True)
class Handle:
    """One sandbox, as runsc and the node's network see it."""
    id: str                          # the runsc container id, exact
    runsc: Runsc                     # root and global flags the sandbox runs under
    bundle: Path                     # its OCI bundle (config.json)
    address: str | None = None       # the sandbox address the node reaches; None: probes run inside it
    gate: str | None = None          # the name its ingress gate is kept under; None: no gate
    mark: int | None = None          # SO_MARK of probes (they pass a closed gate)
    # Whether the workload's own monitor saw it exit (None: no monitor). It is
    # the authority: runsc's view lags it. A sandbox whose init exited answers
    # `runsc state` "running" until its process is reaped, since runsc asks the
    # sandbox first and, when the sandbox no longer answers, falls back to
    # kill(pid, 0), which a zombie or a sandbox still tearing down passes
    # (runsc/container/container.go CheckStopped, sandbox.go IsRunning).
    exited: Callable[[], bool] | None = None

    def spec(self) -> dict:
        return specmod.Bundle(self.bundle).load()


@dataclass(frozen=True)
class Saved:
    """What a checkpoint wrote."""
    image: Path
    seconds: float                   # runsc checkpoint (hooks excluded)
    files: dict[str, int]            # file name -> bytes
    gpu: bool
    hooks: list[dict] = field(default_factory=list)
    gate_dropped: int | None = None  # packets held off while the gate was closed

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


@dataclass(frozen=True)
class Restored:
    seconds: float                   # runsc restore + health check + hooks (+ the wait for the pages)
    runsc_s: float                   # runsc restore alone
    health: probemod.HealthResult | None
    hooks: list[dict] = field(default_factory=list)
    gate_dropped: int | None = None
    ready_s: float | None = None     # runsc restore + health check + hooks: when the gate opened
    loaded_s: float | None = None    # when every page was in (a --background restore), from the start


def loads_after_return(opts: RestoreOptions) -> bool:
    """Whether `runsc restore` with `opts` returns before every page is in and nothing
    else waits for them: --background from a local image (a streamed one, `opts.env`,
    is waited for with its stream). Engine.restore and a pod's last container then
    end the restore at `runsc wait --restore`."""
    return opts.background and not opts.env


def status(r: Runsc, cid: str) -> str:
    """runsc's view of container `cid`: created/running/paused/stopped, "absent", or "unknown (...)"."""
    try:
        return r.state(cid).status
    except NotFound:
        return "absent"
    except RunscError as e:
        return f"unknown ({e.runsc_message})"


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.s = settings

    # -- probes ----------------------------------------------------------------

    def target(self, h: Handle) -> probemod.Target:
        r = h.runsc
        exited = h.exited or (lambda: False)

        def run_exec(argv: list[str], timeout_s: float) -> tuple[int, str]:
            try:
                proc = r.exec(h.id, argv, timeout_s=timeout_s)
                return 0, proc.stdout + proc.stderr
            except RunscError as e:
                return (124 if e.returncode is None else e.returncode), e.stderr_tail or e.runsc_message
            except ThawError as e:  # the container went away: a failed attempt
                return -1, str(e)

        return probemod.Target(address=h.address, mark=h.mark, exec=run_exec,
                               running=lambda: not exited() and status(r, h.id) == "running",
                               gone=lambda: exited() or status(r, h.id) in ("stopped", "absent"))

    def policy(self, timeout_s: float | None = None) -> probemod.Policy:
        return probemod.Policy(self.s.thawd_health_timeout_s if timeout_s is None else timeout_s,
                               self.s.thawd_health_attempt_timeout_s,
                               "thawd.health_timeout_s" if timeout_s is None else "")

    def check(self, h: Handle, probes: list, policy: probemod.Policy | None = None) -> probemod.HealthResult:
        """Run `probes` (text or parsed) against the sandbox until they pass or the deadline passes;
        fails at once when the workload has exited."""
        return probemod.check(probemod.parse_all(probes), self.target(h), policy or self.policy())

    # -- hooks -----------------------------------------------------------------

    def hooks(self, h: Handle, spec: dict, phase: str) -> list[dict]:
        """The workload profile's hooks for `phase` (thaw.dev/profile), run against the sandbox.
        HTTP hooks go to the sandbox's address, or from inside it when the node has none."""
        profile = profiles.for_spec(spec)
        if not profile.hooks(phase):
            return []
        records = profiles.run_hooks(profile, phase, self.target(h))
        log.info("%s hooks of %s (%s): %s", phase, h.id, profile.name, records,
                 extra=fields(container=h.id, phase=phase, profile=profile.name))
        return records

    # -- checkpoint ------------------------------------------------------------

    def checkpoint(self, h: Handle, out: Path, stop_after: bool = False, timeout_s: float | None = None,
                   hooks_on: Handle | None = None, cuda_on: list[Handle] | None = None,
                   stays: bool | None = None) -> Saved:
        """Save sandbox `h` into the new directory `out` (created by runsc; its parent must exist).

        The gate is closed from before the pre-checkpoint hooks until the image is
        written. runsc always leaves the workload running; with `stop_after`, it is
        killed once the image is complete (the caller removes what is left). On any
        failure the workload is still serving (its gate open again) and
        CheckpointFailed says so; `out` is removed.

        A workload that goes on serving after the save (`stays`, default: not
        `stop_after`; the CLI, which stops the sandbox itself, says whether it will)
        and one whose save failed get the profile's post-restore hooks before the
        gate opens: what the pre-checkpoint hooks took for the image they give back,
        as to a restored copy (pytorch-offload's weights are in host memory until
        /thaw/restore-weights, vLLM sleeps until /wake_up). Without them a workload
        thawd checkpointed with `thawd.leave_running` (the default) kept running but
        refused every request that needs its weights.

        `cuda_on`: the GPU containers of a pod's sandbox (`h` is its pause container,
        which holds no GPU): runsc runs the CUDA helper inside each CUDA process's own
        container, so each must have it mounted; one path names it for all.
        """
        spec = h.spec()
        # Before anything happens: a clear error, nothing closed.
        cuda = cudamod.helper_path(spec)
        for g in cuda_on or []:
            cuda = cudamod.helper_path(g.spec()) or cuda
        gpu_containers = [h] if cudamod.uses_gpu(spec) else list(cuda_on or [])
        stays = not stop_after if stays is None else stays
        gated = h.gate is not None and gatemod.close(h.gate, h.mark or self.s.network_probe_mark, "checkpoint")
        t0 = time.monotonic()
        hooks: list[dict] = []
        try:
            # A pod's sandbox is its pause container: its workload's hooks go to an
            # app container of it (`hooks_on`, control/thawd/pods.py).
            hooks = self.hooks(hooks_on, hooks_on.spec(), "pre_checkpoint") if hooks_on else \
                self.hooks(h, spec, "pre_checkpoint")
            # A deadline that scales with what is saved (XLA's default preallocation
            # alone can be 100+ GB of GPU memory): control/lifecycle/deadlines.py.
            deadline = deadlines.for_checkpoint(self.s, h.runsc, h.id, [g.spec() for g in gpu_containers]) \
                if timeout_s is None else deadlines.Deadline(timeout_s, "")
            t1 = time.monotonic()
            h.runsc.checkpoint(h.id, CheckpointOptions(image_path=out, leave_running=True,
                                                       compression=self.s.checkpoint_compression,
                                                       cuda_checkpoint_path=cuda), deadline.seconds,
                               timeout_key=deadline.key)
            seconds = time.monotonic() - t1
            files = check_image_files(out)
        except BaseException as e:
            _remove_tree(out)
            st = status(h.runsc, h.id)
            resumed = [n for g in gpu_containers for n in cudamod.CudaProcesses(g.runsc, g.id, cuda)
                       .resume_after_failed_save()] if cuda and st == "running" else []
            if st == "running" and not isinstance(e, (KeyboardInterrupt, SystemExit)):
                self.give_back(hooks_on or h, "its checkpoint failed")
            dropped = gatemod.open(h.gate, "checkpoint failed; the workload runs on") if gated else None
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            reason = e.message if isinstance(e, ThawError) else f"{type(e).__name__}: {e}"
            if isinstance(e, RunscError):  # one line: runsc's own message (the argv is in the debug log)
                log.debug("runsc checkpoint of %s: %s\n%s\n...\n%s", h.id, e.argv, e.stderr_head, e.stderr_tail)
                rc = "timed out" if e.returncode is None else f"exit {e.returncode}"
                reason = f"runsc checkpoint failed ({rc}): {e.runsc_message}"
            if isinstance(e, HookError):
                reason = f"pre-checkpoint hook: {reason}"
            if resumed:
                reason += f"; CUDA state of pid(s) {', '.join(map(str, resumed))} restored"
            # info, not warning: the caller reports CheckpointFailed (thawd logs it, the CLI prints
            # it as its one error line); the argv and timings are here for -v.
            log.info("checkpoint of %s failed after %.2fs (workload %s, %s packets held off): %s",
                     h.id, time.monotonic() - t0, st, dropped, reason,
                     extra=fields(container=h.id, decision="checkpoint-failed", reason=reason,
                                  duration_s=round(time.monotonic() - t0, 3)))
            if no_space(e):  # exit 4 (no room) rather than 73; runsc's own words stay in the line
                raise CheckpointNoSpace(h.id, f"no space left on the file system of {out.parent}: {reason}",
                                        st) from e
            raise CheckpointFailed(h.id, reason, st) from e
        dropped = None
        if stop_after:
            _stop(h)
            if gated:
                dropped = gatemod.state(h.gate).dropped_packets
        else:
            if stays:
                self.give_back(hooks_on or h, "it was checkpointed and serves on")
            if gated:
                dropped = gatemod.open(h.gate, "image written")
        log.info("checkpoint of %s: %d bytes in %.2fs%s", h.id, sum(files.values()), seconds,
                 " (GPU, CUDA helper)" if cuda else "",
                 extra=fields(container=h.id, decision="checkpointed", bytes=sum(files.values()),
                              duration_s=round(seconds, 3), gpu=cuda is not None))
        return Saved(out, seconds, files, cuda is not None, hooks, dropped)

    def give_back(self, h: Handle, why: str) -> list[dict]:
        """The profile's post-restore hooks on the workload a checkpoint left running
        (`why` says why it runs on): what its pre-checkpoint hooks took, it gets back.
        Only logged when it fails: the image is good either way, and the workload,
        which may not serve without it, is the caller's to watch (its health probe)."""
        try:
            spec = h.spec()
            if not profiles.for_spec(spec).hooks("post_restore"):
                return []
            return self.hooks(h, spec, "post_restore")
        except (ThawError, OSError, ValueError) as e:
            reason = e.message if isinstance(e, ThawError) else f"{type(e).__name__}: {e}"
            log.warning("%s: %s, but its post-restore hooks failed: %s", h.id, why, reason,
                        extra=fields(container=h.id, phase="post_restore", reason=reason))
            return []

    # -- restore ---------------------------------------------------------------

    def restore(self, h: Handle, image: Path, probes: list, *, opts: RestoreOptions,
                policy: probemod.Policy | None = None, health_check: bool = True,
                post_restore_hooks: bool = True, timeout_s: float | None = None,
                stdio: int | None = None, await_pages: bool = True) -> Restored:
        """`runsc restore` image into `h` (created by `opts.create` or already by a
        `runsc create`), then the health check and post-restore hooks; the gate
        (closed by the caller before the sandbox's network existed) opens only when
        both pass. Raises UnhealthyRestore / HookError / RunscError, leaving the
        sandbox for the caller to remove (it knows what else to undo). A pod's sandbox
        (`health_check` and `post_restore_hooks` off) is only registered for its restore
        here: nothing runs in it until its last container is restored (control/thawd/pods.py).
        `stdio`: the restored workload's stdout/stderr when restore creates the sandbox
        (the CLI's log pipe, control/lifecycle/logs.py).

        With `--background` (checkpoint.restore_background, the default) runsc returns
        before the memory is loaded, and a pages file that turns out short or unreadable
        kills the sandbox only when the loader reaches that part (a truncated image once
        passed its restore and its health check so, then died). So the restore ends when
        `runsc wait --restore` says every page is in (and, on a GPU, the CUDA state is
        back), after the gate opened: the workload serves meanwhile, and a failure there
        is the restore's, for the caller to undo (thawd then starts the container cold).
        Not for a streamed image (`opts.env`: its loading follows the download; the CLI
        and thawd wait for the stream) nor a pod's sandbox (`await_pages` off: its
        memory loads only when its last container registers)."""
        from control.errors import UnhealthyRestore
        # runsc restore, and the wait for the last pages, get a deadline that scales
        # with the image (control/lifecycle/deadlines.py); a caller's own wins.
        deadline = deadlines.for_restore(self.s, image) if timeout_s is None else deadlines.Deadline(timeout_s, "")
        timeout_s = deadline.seconds
        t0 = time.monotonic()
        h.runsc.restore(h.id, opts, timeout_s, stdio=stdio, timeout_key=deadline.key)
        runsc_s = time.monotonic() - t0
        result = None
        loads = await_pages and loads_after_return(opts)
        if health_check:
            result = self.check(h, probes, policy)
            if not result.healthy:
                if loads:
                    # The workload may be gone because the loader failed (a short pages
                    # file): then that is the restore's error, and it says what is wrong.
                    h.runsc.wait(h.id, timeout_s, restore=True, timeout_key=deadline.key)
                raise UnhealthyRestore(h.id, str(image), result.to_dict(), result.summary())
        try:
            hooks = self.hooks(h, h.spec(), "post_restore") if post_restore_hooks else []
        except HookError as e:
            raise UnhealthyRestore(h.id, str(image), result.to_dict() if result else {},
                                   f"post-restore hook failed: {e.message}") from None
        dropped = gatemod.open(h.gate, "restored and healthy") if h.gate is not None else None
        ready_s = time.monotonic() - t0
        loaded_s = None
        if loads:
            h.runsc.wait(h.id, timeout_s, restore=True, timeout_key=deadline.key)
            loaded_s = time.monotonic() - t0
        return Restored(time.monotonic() - t0, runsc_s, result, hooks, dropped, ready_s, loaded_s)


# How a full file system shows in runsc's output (strerror of ENOSPC, EDQUOT).
_NO_SPACE_TEXT = ("no space left on device", "disk quota exceeded")


def no_space(e: BaseException) -> bool:
    """Did `e` fail for want of space: an OSError ENOSPC/EDQUOT, or runsc saying so
    (its message can be a Go stack frame; the errno text is in its output)."""
    import errno
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    text = (str(e) + " " + getattr(e, "stderr_head", "") + " " + getattr(e, "stderr_tail", "")).lower()
    return any(t in text for t in _NO_SPACE_TEXT)


def check_image_files(image: Path) -> dict[str, int]:
    """Sizes of a runsc image directory's files, made durable; ImageError-free by
    design: a missing or empty checkpoint.img raises CheckpointFailed's cause."""
    files: dict[str, int] = {}
    for p in sorted(Path(image).iterdir()):
        if p.name in IMAGE_FILES:
            fsync_path(p)
            files[p.name] = p.stat().st_size
    if not files.get(REQUIRED_IMAGE_FILE):
        raise ThawError(f"runsc wrote no {REQUIRED_IMAGE_FILE} into {image} (or an empty one)")
    fsync_path(image)
    return files


def _stop(h: Handle) -> None:
    """Kill the workload after a complete save (the caller deletes the container)."""
    import signal
    try:
        h.runsc.kill(h.id, signal.SIGKILL, all_processes=True)
    except ThawError as e:
        log.warning("stopping %s after its checkpoint: %s", h.id, e, extra=fields(container=h.id, reason=str(e)))


def _remove_tree(p: Path) -> None:
    import shutil
    if os.path.lexists(p):
        shutil.rmtree(p, ignore_errors=True)
