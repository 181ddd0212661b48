"""The ground under every room: durable atomic file writes and process identity.

Every module that writes state (cache entries, sandbox records, quarantine,
provisioned files, the staged CUDA helper) writes through `write_file_atomic`:
a temp file beside the target, fsync, rename. Nothing half-written is ever
visible under the final name. Every module that records "which process owns
this" (cache leases and reservations, sandbox records) uses `Owner`: a pid
plus its start time, so a recycled pid is never mistaken for the owner
(filelock's `owner_is_stale` takes the same care).

This module imports nothing from thaw but the standard library, so
runsc_hooks/ and nvproxy/ may use it without reaching up into control/.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: to make renames in it durable)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: Path, fill: Callable[[BinaryIO], None], mode: int | None = None,
                      durable_rename: bool = False) -> None:
    """Let `fill` write a temp file beside `path` (mode 0600 unless `mode`),
    fsync it, rename it over `path`; the temp file is removed if anything fails.
    With `durable_rename` the directory is fsynced too, so the rename itself
    survives a crash."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable_rename:
        fsync_path(path.parent)


def write_bytes_atomic(path: Path, data: bytes, mode: int | None = None, durable_rename: bool = False) -> None:
    """write_file_atomic of `data`."""
    write_file_atomic(path, lambda f: f.write(data), mode, durable_rename)


def write_json_atomic(path: Path, data: Any, mode: int | None = None) -> None:
    """Write JSON to a temp file beside `path`, fsync, rename over `path`."""
    write_bytes_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), mode)


def untrusted(directory: Path) -> tuple[Path, str | None]:
    """(`directory` resolved, why another user could change what is written there; None:
    nobody but root and this process's user can). Every component from / is checked, and
    every symbolic link on the way is followed the way the kernel would: a directory owned
    by another user, or writable by group or others without the sticky bit, is one they can
    change; so is a symbolic link another user owns in a directory they can write (the
    issue-30 reproduction: a link in sticky /tmp that pointed a root `thaw checkpoint --out`
    at that user's directory). With no such component, nobody else can swap any part of the
    path between this check and the write (OpenSSH's safe_path does the same for keys)."""
    me = os.geteuid()
    todo = list(Path(os.path.abspath(directory)).parts[1:])
    cur, hops = Path("/"), 0
    shared = False   # `cur` may be written by others (sticky): what they put in it is not ours
    while True:
        st = os.lstat(cur)
        if not stat.S_ISDIR(st.st_mode):
            return cur, f"{cur} is not a directory"
        if st.st_uid not in (0, me):
            return cur, f"{cur} is owned by uid {st.st_uid}, who can change what is in it"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return cur, f"{cur} is writable by {'group' if st.st_mode & 0o020 else 'others'} (mode " \
                        f"{stat.S_IMODE(st.st_mode):04o}, no sticky bit): others can change what is in it"
        shared = bool(st.st_mode & 0o022)
        if not todo:
            return cur, None
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = cur.parent
            continue
        nxt = cur / name
        try:
            lst = os.lstat(nxt)
        except FileNotFoundError:
            return nxt, f"{nxt} does not exist"
        if stat.S_ISLNK(lst.st_mode):
            hops += 1
            if hops > 40:
                return nxt, f"{nxt}: too many levels of symbolic links"
            if shared and lst.st_uid not in (0, me):
                return nxt, (f"{nxt} is a symbolic link owned by uid {lst.st_uid} in {cur}, which others can "
                             "write: refusing to follow it")
            target = Path(os.readlink(nxt))
            todo = list(target.parts[1:] if target.is_absolute() else target.parts) + todo
            if target.is_absolute():
                cur = Path("/")
            continue
        cur = nxt


def process_start(pid: int) -> str:
    """The start time of process `pid` in clock ticks since boot (field 22 of
    /proc/PID/stat), '' if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass(frozen=True)
class Owner:
    """A process, identified so that a recycled pid does not match: pid + start time."""
    pid: int
    start: str

    @classmethod
    def me(cls) -> "Owner":
        return cls(os.getpid(), process_start(os.getpid()))

    def alive(self) -> bool:
        """Fail closed: True only while this exact process (same pid, same start) exists."""
        return self.start != "" and process_start(self.pid) == self.start

    def to_dict(self) -> dict:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_dict(cls, d: Any) -> "Owner | None":
        """An owner from a record; None for anything that does not name one.
        Records written before the start time was a string carry an int: accepted."""
        if not isinstance(d, dict) or not isinstance(d.get("pid"), int) or isinstance(d.get("pid"), bool):
            return None
        start = d.get("start")
        return cls(d["pid"], "" if start is None else str(start))
