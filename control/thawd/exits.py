"""How processes thawd does not own ended: their wait status, from the
kernel's process events connector (netlink NETLINK_CONNECTOR, CN_IDX_PROC;
Documentation/driver-api/connector.rst, drivers/connector/cn_proc.c).

Why: a restore is kept once its stand-in has exited having committed it
(service.Standin). The stand-in's parent is gVisor's shim, not thawd, so thawd
cannot wait(2) for it, and a marker file can say "restored" while a SIGKILL
still lands between its rename and the stand-in's exit_group: containerd then
reports the start failed while the restored task runs (the view mismatch of
issue 14; CI of 2026-11-30 caught it once in 20 kills). The connector reports
every exit with its status (task->exit_code: the signal number, or the exit
code << 8, as waitpid reports it), queued before the process's pidfd becomes
readable (do_exit calls proc_exit_connector before exit_notify), so an exit
status is known for every stand-in thawd saw die.

The connector needs CAP_NET_ADMIN in the initial user and pid namespaces
(cn_proc.c proc_cn_mcast_ctl): thawd as root on the host, or in a hostPID
DaemonSet pod. Elsewhere it is unavailable and callers fall back to the
marker alone; `available` says which, and thawd logs it once at start.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections import OrderedDict

log = logging.getLogger("thawd")

# Exits remembered: every process on the node exits through here, and a
# stand-in's is looked up at most seconds after it happened.
REMEMBER = 8192
# A large receive buffer: a node forking thousands of processes a second must
# not overflow it (ENOBUFS loses events; status() then answers None).
RCVBUF = 8 << 20


# glibc mallopt(3) M_MMAP_THRESHOLD (malloc.h), and the value thawd fixes it at.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 << 10


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at its default (128 KiB), which turns off its dynamic
    adjustment (mallopt(3)). Why: the reader below takes every exit on the node, each
    datagram into a fresh 256 KiB buffer (asyncio's datagram transport recvfrom(max_size),
    shrunk to the message's size). Once one such buffer was freed the dynamic threshold
    rose above 256 KiB, so the buffers came from a malloc arena instead of mmap, and the
    small messages cut from them pinned its pages: thawd's RSS grew ~100 KiB per container
    start, ~16 MiB over 200 (tests/integration/test_soak.py found it; with the threshold
    fixed, ~2 MiB, what the bounded tables below fill to). Process-wide; False off glibc."""
    try:
        import ctypes
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


class ExitWatch:
    """Listen for process exits; `status(pid, since_ns)` returns the wait status
    of a process `pid` that exited at or after `since_ns` (CLOCK_MONOTONIC
    nanoseconds, as the events' timestamps), or None when unknown."""

    def __init__(self) -> None:
        self._exits: OrderedDict[int, tuple[int, int]] = OrderedDict()  # pid -> (status, monotonic ns)
        self._cond = threading.Condition()
        self._sock = None
        self._closed = False
        self._lost_since = 0          # monotonic ns of the last overflow: statuses before it may be missing
        self.available = False
        self.why_not = ""

    def start(self, timeout_s: float = 5.0) -> "ExitWatch":
        """Listen from a thread of its own: pyroute2 (0.9) binds a socket to the
        event loop of the thread that made it, and a get() from another thread
        never returns."""
        ready = threading.Event()
        threading.Thread(target=self._read, args=(ready,), daemon=True, name="exit-watch").start()
        if not ready.wait(timeout_s):
            self.why_not = f"the process events connector did not answer in {timeout_s:.0f} s"
        return self

    def _open(self):
        from pyroute2.netlink.connector.cn_proc import ProcEventSocket
        sock = ProcEventSocket()
        try:
            # FORCE passes net.core.rmem_max (root); plain SO_RCVBUF is capped by it.
            sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", socket.SO_RCVBUF), RCVBUF)
        except OSError:
            pass
        sock.bind()
        sock.control(listen=True)
        return sock

    def _read(self, ready: threading.Event) -> None:
        from pyroute2.netlink.connector.cn_proc import PROC_EVENT_EXEC, PROC_EVENT_EXIT
        try:
            self._sock = self._open()
        except Exception as e:  # noqa: BLE001 - any failure means: no exit statuses, markers only
            self.why_not = f"{type(e).__name__}: {e}"
            ready.set()
            return
        self.available = True
        ready.set()
        while not self._closed:
            try:
                msgs = self._sock.get()
            except OSError as e:
                if e.errno == errno.ENOBUFS:    # events were dropped; say so, go on
                    with self._cond:
                        self._lost_since = time.monotonic_ns()
                    log.warning("process exit events overflowed; stand-in exits since are judged by marker")
                    continue
                if not self._closed:
                    log.warning("process exit events stopped: %s", e)
                break
            except Exception:  # noqa: BLE001 - a malformed message: skip it, keep listening
                continue
            with self._cond:
                for m in msgs:
                    what, pid = m.get("what"), m.get("process_pid")
                    if what == PROC_EVENT_EXEC:
                        # A thread other than the leader exec'd (a Go program's syscall.Exec
                        # runs on any thread; thaw-runsc execs the stand-in): de_thread ended
                        # the old leader, whose exit may carry the process's pid, and the
                        # process lives on under it. That exit is not the process's.
                        self._exits.pop(pid, None)
                        continue
                    if what != PROC_EVENT_EXIT:
                        continue
                    if pid != m.get("process_tgid"):
                        continue   # a thread, not the process (its leader's event carries the group's status)
                    self._exits[pid] = (m.get("exit_code"), m.get("timestamp_ns"))
                    self._exits.move_to_end(pid)
                    while len(self._exits) > REMEMBER:
                        self._exits.popitem(last=False)
                self._cond.notify_all()
        with self._cond:
            self.available = False
            self._cond.notify_all()
        try:
            self._sock.close()
        except Exception:  # noqa: BLE001 - closing on the way out
            pass

    def status(self, pid: int, since_ns: int, wait_s: float = 1.0) -> int | None:
        """The wait status of `pid`'s exit at or after `since_ns`; waits up to
        `wait_s` for the event when the caller already knows the process is gone."""
        if not self.available:
            return None
        end = time.monotonic() + wait_s
        with self._cond:
            while True:
                got = self._exits.get(pid)
                if got is not None and got[1] >= since_ns:
                    return got[0]
                if self._lost_since >= since_ns:
                    return None
                left = end - time.monotonic()
                if left <= 0 or not self.available:
                    return None
                self._cond.wait(left)

    def close(self) -> None:
        """Stop listening: the reader ends at the next event (every exit on the node is one)."""
        self._closed = True
        with self._cond:
            self.available = False
            self._cond.notify_all()
