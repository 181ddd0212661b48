"""Parked sandboxes: restored ahead of demand, adopted by the next container of
their workload (config [park], off by default; docs/parking.md).

A restore under containerd pays, before the workload answers, `runsc restore`
until the CUDA helper runs (0.32-0.43 s on the H200), the helper's start, and
a CUDA restore that right after `runsc restore` runs 0.25-0.6 s slower than
the same step in a sandbox that has run since (docs/gpu.md, "Measured ...
third session"). A parked sandbox has paid all of that before any container
asked: thawd restored it from the node cache under an id of its own, waited
until every page was in, and toggled its CUDA processes back to checkpointed
(GPU memory free, the device state in host memory). When containerd's shim
creates a container of the same workload whose spec matches, thawd answers
ADOPT: the stand-in creates no sandbox, hands the container's stdio to the
sandbox's relay (go/cmd/thaw-relay), writes the shim's pid file and an alias in
the runsc root (go/internal/runscargv Alias) so that every runsc call the shim
makes for the container goes to the parked sandbox. At start, `wake` restores
the CUDA state of exactly the processes the park toggled, runs the workload's
health probe and post-restore hooks: that is all a request waits for.

What is parked: lone containers only (a Kubernetes pod's sandbox joins the
network namespace CNI made for it at RunPodSandbox, which does not exist ahead
of demand, and a runsc sandbox cannot move to another one), whose spec asks
for a new network namespace (no path: the parked sandbox gets its own, as the
container would) and no terminal. The template is the last container of the
workload key this node restored or checkpointed: its spec, its runsc root and
global flags, its image's layers (containerd's snapshot chain, for a root
filesystem of the same layers made through containerd's snapshotter by
thaw-ctrinfo rootfs-prepare). A new container adopts a parked sandbox only
when its runsc root, its global flags (less the per-container log paths) and
its spec (less its root path and cgroups path) equal the template's.

Costs, each bounded: host memory, the parked sandbox's memory file (about its
image's pages; `park.memory_budget_bytes` over all of them, the least recently
started workload's go first); the GPU for a few seconds while a park restores
the device state before checkpointing it again; one relay process each. An
adopted container keeps the parked sandbox's cgroup (the template's cgroup
parent, named after the parked id): its limits are the container's, since the
specs are equal, but its cgroup path is not the one containerd chose.

Records live in <state_dir>/thawd/parked/<id>/parked.json. A thawd that starts
removes every parked sandbox a previous thawd left; adopted ones belong to
their containers and are only released when containerd deletes them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from control.errors import ThawError
from control.files import write_json_atomic
from control.lifecycle import workload as workloadmod
from control.lifecycle import image_meta
from control.thawd.containers import STDIO_KINDS, Containers, RuntimeRef  # noqa: F401 - STDIO_KINDS re-exported
from control.lifecycle.engine import Engine
from nvproxy import cuda as cudamod
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import CreateOptions, GlobalOptions, RestoreOptions, Runsc, cgroup_dirs, remove_cgroups


log = logging.getLogger("thawd")

# <runsc root>/<ALIAS_PREFIX><container id> -> <parked id>. Twin:
# go/internal/runscargv/argv.go AliasPrefix.
ALIAS_PREFIX = "thaw-alias."
RELAY_BINARY = "thaw-relay"          # beside runsc, as thaw-monitor (go/cmd/thaw-relay)
PARKED_DIR = "parked"
RECORD = "parked.json"
RUNSC_LOG = "runsc.log.json"
ID_PREFIX = "thaw-parked-"
NETNS_PREFIX = "thawpark-"           # not runsc_hooks/network.py's "thaw-": no veth, no gate
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


# CRI's annotations that gVisor's shim reads (pkg/shim/v1 utils): a container's type and
# the id of the sandbox (pod root) it belongs to; twins: go/internal/standin/standin.go.
CRI_CONTAINER_TYPE = "io.kubernetes.cri.container-type"
CRI_SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
# Stands for the path of a loopback-only network namespace in a spec's fingerprint.
LOOPBACK_ONLY = "<loopback-only>"


def _normalized(spec: dict) -> dict:
    s = copy.deepcopy(spec)
    s.get("root", {}).pop("path", None)
    (s.get("linux") or {}).pop("cgroupsPath", None)
    ann = s.get("annotations") or {}
    if ann.get(CRI_CONTAINER_TYPE) == "sandbox":
        # A lone container under gVisor's shim is its own pod's root, and names itself as
        # its sandbox (docs/containerd.md, "A lone container must be a pod root").
        ann.pop(CRI_SANDBOX_ID, None)
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
        from runsc_hooks import network as netmod
        try:
            lo_only = netmod.loopback_only(path)
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


class Parking:
    def __init__(self, settings, state_dir: Path, containers: Containers, images, metrics, pool) -> None:
        """`containers`: the containerd door's records (an adopter's stdio and the parked
        sandbox it adopted live there); `images`: the image source (a park pulls from
        the node cache); `pool`: thawd's workers (a park job runs there)."""
        self.s = settings
        self.containers = containers
        self.images = images
        self.metrics = metrics
        self._pool = pool
        self.dir = state_dir / PARKED_DIR
        self._lock = threading.Lock()
        self._parked: dict[str, Parked] = {}      # parked id -> record
        self._templates: dict[str, Template] = {}
        self._filling: set[str] = set()             # keys a park job runs for
        self._leases: dict[str, object] = {}          # parked id -> its image's cache lease
        self._stop = threading.Event()
        self._expirer: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.s.park_enabled

    # -- start / stop -------------------------------------------------------------

    def recover(self) -> None:
        """At thawd's start: remove what a previous thawd parked and nobody adopted;
        keep the records of adopted ones (their containers still run, and their
        delete releases them)."""
        if not self.dir.is_dir():
            return
        for d in sorted(self.dir.iterdir()):
            try:
                p = Parked(**json.loads((d / RECORD).read_text()))
            except (OSError, ValueError, TypeError):
                log.warning("park: removing %s, which has no readable record", d)
                self._remove_dir(d, None)
                continue
            if p.state == ADOPTED and p.adopted_by and Path(p.root, ALIAS_PREFIX + p.adopted_by).is_symlink():
                with self._lock:
                    self._parked[p.id] = p
                self.containers.recover_adoption(RuntimeRef(p.adopted_by, Path(p.dir), Path(p.root), tuple(p.flags)),
                                                 p.id)
                log.info("park: %s still serves container %s", p.id, p.adopted_by)
                continue
            self._destroy(p, "left by a previous thawd")

    def start(self) -> None:
        if not self.enabled or self._expirer is not None:
            return
        self._expirer = threading.Thread(target=self._expire_loop, daemon=True, name="park-expire")
        self._expirer.start()

    def close(self) -> None:
        """thawd stops: parked sandboxes go (nothing would adopt them), adopted ones stay.
        All at once and bounded (CLOSE_TIMEOUT_S for containerd's part: a snapshot
        containerd cannot remove now stays recorded, and the next thawd's `recover`
        removes it)."""
        self._stop.set()
        with self._lock:
            victims = [p for p in self._parked.values() if p.state in (PARKED, PARKING)]
        threads = [threading.Thread(target=self._destroy, args=(p, "thawd stops"),
                                    kwargs={"timeout_s": CLOSE_TIMEOUT_S}, daemon=True) for p in victims]
        for th in threads:
            th.start()
        for th in threads:
            th.join(CLOSE_TIMEOUT_S + 10)

    # -- policy -------------------------------------------------------------------

    def note_start(self, rt: RuntimeRef, spec: dict, key: str, stdio: str) -> None:
        """A lone container of `key` started (restored, adopted or checkpointed after a
        cold start) with `stdio` (its kinds, Containers.stdio_of): remember it as the
        key's template and park more if wanted."""
        if not self.enabled or not key:
            return
        why = parkable(spec)
        if not why and not stdio:
            why = "its stdio is unknown (a stand-in that did not say)"
        elif not why and any(k not in PARKABLE_STDIO for k in stdio.split(",")):
            why = f"its stdio ({stdio}) is not /dev/null or pipes"
        if why:
            log.info("park: %s (%s) is not parked: %s", key, rt.container_id, why)
            return
        now = time.time()
        with self._lock:
            tpl = self._templates.get(key)
        if tpl is None or tpl.root != str(rt.runsc_root) or fingerprint(tpl.spec) != fingerprint(spec) \
                or flag_set(tpl.flags) != flag_set(rt.global_flags) or tpl.stdio != stdio:
            try:
                info = self._layers(rt)
            except ThawError as e:
                log.warning("park: %s: cannot tell its image's layers: %s", key, e)
                return
            tpl = Template(key, str(rt.runsc_root), list(rt.global_flags), copy.deepcopy(spec), info["namespace"],
                           info["snapshotter"], info["snapshot_parent"], stdio=stdio)
        tpl.last_demand = now
        with self._lock:
            self._templates[key] = tpl
            if key in self._filling:
                return
            self._filling.add(key)
        self._pool.submit(self._fill, key)

    def _layers(self, rt: RuntimeRef) -> dict:
        from control.thawd import ctrinfo
        ns = ctrinfo.namespace_of(Path(rt.runsc_root), self.s.containerd_runsc_root)
        info = ctrinfo.lookup(self.s, ns, rt.container_id)
        if not info.get("snapshotter") or not info.get("snapshot_parent"):
            raise ParkError(f"containerd records no snapshotter or layers for {rt.container_id}")
        return {"namespace": ns, "snapshotter": info["snapshotter"], "snapshot_parent": info["snapshot_parent"]}

    def _count(self, key: str) -> int:
        return sum(1 for p in self._parked.values() if p.key == key and p.state in (PARKING, PARKED))

    def _fill(self, key: str) -> None:
        """Park sandboxes of `key` until it has park.per_key of them or the budget is spent."""
        try:
            while not self._stop.is_set():
                with self._lock:
                    tpl = self._templates.get(key)
                    if tpl is None or self._count(key) >= self.s.park_per_key:
                        return
                try:
                    self.park(tpl)
                except ThawError as e:
                    log.warning("park of %s failed: %s", key, e.message)
                    self.metrics.inc("thaw_parks_total", result="failed")
                    return
        except Exception:  # noqa: BLE001 - a background job: log it, keep thawd
            log.exception("park of %s", key)
        finally:
            with self._lock:
                self._filling.discard(key)

    def _make_room(self, tpl: Template, need: int) -> bool:
        """Free budget for `need` bytes by removing parked sandboxes of keys started
        less recently than tpl's; False when it cannot fit."""
        budget = self.s.park_memory_budget_bytes
        while True:
            with self._lock:
                used = sum(p.cost() for p in self._parked.values() if p.state in (PARKING, PARKED))
                if used + need <= budget:
                    return True
                older = [p for p in self._parked.values() if p.state == PARKED and p.key != tpl.key and
                         self._templates.get(p.key, tpl).last_demand < tpl.last_demand]
                if not older:
                    return False
                victim = min(older, key=lambda p: self._templates[p.key].last_demand)
                victim.state = "evicting"
            self._destroy(victim, f"its budget went to {tpl.key}, started more recently")
            self.metrics.inc("thaw_parked_evicted_total", reason="budget")

    # -- park ---------------------------------------------------------------------

    def park(self, tpl: Template) -> Parked:
        """Restore one sandbox of tpl ahead of demand: every page in, CUDA state
        checkpointed again. ParkError (or another ThawError) when it could not;
        then nothing of it is left."""
        t0 = time.monotonic()
        lease = self.images.pull(tpl.key)
        image = Path(lease.path)
        estimate = sum(f.stat().st_size for f in image.iterdir() if f.is_file())
        if not self._make_room(tpl, estimate):
            lease.release()
            self.metrics.inc("thaw_parks_total", result="no-budget")
            raise ParkError(f"{estimate} bytes do not fit park.memory_budget_bytes "
                            f"({self.s.park_memory_budget_bytes}) beside more recently started workloads")
        pid = ID_PREFIX + hashlib.sha256(tpl.key.encode()).hexdigest()[:8] + "-" + secrets.token_hex(4)
        d = self.dir / pid
        d.mkdir(parents=True, mode=0o700)
        p = Parked(pid, tpl.key, tpl.root, list(tpl.flags), str(d), fingerprint(tpl.spec), estimate_bytes=estimate,
                   created=time.time(), snapshotter=tpl.snapshotter, namespace=tpl.namespace, stdio=tpl.stdio)
        with self._lock:
            self._parked[pid] = p
        self._save(p)
        relay = None
        try:
            from control.thawd import ctrinfo
            ctrinfo.rootfs_prepare(self.s, tpl.namespace, tpl.snapshotter, tpl.parent, d / "rootfs", pid)
            spec = copy.deepcopy(tpl.spec)
            spec["root"]["path"] = str(d / "rootfs")
            if specmod.netns_path(spec):      # loopback-only (parkable): one like it of its own
                from runsc_hooks import network as netmod
                p.netns = NETNS_PREFIX + pid[len(ID_PREFIX):]
                self._save(p)
                spec = specmod.with_netns(spec, netmod.create_loopback_netns(p.netns))
            if (spec.get("linux") or {}).get("cgroupsPath"):
                spec["linux"]["cgroupsPath"] = cgroups_path(spec["linux"]["cgroupsPath"], pid)
            specmod.Bundle(d).write(spec)
            why = image_meta.spec_mismatch(image, spec)
            if why:
                raise ParkError(f"the image does not restore into the template's spec: {why}")
            relay, stdio = self._start_relay(p)
            runsc = self.runsc(p)
            opts = RestoreOptions(image_path=image, create=CreateOptions(bundle=d), detach=True,
                                  background=self.s.restore_background)
            try:
                runsc.restore(pid, opts, stdio=stdio)
            finally:
                for fd in stdio:
                    os.close(fd)
            runsc.wait(pid, restore=True)      # every page in; on a GPU the CUDA state is back
            p.pid = runsc.state(pid).pid
            helper = cudamod.helper_path(spec)
            if helper:
                try:
                    p.cuda_pids = cudamod.CudaProcesses(runsc, pid, helper).checkpoint_running(self.s.runsc_timeout_s)
                except ThawError as e:
                    raise ParkError(f"parking: {e.message}") from e
            p.host_bytes = host_memory(p.pid)["memfd_bytes"]
        except BaseException as e:
            with self._lock:
                p.state = "failed"
            self._destroy(p, f"park failed: {e}", relay=relay)
            lease.release()
            if isinstance(e, ThawError):
                raise
            if isinstance(e, Exception):
                raise ParkError(f"{type(e).__name__}: {e}") from e
            raise
        p.parked_s = round(time.monotonic() - t0, 3)
        with self._lock:
            p.state = PARKED
            self._leases[pid] = lease
        self._save(p)
        self.metrics.inc("thaw_parks_total", result="parked")
        self.metrics.observe("thaw_park_seconds", p.parked_s)
        log.info("park %s key=%s: parked in %.2fs, %d bytes of host memory, CUDA pids %s", pid, tpl.key,
                 p.parked_s, p.host_bytes, p.cuda_pids or "none")
        self._gauges()
        return p

    def runsc(self, p: Parked) -> Runsc:
        flags = tuple(park_flags(p.flags, Path(p.dir)))
        if not any(f.lstrip("-").split("=")[0] == "root" for f in flags):
            flags = (f"--root={p.root}", *flags)
        return Runsc(self.s.runsc_path, GlobalOptions(root=Path(p.root), log_path=Path(p.dir) / RUNSC_LOG,
                                                      extra=flags, verbatim=True), self.s.runsc_timeout_s)

    def _start_relay(self, p: Parked) -> tuple[subprocess.Popen | None, tuple[int, int, int]]:
        """The parked sandbox's stdio, of p.stdio's kinds: /dev/null, or a pipe whose far
        end its stdio relay (go/cmd/thaw-relay) holds; returns the relay (None when
        nothing is a pipe) and the sandbox's ends (stdin, stdout, stderr)."""
        kinds = p.stdio.split(",")
        if "pipe" not in kinds:
            null_r = os.open(os.devnull, os.O_RDONLY)
            return None, (null_r, os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY))
        binary = self.s.runsc_path.parent / RELAY_BINARY
        if not binary.is_file():
            raise ParkError(f"{RELAY_BINARY} not found beside runsc ({binary})")
        in_r, in_w = os.pipe() if kinds[0] == "pipe" else (os.open(os.devnull, os.O_RDONLY), -1)
        out_r, out_w = os.pipe() if kinds[1] == "pipe" else (-1, os.open(os.devnull, os.O_WRONLY))
        err_r, err_w = os.pipe() if kinds[2] == "pipe" else (-1, os.open(os.devnull, os.O_WRONLY))
        # Beside thawd's socket (a root-only directory), not in the parked directory: a
        # Unix socket's path has at most 107 bytes (sun_path), and state_dir can be deep.
        sock = str(self.s.thawd_socket.parent / f"{p.id}.relay.sock")
        try:
            relay = subprocess.Popen(
                [str(binary), "-socket", sock, "-stdin-fd", str(in_w), "-stdout-fd", str(out_r),
                 "-stderr-fd", str(err_r)],
                pass_fds=tuple(fd for fd in (in_w, out_r, err_r) if fd >= 0), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=open(Path(p.dir) / "relay.log", "ab"), start_new_session=True)
        except OSError as e:
            for fd in (in_r, in_w, out_r, out_w, err_r, err_w):
                if fd >= 0:
                    os.close(fd)
            raise ParkError(f"starting {binary}: {e}") from e
        for fd in (in_w, out_r, err_r):
            if fd >= 0:
                os.close(fd)
        line = _read_line(relay.stdout, RELAY_READY_TIMEOUT_S)
        if line != "ready":
            relay.kill()
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            raise ParkError(f"{RELAY_BINARY} did not get ready (it said {line!r}; see {p.dir}/relay.log)")
        p.relay_pid, p.relay_socket = relay.pid, sock
        return relay, (in_r, out_w, err_w)

    # -- adopt --------------------------------------------------------------------

    def take(self, rt: RuntimeRef, spec: dict, key: str, stdio: str) -> Parked | None:
        """A parked sandbox container `rt` (with `spec`, of `key`, whose stdio kinds are
        `stdio`) may adopt, now promised to it; None when there is none that matches.
        The container's record (Containers.decide ADOPT) names the one it took."""
        if not self.enabled or parkable(spec):
            return None
        fp = fingerprint(spec)
        flags = flag_set(rt.global_flags)
        self._drop_dead(key)
        with self._lock:
            for p in sorted(self._parked.values(), key=lambda p: p.created):
                if p.state == PARKED and p.key == key and p.root == str(rt.runsc_root) and p.fingerprint == fp \
                        and flag_set(p.flags) == flags and p.stdio == stdio:
                    p.state, p.adopted_by = ADOPTING, rt.container_id
                    break
            else:
                same_key = [p for p in self._parked.values() if p.state == PARKED and p.key == key]
                if same_key:
                    self._why_not(same_key[0], rt, spec, fp, flags, stdio)
                return None
        self._save(p)
        self._gauges()
        return p

    def _why_not(self, p: Parked, rt: RuntimeRef, spec: dict, fp: str, flags: list[str], stdio: str) -> None:
        """Log why container `rt` did not adopt parked sandbox `p` of its key."""
        why = []
        if p.root != str(rt.runsc_root):
            why.append(f"runsc root {rt.runsc_root} vs {p.root}")
        if flag_set(p.flags) != flags:
            why.append(f"global flags {flags} vs {flag_set(p.flags)}")
        if p.stdio != stdio:
            why.append(f"stdio {stdio or 'unknown'} vs {p.stdio}")
        if p.fingerprint != fp:
            try:
                parked_spec = specmod.Bundle(Path(p.dir)).load()
                why.append("spec: " + "; ".join(spec_differences(spec, parked_spec)))
            except Exception as e:  # noqa: BLE001 - only a log line
                why.append(f"spec (the parked one unreadable: {e})")
        log.info("park: %s restores instead of adopting %s: %s", rt.container_id, p.id, "; ".join(why))

    def _drop_dead(self, key: str) -> None:
        """Parked sandboxes of `key` whose sandbox process is gone (the workload exited or
        was killed while parked) are removed before one is handed out."""
        with self._lock:
            dead = [p for p in self._parked.values() if p.key == key and p.state == PARKED and
                    not Path(f"/proc/{p.pid}").exists()]
            for p in dead:
                p.state = "dead"
        for p in dead:
            self._destroy(p, "its sandbox process is gone")
            self.metrics.inc("thaw_parked_evicted_total", reason="dead")

    def lease_of(self, p: Parked):
        with self._lock:
            return self._leases.pop(p.id, None)

    def get(self, parked_id: str) -> Parked | None:
        """The parked sandbox `parked_id` ("" names none)."""
        with self._lock:
            return self._parked.get(parked_id) if parked_id else None

    def wake(self, p: Parked, rt: RuntimeRef, probes: list) -> tuple[float, float, object, list]:
        """start of the container that adopted `p`: its CUDA processes back (each
        with the helper, at once), the health probe, the post-restore hooks.
        Returns (cuda seconds, total seconds, health result, hook records).
        Raises on failure; the caller removes the sandbox (`discard`)."""
        from control.errors import UnhealthyRestore
        t0 = time.monotonic()
        runsc = self.runsc(p)
        spec = specmod.Bundle(Path(p.dir)).load()
        h = self.handle(p)
        helper = cudamod.helper_path(spec) if p.cuda_pids else None
        if helper:
            errors = cudamod.CudaProcesses(runsc, p.id, helper).restore(p.cuda_pids, self.s.runsc_timeout_s)
            if errors:
                raise UnhealthyRestore(p.id, p.dir, {}, "CUDA state did not come back: " + "; ".join(errors))
        cuda_s = time.monotonic() - t0
        engine = Engine(self.s)
        health = engine.check(h, probes) if (probes and self.s.thawd_health_check) else None
        if health is not None and not health.healthy:
            raise UnhealthyRestore(p.id, p.dir, health.to_dict(), health.summary())
        hooks = engine.hooks(h, spec, "post_restore")
        with self._lock:
            p.state = ADOPTED
        self._save(p)
        return cuda_s, time.monotonic() - t0, health, hooks

    def handle(self, p: Parked):
        from control.lifecycle.engine import Handle
        return Handle(p.id, self.runsc(p), Path(p.dir), mark=self.s.network_probe_mark)

    def release(self, parked_id: str, container_id: str) -> bool:
        """The container that adopted parked sandbox `parked_id` was deleted (runsc
        deleted the sandbox) or its restore failed: its root filesystem, relay and
        record go. True when it was still there."""
        p = self.get(parked_id)
        if p is None:
            return False
        self._destroy(p, f"container {container_id} was deleted")
        return True

    def discard(self, p: Parked, why: str) -> None:
        """A parked sandbox that will not be used (its adoption failed): removed."""
        self._destroy(p, why)

    # -- teardown -----------------------------------------------------------------

    def _destroy(self, p: Parked, why: str, relay: subprocess.Popen | None = None,
                 timeout_s: float | None = None) -> None:
        log.info("park %s key=%s removed: %s", p.id, p.key, why)
        runsc = self.runsc(p)
        try:
            if runsc.exists(p.id):
                runsc.delete(p.id, force=True)
        except ThawError as e:
            log.warning("park %s: runsc delete: %s", p.id, e)
        # A sandbox runsc no longer knows (its root's state gone: /run cleared, the root
        # removed) still runs and holds its memory: its processes go by name.
        killed = _kill_sandbox_processes(p.root, p.id)
        if killed:
            log.info("park %s: killed sandbox processes %s that runsc no longer knew", p.id, killed)
        # runsc removes the cgroups it made at its delete; not those of a sandbox it no
        # longer knew (killed by name above), which would stay on the node for good.
        try:
            cg = (specmod.Bundle(Path(p.dir)).load().get("linux") or {}).get("cgroupsPath", "")
        except (ThawError, OSError):
            cg = ""
        removed, left = remove_cgroups(cgroup_dirs(cg), wait_s=2.0 if killed else 0.0)
        if removed or left:
            log.info("park %s: cgroups removed %s, left %s", p.id, removed, left)
        if p.adopted_by:
            try:
                os.unlink(Path(p.root) / (ALIAS_PREFIX + p.adopted_by))
            except OSError:
                pass
        if relay is not None:
            relay.kill()
            relay.wait(timeout=5)
        elif p.relay_pid:
            _kill_relay(p.relay_pid, p.relay_socket)
        if p.netns:
            from runsc_hooks import network as netmod
            try:
                netmod.remove_netns(p.netns)
            except Exception as e:  # noqa: BLE001 - a namespace file left: logged, nothing else holds it
                log.warning("park %s: network namespace %s stays: %s", p.id, p.netns, e)
        with self._lock:
            self._parked.pop(p.id, None)
            lease = self._leases.pop(p.id, None)
        if lease is not None:
            lease.release()
        self._remove_dir(Path(p.dir), p, timeout_s)
        self._gauges()

    def _remove_dir(self, d: Path, p: Parked | None, timeout_s: float | None = None) -> None:
        """The parked directory, after its root filesystem's snapshot (containerd's). When
        containerd cannot remove the snapshot now, the mount goes and the record stays
        (state "removing"): the next `recover` asks containerd again."""
        if p is not None and p.snapshotter:
            from control.thawd import ctrinfo
            try:
                ctrinfo.rootfs_remove(self.s, p.namespace, p.snapshotter, d / "rootfs", p.id, timeout_s=timeout_s)
            except ThawError as e:
                log.warning("park %s: its root filesystem's snapshot stays until thawd's next start: %s", p.id, e)
                _unmount(d / "rootfs")
                p.state = "removing"
                self._save(p)
                return
        elif (d / "rootfs").is_dir() and os.path.ismount(d / "rootfs"):
            log.warning("park: %s is still mounted and has no record naming its snapshot; left", d / "rootfs")
            return
        shutil.rmtree(d, ignore_errors=True)

    def _save(self, p: Parked) -> None:
        if Path(p.dir).is_dir():
            write_json_atomic(Path(p.dir) / RECORD, asdict(p))

    # -- expiry -------------------------------------------------------------------

    def _expire_loop(self) -> None:
        while not self._stop.wait(EXPIRE_EVERY_S):
            self.expire()

    def expire(self, now: float | None = None) -> list[str]:
        """Remove parked sandboxes whose workload has not started for park.idle_s."""
        now = time.time() if now is None else now
        with self._lock:
            idle = [p for p in self._parked.values() if p.state == PARKED and
                    now - max(p.created, self._templates.get(p.key, Template(p.key, "", [], {}, "", "", "")).
                              last_demand) > self.s.park_idle_s]
            for p in idle:
                p.state = "expiring"
        for p in idle:
            self._destroy(p, f"its workload was not started for {self.s.park_idle_s:g} s (park.idle_s)")
            self.metrics.inc("thaw_parked_evicted_total", reason="idle")
        return [p.id for p in idle]

    def _gauges(self) -> None:
        with self._lock:
            live = [p for p in self._parked.values() if p.state in (PARKING, PARKED)]
        self.metrics.set("thaw_parked", len(live))
        self.metrics.set("thaw_parked_host_bytes", sum(p.cost() for p in live))

    def stats(self) -> list[dict]:
        with self._lock:
            return [{"id": p.id, "key": p.key, "state": p.state, "host_bytes": p.host_bytes,
                     "parked_s": p.parked_s, "adopted_by": p.adopted_by} for p in self._parked.values()]


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


__all__ = ["Parking", "Parked", "Template", "fingerprint", "parkable", "shared_flags", "park_flags",
           "cgroups_path", "host_memory", "ALIAS_PREFIX", "workloadmod"]
