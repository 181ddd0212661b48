"""Quarantine: images whose restores keep failing, kept off restore.

thawd counts consecutive failed restores per workload key; after
`thawd.quarantine_after` of them the key is quarantined: every start of that
workload is cold until the operator evicts the image (`thaw evict KEY`). The
list survives restarts in <state_dir>/thawd/quarantine.json, which `thaw ls`
reads too.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from pathlib import Path

from control.config import Settings
from control.errors import UserError
from control.files import write_json_atomic
from control.logfields import fields

log = logging.getLogger("thawd")


def quarantine_path(settings: Settings) -> Path:
    return settings.state_dir / "thawd" / "quarantine.json"


def read_quarantine(settings: Settings) -> dict[str, str]:
    """Quarantined workload keys and why (thawd keeps this file; `thaw ls` reads it)."""
    try:
        data = json.loads(quarantine_path(settings).read_text())
        return {str(k): str(v) for k, v in data.items()}
    except FileNotFoundError:
        return {}
    except (ValueError, AttributeError) as e:
        log.warning("quarantine list %s unreadable (%s); treating it as empty", quarantine_path(settings), e,
                    extra=fields(path=str(quarantine_path(settings)), reason=str(e)))
        return {}


class Quarantine:
    """Failure counts (in memory) and the quarantine list (persisted), one lock for both."""

    def __init__(self, settings: Settings) -> None:
        self.path = quarantine_path(settings)
        self.after = settings.thawd_quarantine_after
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self._keys = read_quarantine(settings)

    def reason(self, key: str) -> str | None:
        """Why `key` is quarantined; None when it is not."""
        with self._lock:
            return self._keys.get(key)

    def items(self) -> dict[str, str]:
        with self._lock:
            return dict(self._keys)

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def failed(self, key: str, reason: str) -> bool:
        """Count a failed restore of `key`; True when this failure quarantined it."""
        with self._lock:
            n = self._failures[key] = self._failures.get(key, 0) + 1
            if n < self.after or key in self._keys:
                return False
            self._keys[key] = f"{n} restores in a row failed; last: {reason}"
            self._save_locked()
        log.warning("quarantined %s: %s", key, self._keys[key],
                    extra=fields(key=key, decision="quarantined", reason=self._keys[key]))
        return True

    def lift(self, key: str) -> bool:
        """Take `key` off the list (and forget its failures); True if it was on it."""
        with self._lock:
            found = self._keys.pop(key, None) is not None
            self._failures.pop(key, None)
            if found:
                self._save_locked()
        return found

    def mark(self, entries: list[dict]) -> list[dict]:
        """Cache entries (ImageSource.entries, `thaw stats`) with each quarantined key's
        said so: state "quarantined", and why."""
        q = self.items()
        for e in entries:
            if e["key"] in q:
                e["state"], e["reason"] = "quarantined", q[e["key"]]
        return entries

    def evict(self, key: str, images) -> bool:
        """`thaw evict KEY`: the key's unleased cache entries go (`images`: the image
        source; the store keeps its copy), and so does its quarantine. True when an
        entry went."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", key or ""):
            raise UserError(f"workload_key {key!r} is not a valid key", field="workload_key")
        removed = images.evict(key)
        self.lift(key)
        return removed

    def _save_locked(self) -> None:
        """Precondition: self._lock is held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, self._keys)
