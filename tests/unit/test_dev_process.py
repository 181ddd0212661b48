"""control/dev/process.py: stopping a harness daemon's process group."""
from __future__ import annotations

import subprocess
import sys
import time

from control.dev.process import stop_group


def _spawn(code: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    line = p.stdout.readline()
    p.stdout.close()
    assert line == b"ready\n"
    return p


def test_sigterm_first_and_sigkill_after_the_grace():
    p = _spawn("import signal, sys, time; print('ready', flush=True); time.sleep(30)")
    t0 = time.monotonic()
    stop_group(p, grace_s=5)
    assert p.returncode == -15 and time.monotonic() - t0 < 3        # SIGTERM was enough
    p = _spawn("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "print('ready', flush=True); time.sleep(30)")
    t0 = time.monotonic()
    stop_group(p, grace_s=0.3)
    assert p.returncode == -9 and 0.3 <= time.monotonic() - t0 < 3   # ignored it: killed after the grace


def test_a_group_already_gone_is_not_an_error():
    p = _spawn("print('ready', flush=True)")
    p.wait()
    stop_group(p, grace_s=1)
    assert p.returncode == 0
