"""Running containers' shim logs, bounded on disk (issue 33).

gVisor's shim (containerd-shim-runsc-v1) opens <log_path>/runsc-shim-<id>.log once,
when it creates the container (pkg/shim/v1/runsc/container.go newContainer:
os.Create, so O_RDWR|O_CREAT|O_TRUNC and no O_APPEND), hands it to logrus, and
writes through that one descriptor until the shim exits: it never reopens the file
(no SIGHUP handler, no per-call open). So:
  - rotation by rename bounds nothing: the shim goes on writing the renamed file;
  - copy-and-truncate loses the lines written between the copy and the truncate, and
    the shim's next write lands at its old offset (no O_APPEND), so the size is back at
    once with a hole before it;
  - a lower level (runsc.toml log_level) drops the per-request debug lines (Stats, State,
    `Executing: runsc ...` for every runsc call, the stats of each poll: a container at
    debug writes a few hundred bytes every kubelet poll) but not warnings repeated per
    event, and containerd at debug (`-debug` to its shims) is the node's choice.
What is safe is to free the log's old bytes in place: fallocate(FALLOC_FL_PUNCH_HOLE |
FALLOC_FL_KEEP_SIZE) over everything before the last standin.shim_log_max_bytes (to the
end of a line). Neither the file's size nor the shim's offset changes, so its next
write lands where it would have; the blocks before the tail go back to the file system.
`du` then shows at most that bound (plus a block); `ls -l` shows a size that still
grows; a reader sees NUL bytes where the old lines were (`tail` reads the end as
before). At the container's delete the stand-in cuts the log to that tail as a new
file (go/internal/standin/logrotate.go).

thawd does it, on a thread every CHECK_S: the stand-in runs only when the shim calls
create, start, kill or delete (thaw-runsc passes every other call straight to runsc),
so no thaw code runs while a container just runs. Without thawd a running container's
log is bounded by its level only, and at its delete.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
import threading
from pathlib import Path

from control.logfields import fields

log = logging.getLogger("thawd")

CHECK_S = 60.0                 # seconds between passes over the shim logs
PATTERN = "runsc-shim-*.log"   # twin: go/internal/standin/logrotate.go shimLogName
# linux/falloc.h
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
# How far past the cut a line's end is looked for; a longer line is cut where it is.
_LINE_SCAN = 64 << 10

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def punch(path: Path, keep_bytes: int) -> int:
    """Free the disk blocks of log `path` before its last `keep_bytes` (from the end of
    the line the cut falls in); the bytes of disk freed (0: within the bound already).
    OSError when the file system cannot (EOPNOTSUPP) or the file cannot be opened."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        used = st.st_blocks * 512
        if not stat.S_ISREG(st.st_mode) or used <= keep_bytes + st.st_blksize:
            return 0
        cut = st.st_size - keep_bytes
        with open(path, "rb", opener=lambda p, _f: os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as r:
            r.seek(cut)
            nl = r.read(_LINE_SCAN).find(b"\n")
        end = cut + nl + 1 if nl >= 0 else cut
        if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, end) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), str(path))
        return max(0, used - os.fstat(fd).st_blocks * 512)
    finally:
        os.close(fd)


class ShimLogs:
    """The pass over <directory>/runsc-shim-*.log; `start()` runs it every `interval_s`
    on a daemon thread until `stop()`."""

    def __init__(self, directory: Path, keep_bytes: int, interval_s: float = CHECK_S) -> None:
        self.dir = directory
        self.keep = keep_bytes
        self.interval_s = interval_s
        self.freed = 0                 # bytes of disk freed since start
        self.unsupported = ""          # why the file system cannot (then the thread stops)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> int:
        """One pass: the bytes freed."""
        freed = 0
        for p in sorted(self.dir.glob(PATTERN)) if self.dir.is_dir() else []:
            try:
                n = punch(p, self.keep)
            except FileNotFoundError:
                continue               # its container was deleted meanwhile (logrotate.go removes it)
            except OSError as e:
                if e.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                    self.unsupported = f"{self.dir}: the file system cannot punch holes ({e.strerror})"
                    log.warning("running containers' shim logs stay unbounded until their delete: %s",
                                self.unsupported, extra=fields(path=str(self.dir), reason=self.unsupported))
                    self._stop.set()
                    return freed
                log.warning("shim log %s not bounded: %s", p, e, extra=fields(path=str(p), reason=str(e)))
                continue
            if n:
                log.info("shim log %s: freed %d bytes before its last %d", p, n, self.keep,
                         extra=fields(path=str(p), bytes=n))
            freed += n
        self.freed += freed
        return freed

    def start(self) -> "ShimLogs":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shim-logs", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - bounding logs must never stop thawd; it tries again later
                log.exception("shim logs")
            self._stop.wait(self.interval_s)
