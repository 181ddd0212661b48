"""A CLI sandbox's output and exit status: the monitor that keeps them, and
what `thaw logs` and `thaw ps` read.

`runsc create` and `runsc restore` give the workload their own stdout and
stderr (runsc/sandbox/sandbox.go; a restore maps the saved stdio onto the
restoring process's, runsc/boot/restore.go). thaw gives them the write end of
a pipe whose read end belongs to one `thaw-monitor` process per sandbox
(go/cmd/thaw-monitor, beside runsc). The monitor outlives the thaw command:

- it copies the pipe into <log_dir>/sandboxes/<id>/workload.log, rotated to
  workload.log.1 whenever the next write would make it larger than
  node.log_max_bytes, so a sandbox's log never takes more than twice that;
- once thaw says the workload started (one byte on a second pipe), it runs
  `runsc wait` and writes the exit status to exit.json atomically.

Why a process and not a file: a file given to runsc directly can be neither
bounded nor rotated (the sandbox holds it open, O_APPEND, forever), and only
a `runsc wait` that started before the workload exited can learn its exit
status (runsc/sandbox/sandbox.go Wait: "sandbox no longer running and its exit
status is unavailable" otherwise). Why Go: ~2 MB resident, no interpreter or
virtualenv that an upgrade could change under running sandboxes. The one
`runsc wait` per sandbox is runsc's own API for the exit status.

runsc's own messages for create/restore go to <dir>/runsc.log (--log, JSON
lines) so that a failure still has runsc's message although its stderr is the
workload's pipe.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from control.config import Settings
from control.errors import PreconditionError
from control.files import Owner, process_start

# Beside runsc (build/ or <node.install_dir>/bin). Twin: go/cmd/thaw-monitor,
# control/node/provision.py BINARIES.
MONITOR_BINARY = "thaw-monitor"
LOG_FILE = "workload.log"
ROTATED_SUFFIX = ".1"
EXIT_FILE = "exit.json"         # twin: go/cmd/thaw-monitor/wait.go exitRecord
RUNSC_LOG = "runsc.log"
MONITOR_LOG = "monitor.log"
MIN_MAX_BYTES = 64 << 10        # twin: go/cmd/thaw-monitor/log.go minMaxBytes
STOP_TIMEOUT_S = 10.0           # how long delete waits for the monitor to drain and exit
# How long a reader that saw the container stopped waits for its monitor to write
# the exit status: runsc reports a container stopped a few ms before `runsc wait`
# (the monitor's child) returns and the monitor writes exit.json.
EXIT_SETTLE_S = 2.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Exit:
    """What exit.json says: the workload's exit status (128+N: killed by signal N),
    or None with `error` when runsc could not tell it."""
    status: int | None
    finished_at: float
    error: str = ""

    def to_dict(self) -> dict:
        return {"exit_status": self.status, "finished_at": self.finished_at, "error": self.error}

    def describe(self) -> str:
        if self.status is None:
            return f"exit status unknown ({self.error})" if self.error else "exit status unknown"
        if self.status > 128:
            try:
                return f"exit status {self.status} (killed by {signal.Signals(self.status - 128).name})"
            except ValueError:
                pass
        return f"exit status {self.status}"


@dataclass(frozen=True)
class SandboxLogs:
    """The files of one sandbox under <log_dir>/sandboxes/<id>/."""
    dir: Path

    @classmethod
    def of(cls, settings: Settings, sid: str) -> "SandboxLogs":
        return cls(settings.log_dir / "sandboxes" / sid)

    @property
    def log(self) -> Path:
        return self.dir / LOG_FILE

    @property
    def rotated(self) -> Path:
        return self.dir / (LOG_FILE + ROTATED_SUFFIX)

    @property
    def exit_file(self) -> Path:
        return self.dir / EXIT_FILE

    @property
    def runsc_log(self) -> Path:
        return self.dir / RUNSC_LOG

    def exit(self) -> Exit | None:
        return read_exit(self.exit_file)

    def tail(self, lines: int | None = None) -> tuple[bytes, int]:
        """The last `lines` lines of the log (all of it with None), across the
        rotation, and how many bytes of the current file were read (where a
        follow goes on from)."""
        old = _read_from(self.rotated, 0)
        cur = _read_from(self.log, 0)
        data = old + cur
        if lines is None:
            return data, len(cur)
        if lines <= 0:
            return b"", len(cur)
        parts = data.split(b"\n")
        if parts and parts[-1] == b"":
            parts = parts[:-1]
            return (b"\n".join(parts[-lines:]) + b"\n" if parts else b""), len(cur)
        return b"\n".join(parts[-lines:]), len(cur)


def read_exit(path: Path) -> Exit | None:
    """exit.json, or None when the monitor has not written it (yet)."""
    try:
        d = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return Exit(None, 0.0, f"{path} is not valid JSON")
    status = d.get("exit_status")
    return Exit(status if isinstance(status, int) and not isinstance(status, bool) else None,
                float(d.get("finished_at") or 0.0), str(d.get("error") or ""))


class Monitor:
    """One sandbox's thaw-monitor, started before `runsc create`/`restore`.

    Give `stdio` to runsc, then call `created()` (runsc returned, either way:
    thaw's copy of the pipe's write end is closed), then `started()` once the
    workload runs, or `abandon()` when it never will.
    """

    def __init__(self, settings: Settings, sid: str, wait_argv: list[str]) -> None:
        binary = settings.runsc_path.parent / MONITOR_BINARY
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise PreconditionError(f"{binary} not found: the sandbox's log and exit status need it "
                                    "(run `make setup`, or `thaw provision` on a node)", path=str(binary))
        self.logs = SandboxLogs.of(settings, sid)
        self.logs.dir.mkdir(parents=True, exist_ok=True)
        for p in (self.logs.exit_file, self.logs.log, self.logs.rotated, self.logs.runsc_log):
            p.unlink(missing_ok=True)  # a deleted sandbox's of the same id
        log_r, log_w = os.pipe()
        start_r, start_w = os.pipe()
        try:
            with open(self.logs.dir / MONITOR_LOG, "ab") as err:
                proc = subprocess.Popen(
                    [str(binary), f"-log={self.logs.log}", f"-max-bytes={settings.log_max_bytes}",
                     f"-exit-file={self.logs.exit_file}", f"-start-fd={start_r}", "--", *wait_argv],
                    stdin=log_r, stdout=subprocess.DEVNULL, stderr=err, pass_fds=(start_r,),
                    start_new_session=True)
        except BaseException:
            for fd in (log_w, start_w):
                os.close(fd)
            raise
        finally:
            os.close(log_r)
            os.close(start_r)
        self.pid = proc.pid
        # The monitor outlives this process (thaw exits; init reaps it). Popen
        # would warn that a child still runs when the object goes: it is meant
        # to. A long-lived caller (tests, benchmarks) reaps it in stop_monitor.
        proc.returncode = 0
        self.owner = Owner(proc.pid, process_start(proc.pid))
        self.stdio: int | None = log_w
        self._start: int | None = start_w

    def created(self) -> None:
        if self.stdio is not None:
            os.close(self.stdio)
            self.stdio = None

    def started(self) -> None:
        """The workload runs: the monitor may `runsc wait` for it now."""
        self.created()
        if self._start is not None:
            try:
                os.write(self._start, b"s")
            finally:
                os.close(self._start)
                self._start = None

    def abandon(self) -> None:
        """The workload will not run: the monitor ends when the pipe closes."""
        self.created()
        if self._start is not None:
            os.close(self._start)
            self._start = None

    def to_dict(self) -> dict:
        return self.owner.to_dict()


def settled_exit(logs: SandboxLogs, monitor: dict | None, timeout_s: float = EXIT_SETTLE_S) -> Exit | None:
    """The exit status of a container runsc already says is stopped: at once when
    its monitor wrote it, else after waiting (at most `timeout_s`) while the monitor
    still runs and is about to; None when no monitor saw the exit."""
    deadline = time.monotonic() + timeout_s
    while True:
        ex = logs.exit()
        if ex is not None or time.monotonic() >= deadline or not monitor_alive(monitor):
            return ex if ex is not None else logs.exit()   # the monitor may have just written it
        time.sleep(0.02)


def monitor_alive(owner: dict | None) -> bool:
    """The recorded monitor still runs (not a zombie of this very process)."""
    o = Owner.from_dict(owner)
    if o is None or not o.alive():
        return False
    try:
        state = Path(f"/proc/{o.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        _reap(o.pid)
        return False
    return True


def stop_monitor(owner: dict | None, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Wait for a sandbox's monitor to exit (it does once the sandbox is gone
    and the pipe drained); SIGKILL it past `timeout_s`."""
    o = Owner.from_dict(owner)
    if o is None:
        return
    deadline = time.monotonic() + timeout_s
    while monitor_alive(owner) and time.monotonic() < deadline:
        time.sleep(0.02)
    if monitor_alive(owner):
        try:
            os.kill(o.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.05)
        monitor_alive(owner)  # reaps it when it is this process's child


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not ours: init reaps it


def follow(logs: SandboxLogs, start_at_end_of: int | None, alive, poll_s: float = 0.2,
           out=None) -> Iterator[bytes]:
    """New bytes of the log as they come, across rotations, until `alive()` is
    false and everything written is read. `start_at_end_of`: the size of the
    current file already shown (None: from its start)."""
    pos = start_at_end_of or 0
    ino = _ino(logs.log)
    while True:
        running = alive()
        cur = _ino(logs.log)
        if cur != ino and ino is not None:
            # Rotated: the rest of the old file is workload.log.1 now.
            if _ino(logs.rotated) == ino:
                chunk = _read_from(logs.rotated, pos)
                if chunk:
                    yield chunk
            pos, ino = 0, cur
        elif ino is None:
            ino = cur
        chunk = _read_from(logs.log, pos)
        if chunk:
            pos += len(chunk)
            yield chunk
        if not running:
            return
        time.sleep(poll_s)


def _ino(p: Path) -> int | None:
    try:
        return p.stat().st_ino
    except FileNotFoundError:
        return None


def _read_from(p: Path, pos: int) -> bytes:
    try:
        with open(p, "rb") as f:
            f.seek(pos)
            return f.read()
    except FileNotFoundError:
        return b""


def keep_log(logs: SandboxLogs, dest: Path, max_bytes: int) -> None:
    """The last `max_bytes` of a sandbox's log (from a line's start) into `dest`; nothing when empty."""
    from control.files import write_bytes_atomic
    data, _ = logs.tail()
    if len(data) > max_bytes:
        data = data[-max_bytes:]
        cut = data.find(b"\n")
        data = data[cut + 1:] if 0 <= cut < len(data) - 1 else data
    if data:
        write_bytes_atomic(dest, data)


def replay_log(src: Path, fd: int | None, max_bytes: int) -> None:
    """A checkpointed log (keep_log) into a restoring sandbox's log pipe, before
    runsc gets it: the monitor reads the pipe meanwhile. Best effort: a restore
    never fails for its old log."""
    try:
        with open(src, "rb") as f:
            data = f.read(max_bytes)
    except FileNotFoundError:
        return   # an image of a thaw before issue 31, or a workload that printed nothing
    except OSError as e:
        log.warning("the checkpointed log %s: %s", src, e)
        return
    view = memoryview(data)
    try:
        while view and fd is not None:
            view = view[os.write(fd, view):]
    except OSError as e:
        log.warning("replaying the checkpointed log %s: %s", src, e)
