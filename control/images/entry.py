"""A node cache entry and the lease that pins it (control/images/cache.py keeps
them in its SQLite index): what a restore reads, and who holds it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from control.files import Owner
from control.node.compat import CompatTuple

_PARTIAL = ".partial"


def _command(pid: int) -> str:
    """A process's command line, short ("thaw serve"), for lease_holders."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [os.path.basename(a.decode(errors="replace")) if i == 0 else a.decode(errors="replace")
             for i, a in enumerate(argv[:3]) if a]
    if len(words) > 1 and words[0].startswith("python"):
        words = [os.path.basename(words[1])] + words[2:]
    return " ".join(words)[:80] or "?"


def partial_owner(path: Path) -> Owner | None:
    """The writer named in a partial directory's name (<entry>.<pid>-<start>.partial);
    None for a name that names none (written by an older thaw: a leftover)."""
    stem = path.name[:-len(_PARTIAL)] if path.name.endswith(_PARTIAL) else ""
    tail = stem.rsplit(".", 1)[-1] if "." in stem else ""
    pid, _, start = tail.partition("-")
    if not (pid.isdigit() and start.isdigit()):
        return None
    return Owner(int(pid), start)

@dataclass(frozen=True)
class Entry:
    id: str
    key: str
    tuple: CompatTuple
    size: int
    state: str
    created: float
    last_used: float
    leases: int
    path: Path
    verified: float = 0.0   # when every chunk was last hashed (install, scrub, `thaw verify`); 0: never

    def to_dict(self) -> dict:
        return {"id": self.id, "key": self.key, "tuple_hash": self.tuple.hash(), "size": self.size,
                "state": self.state, "created": self.created, "last_used": self.last_used,
                "leases": self.leases, "path": str(self.path), "verified": self.verified}


class Lease:
    """Pins an entry until released: eviction leaves it alone (the runsc files stay put).

    A restorable image (control/images/source.py Restorable), as a Stream is:
    `path` (and `source`: the entry itself), `hit` (whether the entry was already in
    the cache when asked for), `streamed` and `checked` (False: runsc reads the entry's
    files as they are), `env()` (nothing runsc needs), `verdict()` (a complete entry has
    no stream to fail), `wait()` (it is whole), `release()`."""

    streamed = False
    checked = False

    def __init__(self, cache, lease_id: int, entry: Entry, hit: bool = False) -> None:
        """`cache`: the control/images/cache.py Cache whose index holds the lease."""
        self._cache = cache
        self.id = lease_id
        self.entry = entry
        self.path = self.source = entry.path
        self.hit = hit
        self.released = False

    def env(self) -> dict[str, str]:
        return {}

    def verdict(self, wait_s: float = 0.0) -> None:
        return None

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def to_dict(self) -> dict:
        return {"entry": self.entry.id, "path": str(self.path), "verified_reads": False}

    def describe(self, holder: str) -> None:
        """Say who holds this lease ("container <id>", "parked sandbox <id>"): what
        `Cache.lease_holders` and so `thaw evict` and `thaw ls` report."""
        with self._cache._tx() as db:
            db.execute("UPDATE leases SET holder = ? WHERE id = ?", (holder[:200], self.id))

    def release(self) -> None:
        if not self.released:
            with self._cache._tx() as db:
                db.execute("DELETE FROM leases WHERE id = ?", (self.id,))
            self.released = True

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
