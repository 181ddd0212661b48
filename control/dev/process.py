"""Stopping the daemons the harness starts (containerd, SeaweedFS, thawd), each
in a session of its own (`start_new_session=True`), so that its process group
holds it and whatever it forked."""
from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, grace_s: float, kill_wait_s: float = 5.0) -> None:
    """SIGTERM to `proc`'s process group, then SIGKILL to it if `proc` has not
    exited within `grace_s`; waits for `proc` either way. A group already gone
    (it exited between the caller's poll and the signal) is not an error."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(kill_wait_s)
