"""What a parked sandbox is (control/thawd/parking.py has the policy): its record
and its template, which container may adopt it (the spec fingerprint, the global
flags, the stdio kinds), the flags its own runsc calls take, where its cgroup
goes, the host memory it holds, and the host processes that are its own.

A new container adopts a parked sandbox only when its runsc root, its global
flags (less the per-container log paths) and its spec (less its root path, its
cgroups path and which loopback-only network namespace it names) equal the
template's: thaw makes those for the parked sandbox, and its processes cannot
tell.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from control.errors import ThawError
from control.lifecycle import pod as podmod
from runsc_hooks import spec as specmod

log = logging.getLogger("thawd")

# <runsc root>/<ALIAS_PREFIX><container id> -> <parked id>. Twin:
# go/internal/runscargv/argv.go AliasPrefix.
ALIAS_PREFIX = "thaw-alias."
RELAY_BINARY = "thaw-relay"          # beside runsc, as thaw-monitor (go/cmd/thaw-relay)
PARKED_DIR = "parked"
RECORD = "parked.json"
RUNSC_LOG = "runsc.log.json"
ID_PREFIX = "thaw-parked-"
NETNS_PREFIX = "thawpark-"           # not runsc_hooks/netns.py's "thaw-": no veth, no gate
# Global flags whose value names a per-container file (the shim's --log is
# <bundle>/log.json, its --panic-log the pod's log dir): not part of what an
# adopter must share with the template, and rewritten into the parked
# sandbox's own directory for the park's runsc calls.
PER_CONTAINER_FLAGS = ("log", "panic-log")
# How long a park waits for its relay to listen.
RELAY_READY_TIMEOUT_S = 10.0
# How often idle parked sandboxes are looked for.
EXPIRE_EVERY_S = 30.0
# How long thawd's stop waits for containerd to remove a parked sandbox's snapshot.
CLOSE_TIMEOUT_S = 5.0

PARKING, PARKED, ADOPTING, ADOPTED = "parking", "parked", "adopting", "adopted"

# A parked sandbox gets the template's stdio kinds (containers.STDIO_KINDS;
# null: /dev/null; pipe: a pipe to its relay) and is adopted only by a container
# whose kinds are the same.
PARKABLE_STDIO = ("null", "pipe")


@dataclass
class Template:
    """What parking a workload needs, learned from its last container on this node."""
    key: str
    root: str
    flags: list[str]
    spec: dict
    namespace: str
    snapshotter: str
    parent: str                       # the image's layer chain id (containerd snapshot parent)
    last_demand: float = 0.0          # time.time() of the last start of this key
    stdio: str = "null,null,null"     # the template container's stdin, stdout, stderr kinds


@dataclass
class Parked:
    id: str
    key: str
    root: str
    flags: list[str]                  # the template's, as given (compared with an adopter's)
    dir: str
    fingerprint: str
    state: str = PARKING
    pid: int = 0                      # the sandbox process (the shim's pid file)
    relay_pid: int = 0
    relay_socket: str = ""
    cuda_pids: list[int] = field(default_factory=list)
    host_bytes: int = 0               # its memory file on the host, measured once parked
    estimate_bytes: int = 0           # the image's size, counted while it parks
    parked_s: float = 0.0
    created: float = 0.0
    adopted_by: str = ""
    snapshotter: str = ""
    namespace: str = ""
    netns: str = ""                   # the loopback-only network namespace thaw made for it, by name
    stdio: str = "null,null,null"     # its stdin, stdout, stderr: what an adopter's must be too

    def cost(self) -> int:
        return self.host_bytes or self.estimate_bytes


class ParkError(ThawError):
    """A park that could not be made (nothing of it is left)."""


# Stands for the path of a loopback-only network namespace in a spec's fingerprint.
LOOPBACK_ONLY = "<loopback-only>"


def _normalized(spec: dict) -> dict:
    s = copy.deepcopy(spec)
    s.get("root", {}).pop("path", None)
    (s.get("linux") or {}).pop("cgroupsPath", None)
    ann = s.get("annotations") or {}
    if ann.get(podmod.CRI_CONTAINER_TYPE) == "sandbox":
        # A lone container under gVisor's shim is its own pod's root, and names itself as
        # its sandbox (docs/containerd.md, "A lone container must be a pod root").
        ann.pop(podmod.CRI_SANDBOX_ID, None)
    for ns in (s.get("linux") or {}).get("namespaces") or []:
        if ns.get("type") == "network" and ns.get("path"):
            ns["path"] = LOOPBACK_ONLY
    return s


def spec_differences(a: dict, b: dict, limit: int = 5) -> list[str]:
    """The first `limit` places where two specs differ in what `fingerprint` covers
    (dotted paths), for the log line that says why a container did not adopt."""
    out: list[str] = []

    def walk(x, y, path: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{path}.{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{path}[{i}]")
        elif x != y:
            out.append(f"{path.lstrip('.')}: {json.dumps(x)[:80]} vs {json.dumps(y)[:80]}")
    walk(_normalized(a), _normalized(b), "")
    return out


def fingerprint(spec: dict) -> str:
    """What an adopter's spec must share with a parked sandbox's: all of it but the
    root filesystem's path, the cgroups path and which loopback-only network
    namespace it names (thaw makes each for the parked sandbox; the processes
    cannot tell). A spec that names a network namespace is parkable only when that
    namespace is loopback-only (`parkable`)."""
    s = _normalized(spec)
    return hashlib.sha256(json.dumps(s, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def shared_flags(flags) -> list[str]:
    """Global flags less the per-container log paths (PER_CONTAINER_FLAGS)."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        name = f.lstrip("-").split("=", 1)[0]
        if name in PER_CONTAINER_FLAGS:
            skip = "=" not in f
            continue
        out.append(f)
    return out


def flag_set(flags) -> list[str]:
    """What an adopter's global flags must equal: shared_flags in a fixed order (the
    shim renders runsc.toml's options from a Go map: their order changes from call
    to call, pkg/shim/v1/runsccmd Runsc.args)."""
    return sorted(shared_flags(flags))


def park_flags(flags, directory: Path) -> list[str]:
    """The template's global flags for the park's own runsc calls: runsc's log (and
    panic log, where the shim gave one) in the parked sandbox's directory, JSON, so
    that a failure carries runsc's own message (Runsc._error_message); everything
    else as the shim gave it (restore wants the run's flags)."""
    out = [f for f in shared_flags(flags) if f.lstrip("-").split("=", 1)[0] != "log-format"]
    out += [f"--log={directory / RUNSC_LOG}", "--log-format=json"]
    if any(f.lstrip("-").split("=", 1)[0] == "panic-log" for f in flags):
        out.append(f"--panic-log={directory / 'panic.log'}")
    return out


def parkable(spec: dict) -> str:
    """Why a lone container's spec cannot be parked; "" when it can. Its network:
    a new namespace (no path: runsc makes an empty one, as for the parked sandbox),
    or one with only its loopback up (thaw makes one like it for the parked
    sandbox: the workload sees the same network). A namespace with any other
    interface was plumbed for this container before its create, and a sandbox
    cannot move into it."""
    path = specmod.netns_path(spec)
    if path:
        from runsc_hooks import netns as netnsmod
        try:
            lo_only = netnsmod.loopback_only(path)
        except Exception as e:  # noqa: BLE001 - an unreadable namespace is not parkable
            return f"its network namespace {path} cannot be read ({e})"
        if not lo_only:
            return (f"it joins network namespace {path}, which has interfaces besides its loopback "
                    "(a parked sandbox cannot move into it)")
    if (spec.get("process") or {}).get("terminal"):
        return "it has a terminal"
    if not (spec.get("root") or {}).get("path"):
        return "its spec names no root filesystem"
    return ""


def cgroups_path(path: str, parked_id: str) -> str:
    """The parked sandbox's cgroup: beside the template's, named after the parked id
    (cgroupfs "/a/b/id" -> "/a/b/<parked>", systemd "slice:prefix:name" -> "slice:prefix:<parked>")."""
    if not path:
        return ""
    if ":" in path and not path.startswith("/"):
        parts = path.split(":")
        return ":".join(parts[:-1] + [parked_id])
    parent = path.rstrip("/").rsplit("/", 1)[0]
    return f"{parent}/{parked_id}" if parent else f"/{parked_id}"


def host_memory(pid: int) -> dict:
    """Host memory a sandbox holds: its memory file (the sentry's memfd
    "runsc-memory": the workload's pages, allocated on the host; each memfd
    counted once, though the sentry and every stub hold descriptors of it) and
    the sandbox processes' resident sizes. `pid` is what `runsc state` reports;
    the memfd is found on it or its descendants."""
    out: dict = {"memfd_bytes": 0, "processes": 0, "rss_kb": 0, "rss_anon_kb": 0, "rss_shmem_kb": 0}
    todo, seen = [pid], set()
    memfds: dict[tuple[int, int], int] = {}
    while todo:
        p = todo.pop()
        if p in seen or p <= 0:
            continue
        seen.add(p)
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        out["processes"] += 1
        for key, field_name in (("rss_kb", "VmRSS"), ("rss_anon_kb", "RssAnon"), ("rss_shmem_kb", "RssShmem")):
            if field_name in fields:
                out[key] += int(fields[field_name].split()[0])
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                try:
                    if os.readlink(f"/proc/{p}/fd/{fd}").startswith("/memfd:runsc-memory"):
                        st = os.stat(f"/proc/{p}/fd/{fd}")
                        memfds[(st.st_dev, st.st_ino)] = st.st_blocks * 512
                except OSError:
                    pass
            for task in os.listdir(f"/proc/{p}/task"):
                todo.extend(int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except OSError:
            pass
    out["memfd_bytes"] = sum(memfds.values())
    out["memfds"] = len(memfds)
    return out


def _read_line(stream, timeout_s: float) -> str:
    """One line from a child's stdout pipe within `timeout_s` ("" on EOF or timeout)."""
    import select
    buf = b""
    deadline = time.monotonic() + timeout_s
    fd = stream.fileno()
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        buf += chunk
    stream.close()
    return buf.split(b"\n", 1)[0].decode(errors="replace").strip()


def _kill_sandbox_processes(root: str, cid: str) -> list[int]:
    """SIGKILL the runsc-sandbox / runsc-gofer processes of sandbox `cid` under runsc root
    `root` (their command line names both); their pids. As the stand-in's orphan reaper
    (go/internal/standin/orphans.go) does for a killed create."""
    import signal
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (d / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if not argv or Path(argv[0]).name not in ("runsc-sandbox", "runsc-gofer") or argv[-1] != cid:
            continue
        roots = {a.split("=", 1)[1] for a in argv if a.startswith("--root=")}
        roots |= {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--root"}
        if root not in roots:
            continue
        try:
            os.kill(int(d.name), signal.SIGKILL)
            out.append(int(d.name))
        except OSError:
            pass
    return out


def _unmount(path: Path) -> None:
    """Detach whatever is mounted at `path` (umount2 MNT_DETACH); nothing there: nothing to do."""
    import ctypes
    if not os.path.ismount(path):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(str(path).encode(), 2) != 0:   # MNT_DETACH
        log.warning("umount %s: %s", path, os.strerror(ctypes.get_errno()))


def _kill_relay(pid: int, socket: str) -> None:
    """End a relay a previous thawd started (its pid checked by its command line)."""
    import signal
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if Path(argv0[0].decode(errors="replace")).name == RELAY_BINARY and socket.encode() in argv0:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


def is_parked_id(cid: str) -> bool:
    return cid.startswith(ID_PREFIX)
