"""A sandbox's CUDA side, for every door: is a spec a GPU spec, where the CUDA
checkpoint helper is staged and mounted, and the CUDA processes of a running
sandbox with the state the driver keeps for each.

"Is this a GPU spec" is asked once, here (`uses_gpu`): nvproxy turns on for a
spec that lists /dev/nvidiactl (docs/gvisor-notes.md "GPU"). Such a sandbox
gets the helper (nvproxy/helper.py) bind-mounted at its fixed path at
checkpoint and restore alike, because runsc runs the helper inside the
sandbox by that path. The helper is staged once per node, under the state
directory, for the CLI and thawd alike (`stage_for`).

`CudaProcesses` speaks the helper's protocol inside a sandbox through `runsc
exec`: `--get-state --pid N` prints one of the CUDA driver's process states
(running, locked, checkpointed, failed; twin: state_name() in
nvproxy/cuda_checkpoint/thaw-cuda-checkpoint.c), `--toggle` moves a running
process to checkpointed (its GPU memory saved to host memory and freed) and a
checkpointed one back, `--action unlock` unlocks a locked one.
"""

from __future__ import annotations

import enum
import logging
import threading
from pathlib import Path

from control.errors import PreconditionError, SpecError, ThawError
from nvproxy import helper

log = logging.getLogger(__name__)

# The control node whose presence in spec.linux.devices turns nvproxy on.
CONTROL_NODE = "/dev/nvidiactl"
# A helper query is a few milliseconds; a process stuck in the driver is not.
STATE_TIMEOUT_S = 30.0


def uses_gpu(spec: dict | None) -> bool:
    """nvproxy is on for specs listing /dev/nvidiactl (docs/gvisor-notes.md "GPU")."""
    return any(d.get("path") == CONTROL_NODE for d in ((spec or {}).get("linux") or {}).get("devices") or [])


def helper_path(spec: dict) -> str | None:
    """The in-sandbox path of the CUDA checkpoint helper for a GPU spec; None for a CPU spec.
    SpecError for a GPU spec without the helper mounted: runsc could not save its GPU state."""
    if not uses_gpu(spec):
        return None
    if not any(m.get("destination") == helper.HELPER_DIR for m in spec.get("mounts") or []):
        raise SpecError("mounts", f"GPU sandbox without the CUDA checkpoint helper at {helper.HELPER_DIR}: "
                        "runsc cannot save its GPU memory (start it with `thaw run --gpus` or under thawd)")
    return helper.HELPER_PATH


def stage_for(settings) -> Path:
    """The host directory holding the staged helper, the source of its mount in every
    GPU sandbox of this node (both doors): staged once, from the binary installed
    beside runsc (thaw-cuda-checkpoint)."""
    d = settings.state_dir / "cuda-helper"
    if not (d / helper.HELPER_NAME).is_file():
        helper.stage(settings.runsc_path.parent / helper.BINARY_NAME, d)
    return d


def mount_helper(spec: dict, host_dir: Path | None) -> bool:
    """Mount the staged helper (`host_dir`, stage_for's) into a GPU `spec`, in place: the
    one mount of both doors (thawd's create, the CLI's run and restore). False for a CPU
    spec or one that already has exactly this mount (nothing changed); PreconditionError
    for a GPU spec with no staged helper (`host_dir` None)."""
    if not uses_gpu(spec):
        return False
    if host_dir is None:
        raise PreconditionError("a GPU sandbox needs the CUDA checkpoint helper (thaw-cuda-checkpoint "
                                "beside runsc): run `make setup`")
    before = [dict(m) for m in spec.get("mounts") or []]
    helper.add_to_spec(spec, host_dir)
    return spec.get("mounts") != before


class CudaState(enum.Enum):
    RUNNING = "running"
    LOCKED = "locked"
    CHECKPOINTED = "checkpointed"
    FAILED = "failed"


class CudaProcesses:
    """The CUDA processes of one running sandbox, through the helper inside it.

    `runsc` is the sandbox's typed runsc client (runsc_hooks.runsc.Runsc) and
    `cid` its exact container id."""

    def __init__(self, runsc, cid: str, helper_in_sandbox: str = helper.HELPER_PATH) -> None:
        self.runsc = runsc
        self.cid = cid
        self.helper = helper_in_sandbox

    def state(self, pid: int, timeout_s: float = STATE_TIMEOUT_S) -> CudaState | None:
        """The driver's state of `pid`; None when it is no CUDA process (the helper
        cannot get a state for it) or says something unknown."""
        try:
            out = self.runsc.exec(self.cid, [self.helper, "--get-state", "--pid", str(pid)],
                                  timeout_s=timeout_s).stdout.strip()
        except ThawError as e:
            log.debug("%s: pid %d: no CUDA state (%s)", self.cid, pid, e)
            return None
        try:
            return CudaState(out)
        except ValueError:
            log.warning("%s: pid %d: the CUDA helper answered %r, not a state", self.cid, pid, out)
            return None

    def states(self) -> dict[int, CudaState]:
        """Every CUDA process of the sandbox and its state."""
        out = {}
        for n in self.runsc.pids(self.cid):
            st = self.state(n)
            if st is not None:
                out[n] = st
        return out

    def toggle(self, pid: int, timeout_s: float) -> None:
        self.runsc.exec(self.cid, [self.helper, "--toggle", "--pid", str(pid)], timeout_s=timeout_s)

    def unlock(self, pid: int, timeout_s: float) -> None:
        self.runsc.exec(self.cid, [self.helper, "--action", "unlock", "--pid", str(pid)], timeout_s=timeout_s)

    def checkpoint_running(self, timeout_s: float) -> list[int]:
        """Toggle every running CUDA process to checkpointed (GPU memory freed, its state
        in host memory; a parked sandbox, control/thawd/parking.py); their pids.
        ThawError when one does not end checkpointed."""
        done = []
        for n, st in self.states().items():
            if st != CudaState.RUNNING:
                continue
            self.toggle(n, timeout_s)
            after = self.state(n)
            if after != CudaState.CHECKPOINTED:
                raise ThawError(f"checkpointing pid {n}'s CUDA state left it "
                                f"{after.value if after else 'without a state'}, not checkpointed")
            done.append(n)
        return done

    def restore(self, pids: list[int], timeout_s: float) -> list[str]:
        """Toggle `pids` (checkpointed) back to running, all at once: the driver restores
        each process's GPU memory in parallel. The errors, one line per failed pid."""
        errors: list[str] = []

        def one(n: int) -> None:
            try:
                self.toggle(n, timeout_s)
            except ThawError as e:
                errors.append(f"pid {n}: {e.message}")
        threads = [threading.Thread(target=one, args=(n,)) for n in pids]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return errors

    def resume_after_failed_save(self, timeout_s: float = 600.0) -> list[int]:
        """Toggle back the CUDA processes a failed save left checkpointed (or locked);
        their pids.

        At the pin, runsc toggles every CUDA process to "checkpointed" before it
        saves and back only after a save that succeeded: when the save fails
        (ENOSPC), pkg/sentry/control/state.go SaveWithOpts returns before
        PostResume, so with --leave-running the workload runs on with its GPU
        state still in host memory and its CUDA calls blocked. thaw does what
        runsc would have. Processes whose page faults the sentry parked under
        SigsegvLock during the save stay parked (upstream FIXME b/456299722): a
        limit this cannot lift. Best effort: every failure is logged, none
        raised (the caller is reporting the checkpoint's own)."""
        resumed: list[int] = []
        try:
            found = self.states()
        except ThawError as e:
            log.warning("after the failed checkpoint of %s: runsc ps: %s", self.cid, e)
            return resumed
        for n, st in found.items():
            try:
                if st == CudaState.LOCKED:   # locked but not yet checkpointed: unlock is enough
                    self.unlock(n, timeout_s)
                elif st == CudaState.CHECKPOINTED:
                    self.toggle(n, timeout_s)
                else:
                    continue
                resumed.append(n)
            except ThawError as e:
                log.warning("after the failed checkpoint of %s: pid %d (%s): %s", self.cid, n, st.value, e)
        if resumed:
            log.info("after the failed checkpoint of %s: CUDA state of %s restored", self.cid, resumed)
        return resumed
