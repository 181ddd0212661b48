"""The last decisions thawd made, per container: did it restore or start cold, and why
(`thaw stats --decisions N [--container ID]`, issue 33 item 4).

A bounded ring (thawd.decisions_kept records, oldest dropped first), filled at
the RPC boundary (control/thawd/server.py): every PrepareRestore answer
(restore, adopt, cold and its reason), every Restore result (restored, or
failed and why: the container then starts cold), every outcome the stand-in
reports. Each record is also one structured log line (control/logfields.py), so
the log system holds what the ring forgot.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import asdict, dataclass

from control.lifecycle.tenant import store_tenant
from control.lifecycle.workload import workload_of
from control.logfields import fields

log = logging.getLogger("thawd")


@dataclass(frozen=True)
class Record:
    time: float                # seconds since the epoch
    container: str
    decision: str              # restore | adopt | cold | restored | restore-failed | cold-started | ...
    reason: str = ""
    key: str = ""
    tenant: str = ""
    workload: str = ""
    seconds: float = 0.0       # how long that step took (0: not measured)

    def to_dict(self) -> dict:
        return asdict(self)


class Decisions:
    def __init__(self, kept: int = 256) -> None:
        self._ring: collections.deque[Record] = collections.deque(maxlen=max(1, kept))
        self._keys: dict[str, str] = {}       # container -> its key, from its PrepareRestore
        self._lock = threading.Lock()

    def record(self, container: str, decision: str, reason: str = "", key: str = "",
               seconds: float = 0.0) -> Record:
        """Keep one decision (the container's key is remembered from an earlier record
        when this one does not name it) and log it with its facts as fields."""
        with self._lock:
            if key:
                self._keys[container] = key
                if len(self._keys) > 4 * (self._ring.maxlen or 1):   # bounded too: drop the oldest half
                    for c in list(self._keys)[:len(self._keys) // 2]:
                        del self._keys[c]
            else:
                key = self._keys.get(container, "")
            r = Record(time.time(), container, decision, reason, key, store_tenant(key) if key else "",
                       workload_of(key) if key else "", round(seconds, 4))
            self._ring.append(r)
        log.info("decision %s: %s%s", container, decision, f" ({reason})" if reason else "",
                 extra=fields(container=container, decision=decision, reason=reason, key=key, tenant=r.tenant,
                              workload=r.workload, duration_s=r.seconds or None))
        return r

    def last(self, n: int = 20, container: str = "") -> list[Record]:
        """The newest `n` records, oldest first; with `container`, only its."""
        with self._lock:
            rows = [r for r in self._ring if not container or r.container == container]
        return rows[-n:] if n > 0 else []
