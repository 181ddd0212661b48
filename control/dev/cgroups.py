"""cgroupfs directories of the dev cluster's nodes (control/dev/clusternode.py):
made in every mounted hierarchy (cgroup v1's controllers, the named systemd
one and, on a hybrid host, the unified one: runc and the kubelet's cgroupfs
driver use each), the processes in a subtree found and killed, the tree
removed. A path is cgroup-absolute ("/thaw-cluster-dev/a").
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from control.errors import ThawError, Timeout


def hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 and v2)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        f = line.split()
        if len(f) > 2 and f[2] in ("cgroup", "cgroup2"):
            out.append(Path(f[1]))
    return out


def procs_files(path: str) -> list[Path]:
    return [h / path.lstrip("/") / "cgroup.procs" for h in hierarchies()]


def create(path: str) -> None:
    """`path` and its parents in every hierarchy; a new cpuset directory gets its
    parent's CPUs and memory nodes (cgroup v1 starts it with none, and nothing
    can join it then)."""
    parts = path.strip("/").split("/")
    for h in hierarchies():
        d = h
        for p in parts:
            parent, d = d, d / p
            if d.is_dir():
                continue
            d.mkdir()
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (d / knob).exists() and not (d / knob).read_text().strip():
                    (d / knob).write_text((parent / knob).read_text())


def member(pid: int, path: str) -> bool:
    """Is process `pid` alive in `path` or below it, in any hierarchy? (A zombie
    waiting for its parent, e.g. the harness, to reap it is not alive.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    prefix = path.rstrip("/")
    for line in lines:
        cg = line.split(":", 2)[-1]
        if cg == prefix or cg.startswith(prefix + "/"):
            return True
    return False


def pids(path: str) -> set[int]:
    out: set[int] = set()
    for h in hierarchies():
        top = h / path.lstrip("/")
        if not top.is_dir():
            continue
        for d, _, _ in os.walk(top):
            try:
                out.update(int(x) for x in (Path(d) / "cgroup.procs").read_text().split())
            except OSError:
                continue
    return out


def kill_all(path: str, timeout_s: float = 20) -> list[str]:
    """SIGKILL every process in the subtree until none is left; returns what was
    killed ("pid comm"), for the caller to report."""
    killed: list[str] = []
    end = time.monotonic() + timeout_s
    while True:
        left = pids(path)
        if not left:
            return killed
        if time.monotonic() > end:
            raise Timeout(f"the processes of cgroup {path} to exit (left: {sorted(left)})", timeout_s)
        for pid in left:
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{pid} {comm}")
            except (OSError, ProcessLookupError):
                pass
        time.sleep(0.1)


def remove(path: str, timeout_s: float = 10) -> None:
    """The subtree's directories, deepest first, in every hierarchy. A cgroup
    whose last process just died may refuse (EBUSY) for a moment."""
    for h in hierarchies():
        top = h / path.lstrip("/")
        if not top.is_dir():
            continue
        dirs = sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
        for d in dirs:
            end = time.monotonic() + timeout_s
            while d.exists():
                try:
                    d.rmdir()
                except OSError as e:
                    if time.monotonic() > end:
                        raise ThawError(f"cgroup {d} could not be removed: {e}") from None
                    time.sleep(0.1)
