"""The stand-in process that asked for a Restore, and the marker it keeps.

The Go stand-in (go/cmd/thaw-runsc-hooks, go/internal/standin) writes a marker
file per container: create's decision, which start and delete read back. At a
restored start it renames the marker to say "restored" just before it exits
0: that is its commit. containerd believes the stand-in's exit status, so
thawd keeps a restore only once the stand-in that asked for it has exited
having committed it (control/thawd/restore.py `_confirm`); a stand-in
SIGKILLed between thawd's answer and its commit made containerd report a
failed start, and its restore must go (issue 14).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from control.errors import ThawError, UserError
from control.thawd.containers import State
from control.thawd.exits import ExitWatch
from runsc_hooks import spec as specmod

log = logging.getLogger("thawd")

# How long thawd waits for a stand-in to exit after answering its Restore,
# seconds (it exits within milliseconds: one log line, one rename).
CONFIRM_TIMEOUT_S = 30.0
# The largest stand-in marker thawd reads (a few hundred bytes of JSON).
MAX_MARKER_BYTES = 64 << 10
# The stand-in's process name (go/cmd/thaw-runsc-hooks; thaw-runsc execs it).
STANDIN_BINARY = "thaw-runsc-hooks"


@dataclass
class Standin:
    """The stand-in process that asked for a Restore, and its marker file: the
    marker says "restored" once the stand-in committed the restore, just
    before it exits (go/internal/standin start). Where thawd hears process
    exits (control/thawd/exits.py), the exit status decides too: a stand-in
    killed after its commit, before its exit, made containerd report a failed
    start, so its restore must go although the marker says "restored"."""
    pid: int
    marker: Path
    start: str = ""       # /proc/PID/stat start time: a recycled pid is not the stand-in
    watchable: bool = False
    exits: "ExitWatch | None" = None
    since_ns: int = 0     # CLOCK_MONOTONIC: an exit of `pid` before this is another process's

    # How long before the Restore request arrived the stand-in may have died
    # (killed after sending it): its exit still counts.
    EARLY_DEATH_NS = 2_000_000_000

    @classmethod
    def validate(cls, pid: int, marker: str, exits: "ExitWatch | None" = None) -> "Standin | None":
        if pid <= 0 and not marker:
            return None            # an older stand-in: nothing to wait for
        if pid <= 0 or not marker.startswith("/") or "\0" in marker or ".." in Path(marker).parts:
            raise UserError("standin_pid and standin_marker go together: a pid and an absolute path",
                            field="standin_pid")
        return cls(pid, Path(marker), exits=exits, since_ns=time.monotonic_ns() - cls.EARLY_DEATH_NS)

    def observe(self) -> None:
        """Record who `pid` is now. Only a thaw-runsc-hooks process is watched: in
        another pid namespace (thawd in a pod without hostPID) the number names
        some other process or none, and nothing can be told from it. A stand-in
        already dead when its request is read is watched when its exit was
        heard (exit events come only in the initial pid namespace, where pid
        numbers are the stand-in's own)."""
        from control.files import process_start
        try:
            argv0 = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            argv0 = b""
        self.start = process_start(self.pid) if Path(argv0.decode(errors="replace")).name == STANDIN_BINARY else ""
        if self.start:
            # Alive and already the stand-in: every exit of `pid` heard from now on is its own
            # (not the exec that made it one: exits.py).
            self.since_ns = time.monotonic_ns()
        self.watchable = bool(self.start) or (not argv0 and self.exit_status(wait_s=0.5) is not None)

    def exit_status(self, wait_s: float = 1.0) -> int | None:
        """The stand-in's wait status (0: exited 0; a signal number: killed), None when not heard."""
        return self.exits.status(self.pid, self.since_ns, wait_s) if self.exits is not None else None

    def wait_exit(self, timeout_s: float) -> bool:
        """True once the stand-in has exited; False after `timeout_s`."""
        import os
        import select

        from control.files import process_start
        if process_start(self.pid) != self.start:
            return True
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return True
        try:
            if process_start(self.pid) != self.start:   # recycled between the check and the open
                return True
            return bool(select.select([fd], [], [], timeout_s)[0])
        finally:
            os.close(fd)

    def committed(self, container_id: str) -> bool | None:
        """Did the (exited) stand-in commit the restore of `container_id`? False
        when it did not exit 0 (containerd reports that start failed, whatever
        its marker says) or its marker does not say "restored"; None when
        there is no readable marker of that container (nothing to go by)."""
        status = self.exit_status()
        if status is not None and status != 0:
            log.info("stand-in %d of %s ended with wait status %#x: its start failed", self.pid, container_id,
                     status)
            return False
        try:
            data = json.loads(specmod.read_regular(self.marker, MAX_MARKER_BYTES, "standin_marker"))
        except (ThawError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("id") != container_id:
            return None
        return data.get("decision") == State.RESTORED.value
