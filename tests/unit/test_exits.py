"""control/thawd/exits.py against the kernel's process events connector (real
netlink; the suite runs as root, as thawd does)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from control.thawd.exits import ExitWatch
from tests.conftest import REPO, require


def _watch() -> ExitWatch:
    require(os.geteuid() == 0, "root (the connector needs CAP_NET_ADMIN)")
    w = ExitWatch().start()
    assert w.available, w.why_not
    return w


def test_exit_statuses_of_processes_thawd_does_not_own():
    w = _watch()
    try:
        since = time.monotonic_ns()
        code3 = subprocess.Popen(["sh", "-c", "exit 3"])
        ok = subprocess.Popen(["true"])
        killed = subprocess.Popen(["sleep", "30"])
        killed.send_signal(signal.SIGKILL)
        for p in (code3, ok, killed):
            p.wait()      # reaped, as the shim reaps a stand-in: the status is still known
        assert w.status(code3.pid, since) == 3 << 8
        assert w.status(ok.pid, since) == 0
        assert w.status(killed.pid, since) == signal.SIGKILL
        # An exit before `since` is another process's (a recycled pid): unknown.
        assert w.status(ok.pid, time.monotonic_ns(), wait_s=0.05) is None
        alive = subprocess.Popen(["sleep", "30"])
        try:
            t0 = time.monotonic()
            assert w.status(alive.pid, since, wait_s=0.2) is None
            assert time.monotonic() - t0 >= 0.15       # it waited for the event that did not come
        finally:
            alive.kill()
            alive.wait()
    finally:
        w.close()


def test_unavailable_answers_none():
    w = ExitWatch()        # never started: as where the connector is refused (a pod without hostPID)
    assert not w.available and w.status(os.getpid(), 0, wait_s=0) is None


def test_an_exec_from_another_thread_is_not_an_exit():
    """thaw-runsc (Go) execs the stand-in from whichever thread runs it: the
    kernel ends the old leader (de_thread) and may report an exit under the
    process's pid while the process lives on. The exec event after it clears it."""
    import sys
    w = _watch()
    try:
        since = time.monotonic_ns()
        code = ("import os, threading\n"
                "t = threading.Thread(target=lambda: os.execv('/bin/sh', ['sh', '-c', 'sleep 0.6; exit 7']))\n"
                "t.start(); t.join()\n")
        p = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.3)       # exec'd by now; sh sleeps
            assert p.poll() is None
            assert w.status(p.pid, since, wait_s=0.1) is None
        finally:
            p.wait()
        assert p.returncode == 7 and w.status(p.pid, since) == 7 << 8
    finally:
        w.close()


# A 256 KiB buffer allocated after one was freed, as the exit watch's reader does for every
# datagram: mmapped (a new mapping: hblks + 1) with the threshold fixed; from a malloc arena
# (hblks + 0) with glibc's dynamic threshold, which the first free raised above it.
_MMAPPED_AFTER_FREE = r"""
import ctypes, sys
from control.thawd.exits import fix_mmap_threshold
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
b = bytearray(256 << 10)
del b
before = libc.mallinfo2().hblks
b = bytearray(256 << 10)
print(libc.mallinfo2().hblks - before)
"""


def test_the_fixed_mmap_threshold_keeps_large_buffers_out_of_the_arenas():
    """thawd's RSS grew ~100 KiB a container start without it (tests/integration/test_soak.py)."""
    def new_mappings(mode: str) -> int:
        p = subprocess.run([sys.executable, "-c", _MMAPPED_AFTER_FREE, mode], capture_output=True, text=True,
                           cwd=REPO, timeout=30)
        assert p.returncode == 0, p.stderr
        return int(p.stdout)

    assert (new_mappings("dynamic"), new_mappings("fixed")) == (0, 1)
