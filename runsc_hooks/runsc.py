"""A typed client for the real runsc binary.

Option dataclasses render their own argv; every call goes through one choke
point (`Runsc._run`) that applies a timeout, logs argv / exit / duration and
raises `RunscError` carrying runsc's own message and the command line.
Shaped after gVisor's shim client (pkg/shim/v1/runsccmd/runsc.go).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shlex
import signal as _signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from control.errors import NotFound, PreconditionError, RunscError
from control.logfields import fields

log = logging.getLogger(__name__)


def subcommand_of(argv: list[str]) -> str:
    """The runsc subcommand in argv: the first word after the global flags."""
    skip_next = False
    for word in argv[1:]:
        if skip_next:
            skip_next = False
            continue
        if word.startswith("-"):
            # Global flags given as "--flag value" take the next word.
            skip_next = "=" not in word and word.lstrip("-") in _VALUE_FLAGS
            continue
        return word
    return "?"


# runsc global flags that take a separate value word (runsc/config/flags.go).
_VALUE_FLAGS = frozenset({
    "root", "log", "log-format", "debug-log", "debug-log-format", "panic-log", "coverage-report",
    "platform", "network", "file-access", "overlay2", "log-fd", "debug-log-fd", "panic-log-fd",
    "profile-block", "profile-cpu", "profile-heap", "profile-mutex", "trace", "nvproxy-driver-version",
    "nvproxy-allowed-driver-capabilities", "sidecar-usage-policy", "sidecar-release-enforcement-policy",
    "gso", "host-uds", "host-fifo", "watchdog-action", "panic-signal", "metric-server", "cgroupfs",
    "net-disconnect-ok", "reproduce-nftables", "pcap-log", "strace-syscalls", "strace-log-size",
    "tpuproxy", "restore-spec-validation", "systrap-init-scheme",
})


# Files runsc checkpoint writes into --image-path when uncompressed
# (runsc/cmd/checkpoint.go; docs/notes/gvisor-facts.md). Compressed images hold
# checkpoint.img only.
IMAGE_FILES = ("checkpoint.img", "pages_meta.img", "pages.img")
# The setting a Runsc's own deadline comes from (control/config.py; a timeout names it).
RUNSC_TIMEOUT_KEY = "runsc.timeout_s"

# runsc prints this when a container ID is not in --root
# (runsc/container/container.go Load: "container with id %q not found" /
# "file does not exist").
_NOT_FOUND_MARKERS = ("loading container: file does not exist", "container with id")


@dataclass(frozen=True)
class GlobalOptions:
    """runsc's global flags, given before the subcommand on every call.

    Restore needs the same global flags as the run that was saved
    (docs/notes/gvisor-facts.md), so one instance is used for a sandbox's lifetime.
    """
    root: Path
    platform: str = "systrap"
    network: str = "sandbox"
    log_path: Path | None = None          # --log (runsc's own log; errors as JSON lines)
    debug_log: Path | None = None         # --debug-log (a directory ending in / or a file)
    debug: bool = False
    nvproxy: bool = False
    extra: tuple[str, ...] = ()
    verbatim: bool = False                # extra holds the complete global flags (e.g. the shim's)

    def argv(self) -> list[str]:
        if self.verbatim:
            return list(self.extra)
        a = [f"--root={self.root}", f"--platform={self.platform}", f"--network={self.network}"]
        if self.log_path:
            a += [f"--log={self.log_path}", "--log-format=json"]
        if self.debug_log:
            a.append(f"--debug-log={self.debug_log}")
        if self.debug:
            a.append("--debug")
        if self.nvproxy:
            a.append("--nvproxy=true")
        a.extend(self.extra)
        return a


@dataclass(frozen=True)
class CreateOptions:
    bundle: Path
    pid_file: Path | None = None
    console_socket: Path | None = None
    user_log: Path | None = None

    def argv(self) -> list[str]:
        a = [f"--bundle={self.bundle}"]
        if self.pid_file:
            a.append(f"--pid-file={self.pid_file}")
        if self.console_socket:
            a.append(f"--console-socket={self.console_socket}")
        if self.user_log:
            a.append(f"--user-log={self.user_log}")
        return a


@dataclass(frozen=True)
class CheckpointOptions:
    image_path: Path
    leave_running: bool = False
    compression: str = "none"             # none | flate-best-speed
    exclude_committed_zero_pages: bool = False
    direct: bool = False
    cuda_checkpoint_path: str | None = None  # a path inside the container
    cuda_checkpoint_sequential: bool = False

    def argv(self) -> list[str]:
        a = [f"--image-path={self.image_path}", f"--compression={self.compression}"]
        if self.leave_running:
            a.append("--leave-running")
        if self.exclude_committed_zero_pages:
            a.append("--exclude-committed-zero-pages")
        if self.direct:
            a.append("--direct")
        if self.cuda_checkpoint_path:
            a.append(f"--cuda-checkpoint-path={self.cuda_checkpoint_path}")
        if self.cuda_checkpoint_sequential:
            a.append("--cuda-checkpoint-sequential")
        return a


@dataclass(frozen=True)
class RestoreOptions:
    image_path: Path
    create: CreateOptions | None = None   # restore alone also creates the container
    detach: bool = True
    background: bool = False
    direct: bool = False
    # Added to runsc's environment for this call only: a streamed restore
    # points GVISOR_SIDECAR_BINARIES_DIR at thaw-gofer (control/images/stream.py).
    env: tuple[tuple[str, str], ...] = ()

    def argv(self) -> list[str]:
        a = [f"--image-path={self.image_path}"]
        if self.create:
            a += self.create.argv()
        if self.detach:
            a.append("--detach")
        if self.background:
            a.append("--background")
        if self.direct:
            a.append("--direct")
        return a


@dataclass(frozen=True)
class ContainerState:
    """`runsc state` output (an OCI state plus runsc's extras)."""
    id: str
    status: str           # creating | created | running | stopped | paused
    pid: int
    bundle: str
    raw: dict = field(repr=False, default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> "ContainerState":
        return cls(id=d.get("id", ""), status=d.get("status", "unknown"), pid=int(d.get("pid") or 0),
                   bundle=d.get("bundle", ""), raw=d)


class Runsc:
    """One runsc binary with one set of global flags."""

    def __init__(self, binary: Path, options: GlobalOptions, timeout_s: float = 120.0) -> None:
        self.binary = Path(binary)
        self.options = options
        self.timeout_s = timeout_s

    # -- the choke point ---------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        return [str(self.binary), *self.options.argv(), *args]

    def _run(self, args: Sequence[str], timeout_s: float | None = None,
             check_id: str | None = None, env: Sequence[tuple[str, str]] = (),
             stdio: "int | tuple[int, int, int] | None" = None,
             timeout_key: str | None = None, umask: int = -1) -> subprocess.CompletedProcess:
        """Run one runsc command; raise RunscError (or NotFound) on failure.

        The deadline is `timeout_s`, else this client's (runsc.timeout_s); a
        timeout's message names what bounds it: `timeout_key`, else
        runsc.timeout_s for the client's own deadline.

        `check_id`: the container the command names, so "not found" becomes
        NotFound(container, id) instead of a generic runsc failure.
        `stdio`: a file descriptor to give runsc as stdout and stderr instead
        of capturing them. `create` and `restore` hand their own stdio to the
        workload (runsc/sandbox/sandbox.go: "pass our current stdio as the
        container stdio"; a restore maps the saved stdio onto the new one,
        runsc/boot/restore.go), so this is where the workload's output goes.
        runsc then writes its own error there too: give the Runsc a `log_path`
        (--log, JSON) so that RunscError still carries runsc's message.
        A triple (stdin, stdout, stderr) gives the workload all three (a parked
        sandbox's relay pipes, control/thawd/parking.py).
        """
        if not self.binary.is_file():
            raise PreconditionError(f"runsc not found at {self.binary}: run `make build` "
                                    "or set THAW_RUNSC_PATH", path=str(self.binary))
        argv = self.argv(*args)
        deadline = self.timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        # Output goes to anonymous files, not pipes: `create`, `run` and
        # `restore` fork the sandbox, which inherits stdout/stderr and would
        # hold a pipe open long after runsc itself has exited.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            # Wait in waitpid, with a timer that kills runsc at the deadline:
            # subprocess's wait(timeout=) polls with sleeps growing to 50 ms,
            # which added up to ~50 ms to every runsc call (bench/cli_speed.py).
            if isinstance(stdio, tuple):
                fin, fout, ferr = stdio
            else:
                fin, fout, ferr = subprocess.DEVNULL, (out if stdio is None else stdio), \
                    (err if stdio is None else stdio)
            child = subprocess.Popen(argv, stdout=fout, stderr=ferr, stdin=fin,
                                     env={**os.environ, **dict(env)} if env else None, umask=umask)
            timer = threading.Timer(deadline, child.kill)
            timer.daemon = True
            timer.start()
            try:
                rc = child.wait()
            finally:
                timer.cancel()
            dt = time.monotonic() - t0
            if rc == -_signal.SIGKILL and dt >= deadline:
                log.warning("runsc timed out after %.1fs: %s", dt, shlex.join(argv),
                            extra=fields(duration_s=round(dt, 3), argv=shlex.join(argv)))
                key = timeout_key or (RUNSC_TIMEOUT_KEY if timeout_s is None else "")
                raise RunscError(argv, None, _read(err),
                                 f"no answer within {deadline:g} s" + (f" ({key})" if key else ""), dt,
                                 subcommand=args[0])
            proc = subprocess.CompletedProcess(argv, rc, _read(out), _read(err))
        dt = time.monotonic() - t0
        log.debug("runsc exit=%d %.3fs: %s", proc.returncode, dt, shlex.join(argv),
                  extra=fields(exit=proc.returncode, duration_s=round(dt, 4), argv=shlex.join(argv)))
        if proc.returncode != 0:
            message = self._error_message(proc.stderr)
            if check_id is not None and _is_not_found(message, check_id):
                raise NotFound("container", check_id, f"runsc --root={self.options.root} has no such sandbox")
            raise RunscError(argv, proc.returncode, proc.stderr, message, dt, subcommand=args[0])
        return proc

    def _error_message(self, stderr: str) -> str:
        """runsc's own error: the last JSON error line in --log, else stderr's last line.

        runsc (runsc/cmd/util.Errorf) writes the message to stderr and, when
        --log is set, appends {"msg","level":"error","time"} to the log.
        """
        if self.options.log_path and self.options.log_path.is_file():
            try:
                with open(self.options.log_path, "rb") as f:
                    f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
                    lines = f.read().decode(errors="replace").splitlines()
                for line in reversed(lines):
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("level") == "error" and rec.get("msg"):
                        return _one_message(str(rec["msg"]), self.options.log_path)
            except OSError:
                pass
        lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        # runsc's log lines to stderr start with a level letter and a timestamp
        # ("W1129 11:30:00.000 ..."); the error itself is a plain line. A Go
        # panic ends in stack frames ("\t/src/x.go:12 +0x3f", "goroutine 1
        # [running]:"): never the message (issue 14, ENOSPC at checkpoint).
        # A line that is only punctuation (the H200's failed GPU save ended its
        # message part in a lone ":") says nothing either. An errno text wins
        # wherever it is, even inside a frame's argument list.
        plain = [ln for ln in lines if not (len(ln) > 5 and ln[0] in "IWDE" and ln[1:5].isdigit())
                 and not _STACK_FRAME.search(ln) and any(c.isalnum() for c in ln)]
        errno_lines = [ln for ln in lines if any(t in ln.lower() for t in _ERRNO_TEXT)]
        # A recovered panic's own text sits above its goroutine dump.
        panics = [ln for ln in plain if "panic:" in ln]
        return (errno_lines or panics or plain or ["runsc printed no error message"])[-1]

    # -- subcommands ---------------------------------------------------------

    def version(self) -> str:
        out = self._run(["--version"]).stdout
        first = out.splitlines()[0] if out else ""
        return first.removeprefix("runsc version ").strip()

    def create(self, cid: str, opts: CreateOptions, timeout_s: float | None = None,
               stdio: int | None = None) -> None:
        """`stdio`: the workload's stdout and stderr (see _run); default: an
        anonymous file runsc's own output is read from."""
        self._run(["create", *opts.argv(), cid], timeout_s, stdio=stdio)

    def start(self, cid: str, timeout_s: float | None = None) -> None:
        self._run(["start", cid], timeout_s, check_id=cid)

    def state(self, cid: str) -> ContainerState:
        out = self._run(["state", cid], check_id=cid).stdout
        try:
            return ContainerState.from_json(json.loads(out))
        except ValueError:
            raise RunscError(self.argv("state", cid), 0, out, "runsc state printed no JSON",
                             subcommand="state") from None

    def kill(self, cid: str, sig: int = _signal.SIGTERM, all_processes: bool = False) -> None:
        args = ["kill"] + (["--all"] if all_processes else []) + [cid, str(int(sig))]
        self._run(args, check_id=cid)

    def delete(self, cid: str, force: bool = False) -> None:
        self._run(["delete"] + (["--force"] if force else []) + [cid], check_id=cid)

    def wait(self, cid: str, timeout_s: float | None = None, restore: bool = False,
             timeout_key: str | None = None) -> int:
        """Wait for the container (or, with restore=True, for restore to finish); exit status."""
        args = ["wait"] + (["--restore"] if restore else []) + [cid]
        out = self._run(args, timeout_s, check_id=cid, timeout_key=timeout_key).stdout
        try:
            return int(json.loads(out).get("exitStatus", 0)) if out.strip() else 0
        except ValueError:
            return 0

    def exec(self, cid: str, argv: Sequence[str], timeout_s: float | None = None,
             timeout_key: str | None = None) -> subprocess.CompletedProcess:
        """Run `argv` inside the container (`runsc exec`); RunscError when it exits non-zero.

        Processes started this way are killed at a later restore
        (docs/notes/gvisor-facts.md): use it for commands that finish, like hooks.
        """
        return self._run(["exec", cid, *argv], timeout_s, check_id=cid, timeout_key=timeout_key)

    def checkpoint(self, cid: str, opts: CheckpointOptions, timeout_s: float | None = None,
                   timeout_key: str | None = None) -> None:
        """With umask 077: runsc creates the image directory and files (runsc/sandbox
        createSaveFiles, mode 0644 and the caller's umask) and they hold the workload's
        memory, owner-only whatever the caller's umask (issue 30). `timeout_key`: what
        a timeout names as its bound (a scaled deadline, control/lifecycle/deadlines.py)."""
        self._run(["checkpoint", *opts.argv(), cid], timeout_s, check_id=cid, umask=0o077,
                  timeout_key=timeout_key)

    def restore(self, cid: str, opts: RestoreOptions, timeout_s: float | None = None,
                stdio: "int | tuple[int, int, int] | None" = None, timeout_key: str | None = None) -> None:
        """`stdio`: as for create; the restored workload's stdout and stderr."""
        self._run(["restore", *opts.argv(), cid], timeout_s, env=opts.env, stdio=stdio, timeout_key=timeout_key)

    def memory_usage(self, cid: str) -> int:
        """The sandbox's memory as runsc accounts it (`runsc events --stats`:
        data.memory.usage.usage, the sentry's own count, its tmpfs files included)."""
        out = self._run(["events", "--stats", cid], check_id=cid).stdout
        try:
            usage = json.loads(out)["data"]["memory"]["usage"]["usage"]
        except (ValueError, KeyError, TypeError):
            usage = None
        if not isinstance(usage, int) or usage < 0:
            raise RunscError(self.argv("events", "--stats", cid), 0, out[-500:],
                             "runsc events --stats printed no memory usage", subcommand="events")
        return usage

    def pids(self, cid: str) -> list[int]:
        """The container's process ids in the sandbox's pid namespace. `runsc ps
        --format=json` prints only the pids, as runc does (runsc/cmd/ps.go ->
        control.PrintPIDsJSON at the pin), not Process objects."""
        out = self._run(["ps", "--format=json", cid], check_id=cid).stdout
        try:
            data = json.loads(out) if out.strip() else []
        except ValueError:
            data = None
        if not isinstance(data, list) or not all(isinstance(p, int) for p in data):
            raise RunscError(self.argv("ps", "--format=json", cid), 0, out, "runsc ps printed no JSON list of pids",
                             subcommand="ps")
        return data

    def list(self) -> list[ContainerState]:
        out = self._run(["list", "--format=json"]).stdout
        try:
            data = json.loads(out) if out.strip() else []
        except ValueError:
            raise RunscError(self.argv("list", "--format=json"), 0, out, "runsc list printed no JSON",
                             subcommand="list") from None
        return [ContainerState.from_json(d) for d in (data or [])]

    def cpu_features(self) -> list[str]:
        out = self._run(["cpu-features"]).stdout
        return sorted(w for w in out.replace(",", " ").split() if w)

    def nvproxy_supported_drivers(self) -> list[str]:
        """NVIDIA driver versions this runsc's nvproxy supports (strict ABI match)."""
        out = self._run(["nvproxy", "list-supported-drivers"]).stdout
        return [w for w in out.split() if w]

    def exists(self, cid: str) -> bool:
        """Whether runsc has a container `cid` (exactly this id) under its root.

        runsc keeps one state file per container, `<root>/<id>_sandbox:<sandbox
        id>.state` (runsc/container/state_file.go buildPath); looking for it
        costs no runsc process (~15 ms each here, bench/cli_speed.py), and it
        names the id exactly, where `runsc state` would resolve a prefix."""
        import glob
        root = self.options.root
        if root is not None and Path(root).is_dir():
            return bool(glob.glob(os.path.join(glob.escape(str(root)), glob.escape(cid) + "_sandbox:*.state")))
        try:
            self.state(cid)
            return True
        except NotFound:
            return False


# runsc pins an empty "null" network namespace for gofers by bind-mounting it
# at <root>/null-netns (runsc/container/null_netns.go); concurrent creations
# may stack several mounts there. A runsc root directory cannot be removed
# until they are unmounted (runsc's own `do` does the same:
# specutils.UnmountNullNetNS). Twin of that function.
NULL_NETNS = "null-netns"
_MNT_DETACH = 2


def release_root(root: Path) -> None:
    """Unmount every null-netns bind mount under runsc root `root`."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    path = str(Path(root) / NULL_NETNS).encode()
    for _ in range(64):
        if libc.umount2(path, _MNT_DETACH) != 0:
            break


def remove_root(root: Path) -> None:
    """Remove a runsc root directory (its sandboxes must be deleted already)."""
    import shutil
    release_root(root)
    shutil.rmtree(root, ignore_errors=True)


# Where the host mounts its cgroups, as runsc assumes (runsc/cgroup/cgroup.go cgroupRoot).
CGROUP_FS = Path("/sys/fs/cgroup")


def cgroup_dirs(path: str, fs: Path = CGROUP_FS) -> list[Path]:
    """The existing directories of cgroupfs path `path` (a spec's linux.cgroupsPath) under
    `fs`: the one directory on a cgroup v2 host, else one per v1 hierarchy. Only absolute
    cgroupfs paths: a systemd one (slice:prefix:name) is a unit systemd removes. Twin:
    go/internal/standin/cgroups.go cgroupDirs."""
    if not path.startswith("/") or ":" in path:
        return []
    rel = os.path.normpath(path).lstrip("/")
    if not rel or rel == ".":
        return []
    if (fs / "cgroup.controllers").exists():
        cands = [fs / rel]
    else:
        try:
            cands = sorted(fs / e.name / rel for e in os.scandir(fs) if e.is_dir(follow_symlinks=False))
        except OSError:
            return []
    return [d for d in cands if d.is_dir()]


def remove_cgroups(dirs: list[Path], wait_s: float = 0.0) -> tuple[list[str], list[str]]:
    """rmdir each cgroup directory (the kernel refuses one with processes or children, so
    one in use stays), retrying a busy one until wait_s has passed (processes just killed
    leave it as they exit). (removed, left with why). For the cgroups of a sandbox runsc no
    longer knows: runsc's own delete removes only those it made and still knows of
    (runsc/container/container.go stop -> Uninstall of owned controllers)."""
    end = time.monotonic() + wait_s
    removed: list[str] = []
    left: list[str] = []
    for d in dirs:
        while True:
            try:
                os.rmdir(d)
                removed.append(str(d))
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno == errno.EBUSY and time.monotonic() < end:
                    time.sleep(0.05)
                    continue
                left.append(f"{d}: {e.strerror}")
            break
    return removed, left


# Lines of a Go stack trace: frames ("/path/file.go:123 +0x1f"), calls
# ("pkg.Func(0xc000012345, ...)", "reflect.Value.Call({0x1d4e096a07e0?, ...})",
# "pkg.(*Server).StartHandling.func1()": no space in
# it, seen on the H200), goroutine headers, "created by", "exit status".
_STACK_FRAME = re.compile(r"\.go:\d+( \+0x[0-9a-f]+)?$|^goroutine \d+ \[|^created by |0x[0-9a-f]+\??[,)}]|^\S*\(\S*\)$"
                          r"|^\[signal |^exit status \d+$")
# errno texts worth surfacing over any other line of runsc's output.
_ERRNO_TEXT = ("no space left on device", "disk quota exceeded", "read-only file system", "permission denied")


# The longest runsc message a RunscError carries; the rest stays in runsc's --log file.
MAX_MESSAGE = 600


def _one_message(msg: str, log_path: Path | None = None) -> str:
    """runsc's --log error as a one-line message: the lines before a goroutine dump, no
    stack frames, at most MAX_MESSAGE characters. A restore whose sentry panicked logs the
    panic and every goroutine's stack in one "msg" (8,289 characters in issue 30's
    reproduction); the dump belongs in runsc's log, where it stays, not in an error line."""
    kept: list[str] = []
    for ln in msg.splitlines():
        ln = ln.strip()
        if ln.startswith("goroutine ") and "[" in ln:
            break                       # the dump: everything from here on is stacks
        if ln and not _STACK_FRAME.search(ln) and any(c.isalnum() for c in ln):
            kept.append(ln)
    text = "; ".join(kept) or "runsc logged an error without a message"
    if len(text) > MAX_MESSAGE or len(kept) < len([x for x in msg.splitlines() if x.strip()]):
        where = f" (runsc's log {log_path} has all of it)" if log_path else ""
        text = (text[:MAX_MESSAGE].rstrip() + " ...") if len(text) > MAX_MESSAGE else text
        text += where
    return text


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def _is_not_found(message: str, cid: str) -> bool:
    m = message.lower()
    return any(s in m for s in _NOT_FOUND_MARKERS)
