"""The cache scrub: every idle entry re-hashed in the background (issue 30).

A restore reads a cache entry through thaw-gofer with every chunk checked
(control/images/served.py), so a byte altered on disk fails that restore. What
it does not do is tell anyone before: an entry rotting on disk stays "ready"
until a restore reads the damaged chunk, and a restore that finds it starts
cold. The scrub finds it first: one thawd thread, at nice 19 and idle I/O
priority, reads every ready entry whose last full check
(`Entry.verified`) is older than `cache.scrub_interval_s` and that no restore
holds, at most `cache.scrub_bytes_per_s`, hashing each chunk against the
entry's manifest. An intact entry is marked verified; an altered one is marked
corrupt (never served again: the next use fetches it, copying the chunks that
still hash right) and evicted. It holds a lease while it reads, so eviction
and gc leave the entry alone meanwhile; a restore that starts meanwhile runs
beside it.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Callable

from control.images import chunk
from control.images.cache import Cache, Entry
from control.images.transfer import LocalCopy, read_local

log = logging.getLogger(__name__)

# How long the thread sleeps when nothing is due, at most (s): an entry installed now
# is due cache.scrub_interval_s from now, and stopping must not wait longer than this.
IDLE_S = 60.0
# ioprio_set(2): IOPRIO_WHO_PROCESS of a thread id, class IDLE (3) << IOPRIO_CLASS_SHIFT (13).
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
_IOPRIO_IDLE = 3 << 13


class Scrub:
    """The scrub of one cache; `start()` runs it on a daemon thread until `stop()`."""

    def __init__(self, cache: Cache, interval_s: float, bytes_per_s: int,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] | None = None) -> None:
        self.cache = cache
        self.interval_s = interval_s
        self.rate = bytes_per_s
        self.clock = clock
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._thread: threading.Thread | None = None
        self.checked = 0
        self.found: list[str] = []   # entries found altered (ids)

    def start(self) -> "Scrub":
        if self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cache-scrub", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        _lower_priority()
        while not self._stop.is_set():
            try:
                wait = self.step()
            except Exception:  # noqa: BLE001 - the scrub must never stop thawd; it tries again later
                log.exception("cache scrub")
                wait = IDLE_S
            if wait > 0:
                self._sleep(wait)

    def due(self) -> list[Entry]:
        """Ready entries no restore holds whose last full check is older than the interval, oldest first."""
        now = self.clock()
        return sorted((e for e in self.cache.entries() if e.state == "ready" and e.leases == 0
                       and e.verified < now - self.interval_s), key=lambda e: e.verified)

    def step(self) -> float:
        """Check the most overdue entry; seconds until the next one is due (0: go on now)."""
        due = self.due()
        if not due:
            ready = [e.verified for e in self.cache.entries() if e.state == "ready"]
            return min(IDLE_S, max(1.0, min(ready, default=self.clock()) + self.interval_s - self.clock()))
        self.check(due[0])
        return 0.0

    def check(self, e: Entry) -> str | None:
        """Hash every chunk of entry `e` at the rate bound; why it is altered, or None."""
        lease = self.cache.lease(e.id, holder="the cache scrub")
        if lease is None:   # evicted or marked since the listing
            return None
        try:
            why = self._hash(e)
        finally:
            lease.release()
        if self._stop.is_set() and why == "stopped":
            return None
        self.checked += 1
        if why is None:
            self.cache.mark_verified(e.id)
            log.info("cache scrub: %s intact (%d bytes)", e.id, e.size)
            return None
        self.found.append(e.id)
        self.cache.mark_corrupt(e.id)
        evicted = self.cache.evict(e.id)
        log.warning("cache scrub: %s is altered (%s): marked corrupt%s; its next use fetches it again",
                    e.id, why, ", evicted" if evicted else " (in use: evicted later)")
        return why

    def _hash(self, e: Entry) -> str | None:
        try:
            m = self.cache.manifest_of(e)
        except (OSError, ValueError) as err:
            return f"manifest unreadable: {err}"
        t0, done = time.monotonic(), 0
        for f in m.files:
            p = e.path / f.name
            for off, c in f.placed():
                if self._stop.is_set():
                    return "stopped"
                data = read_local(LocalCopy(p, off, e.id), c.length)
                if data is None or chunk.sha256(data) != c.hash:
                    return f"{f.name} chunk at offset {off} does not hash to {c.hash[:16]}"
                done += c.length
                ahead = done / self.rate - (time.monotonic() - t0)
                if ahead > 0.05:
                    self._sleep(ahead)
        return None


def _lower_priority() -> None:
    """This thread at nice 19 and (where the kernel has it) the idle I/O class: the
    scrub takes what the node does not use. Per thread on Linux (setpriority of a tid)."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 19)
    except OSError as e:
        log.info("cache scrub: cannot lower its CPU priority: %s", e)
    nr = _IOPRIO_SET.get(os.uname().machine)
    if nr is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(nr, 1, tid, _IOPRIO_IDLE) != 0:   # 1: IOPRIO_WHO_PROCESS
            log.info("cache scrub: cannot lower its I/O priority: errno %d", ctypes.get_errno())


def start(cache: Cache, settings) -> Scrub:
    """thawd's scrub of its cache, as cache.scrub_interval_s and cache.scrub_bytes_per_s say."""
    return Scrub(cache, settings.cache_scrub_interval_s, settings.cache_scrub_bytes_per_s).start()
