"""thawd: the gRPC server on a root-only Unix socket (`thaw serve`).
The client is control/thawd/client.py.

Errors are converted once, here: a ThawError becomes the gRPC status its
class maps to in control.errors.GRPC_STATUS; anything else is logged with
its traceback and answered INTERNAL. A bad request fails alone: the server
keeps serving every other one.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import signal
import socket
import stat
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from control import errors as errmod
from control.config import RUNSC_VERSION_LABEL, Settings
from control.metrics import cache_gauges
from control.errors import ConfigError, PreconditionError, ThawError
from control.logfields import JsonFormatter, configure as configure_logs, fields  # noqa: F401 - JsonFormatter: its old home
from control.thawd.decisions import Decisions
from control.thawd.exits import ExitWatch, fix_mmap_threshold
from control.thawd.metrics import Metrics, serve as serve_metrics
from control.thawd.podmounts import drop_stray_cgroup_mounts
from control.thawd.rpc import thawd_pb2 as pb
from control.thawd.rpc import thawd_pb2_grpc as pbg
from control.thawd.service import RuntimeRef, Standin, Thawd
from control.thawd.shimlogs import ShimLogs
from control.version import VERSION

log = logging.getLogger("thawd")


def _status_of(err: ThawError) -> grpc.StatusCode:
    for cls, name in errmod.GRPC_STATUS:
        if isinstance(err, cls):
            return getattr(grpc.StatusCode, name)
    return grpc.StatusCode.INTERNAL


def _rpc(f):
    """The one place errors become gRPC statuses."""
    @functools.wraps(f)
    def wrapper(self, request, context):
        try:
            return f(self, request, context)
        except ThawError as e:
            log.info("%s rejected: %s", f.__name__, e,
                     extra=fields(rpc=f.__name__, reason=f"{type(e).__name__}: {e}"))
            context.abort(_status_of(e), f"{type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - one bad request must not take the server down
            log.exception("%s failed", f.__name__, extra=fields(rpc=f.__name__, reason=type(e).__name__))
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")
    return wrapper


def _rt(m: pb.Runtime) -> RuntimeRef:
    return RuntimeRef.validate(m.container_id, m.bundle, m.runsc_root, list(m.global_flags))


class ThawdServicer(pbg.ThawdServicer):
    """The RPCs. Every answer that decides a container's start is also kept in
    `decisions` (`thaw stats --decisions`): thawd's decisions all cross this boundary."""

    def __init__(self, thawd: Thawd, tuple_hash: str, decisions: Decisions | None = None) -> None:
        self.t = thawd
        self.tuple_hash = tuple_hash
        self.decisions = decisions or Decisions()

    @_rpc
    def PrepareRestore(self, request, context):
        rt = _rt(request.runtime)
        t0 = time.monotonic()
        d = self.t.prepare_restore(rt, stdio=request.stdio)
        self.decisions.record(rt.container_id, ("adopt" if d.adopt_id else "restore") if d.restore else "cold",
                              d.reason, key=d.key, seconds=time.monotonic() - t0)
        if d.restore and not context.is_active():
            # The stand-in died (or gave up) while thawd decided: the RPC is cancelled
            # and the answer goes nowhere. Its container's delete may already have been
            # and gone, so nothing else would ever end this decision.
            self.t.abandon(rt, "the stand-in was gone before thawd's answer reached it")
        decision = pb.PrepareRestoreResponse.SATISFIED if d.satisfied else pb.PrepareRestoreResponse.COLD
        if d.restore:
            decision = pb.PrepareRestoreResponse.ADOPT if d.adopt_id else pb.PrepareRestoreResponse.RESTORE
        return pb.PrepareRestoreResponse(
            decision=decision, reason=d.reason, workload_key=d.key, restore_timeout_ms=int(d.restore_timeout_s * 1000),
            image_path=d.image_path if d.restore else "", adopt_id=d.adopt_id, adopt_pid=d.adopt_pid,
            relay_socket=d.relay_socket)

    @_rpc
    def Restore(self, request, context):
        # The stand-in waits for this answer; when it dies (SIGKILL) or its
        # deadline passes, the RPC is cancelled, and a restore nobody will
        # report to containerd must not keep running (issue 14: the task and
        # containerd's view must agree).
        standin = Standin.validate(request.standin_pid, request.standin_marker, exits=self.t.exits)
        rt = _rt(request.runtime)
        ok, detail, secs = self.t.restore(rt, cancelled=lambda: not context.is_active(),
                                          standin=standin, subcontainer_restored=request.subcontainer_restored)
        # Failed: thawd removed the sandbox and the stand-in starts the container cold.
        self.decisions.record(rt.container_id, "restored" if ok else "restore-failed", detail, seconds=secs)
        return pb.RestoreResponse(restored=ok, detail=detail, seconds=secs)

    @_rpc
    def ReportOutcome(self, request, context):
        names = {v: k for k, v in pb.ReportOutcomeRequest.Outcome.items()}
        outcome = names.get(request.outcome, str(request.outcome))
        if len(request.reason) > 4096:
            raise errmod.UserError("reason is longer than 4096 bytes", field="reason")
        rt = _rt(request.runtime)
        self.t.report_outcome(rt, outcome, request.reason)
        self.decisions.record(rt.container_id, outcome.lower().replace("_", "-"), request.reason)
        return pb.ReportOutcomeResponse()

    @_rpc
    def Release(self, request, context):
        return pb.ReleaseResponse(released=self.t.release(request.container_id, request.runsc_root))

    @_rpc
    def Stats(self, request, context):
        s = self.t.stats()
        if len(request.container_id) > 256:
            raise errmod.UserError("container_id is longer than 256 bytes", field="container_id")
        return pb.StatsResponse(counters=s["counters"], entries=[
            pb.CacheEntry(workload_key=e["key"], tuple_hash=e.get("tuple_hash", ""), bytes=e.get("bytes", 0),
                          leases=e.get("leases", 0), state=e.get("state", ""), reason=e.get("reason", ""))
            for e in s["entries"]], decisions=[
            pb.DecisionRecord(time=r.time, container_id=r.container, decision=r.decision, reason=r.reason,
                              workload_key=r.key, tenant=r.tenant, seconds=r.seconds)
            for r in self.decisions.last(min(request.decisions, 10_000), request.container_id)])

    @_rpc
    def Evict(self, request, context):
        evicted = self.t.evict(request.workload_key)
        reason, held = "", []
        cache = getattr(getattr(self.t, "images", None), "cache", None)
        if cache is not None:
            left = [e for e in cache.entries(request.workload_key) if e.state != "evicting"]
            held = [h for e in left for h in cache.lease_holders(e.id)]
            if left:
                reason = (f"{len(left)} cache entries of it are in use (leased) and stay: " + "; ".join(held)
                          if held else f"{len(left)} cache entries of it stay")
            elif not evicted:
                reason = "this node's cache holds no entry of it"
        return pb.EvictResponse(evicted=evicted, reason=reason, held_by=held)

    @_rpc
    def Health(self, request, context):
        return pb.HealthResponse(ok=True, version=VERSION, tuple_hash=self.tuple_hash)


# The node lock, under the state dir: held (flock) by the one thawd of this
# node for its whole life, never deleted (deleting a lock file breaks mutual
# exclusion); it holds the owner's pid for the message a second daemon prints.
LOCK_NAME = "thawd.lock"
_node_locks: dict[Path, int] = {}   # lock path -> the fd holding it (for the life of the process)

# Bounded reads (issue 14): no request of thawd's protocol comes near 1 MiB
# (the largest field is ReportOutcome's 4096-byte reason); gRPC's default is 4 MiB.
MAX_REQUEST_BYTES = 1 << 20
# Requests in flight beyond the worker threads (thawd.rpc_workers) wait in
# gRPC's queue; beyond this many (or 4 per worker, if more) they are refused
# (RESOURCE_EXHAUSTED) rather than queued without end.
MAX_CONCURRENT_RPCS = 64


def lock_node(settings: Settings) -> Path:
    """Become the one thawd of this node: take <state_dir>/thawd/thawd.lock for
    the rest of this process's life. A second `thaw serve` gets a
    PreconditionError naming the holder (exit 69) before it touches anything:
    not the socket, not the sandboxes' leftovers. Idempotent in one process."""
    path = settings.state_dir / "thawd" / LOCK_NAME
    if path in _node_locks:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise PreconditionError(f"thawd already runs on this node: pid {holder} holds {path}",
                                lock=str(path), pid=holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _node_locks[path] = fd
    return path


def check_socket_dir(path: Path) -> None:
    """thawd creates only the socket's own directory, tight (0700), and changes
    the mode of no existing directory.

    Missing: it is created, mode 0700, in a parent that must exist already (no
    missing parents are made) and that no other user can rename it in (not
    writable by others, unless sticky). Existing: it must be a real directory
    (not a symlink) owned by root that no other user can write; it is used as
    it is, never chmodded: the socket's parent may be /run or another shared
    directory whose mode is not thawd's to change. The socket itself is born
    0600 (serve binds it under umask 0177), so it is root-only either way.
    A refusal is a ConfigError naming thawd.socket (exit 78)."""
    d = path.parent
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        parent = d.parent
        try:
            pst = os.stat(parent)
        except FileNotFoundError:
            raise ConfigError("thawd.socket", f"{parent} does not exist; thawd creates only the socket's own "
                              f"directory {d}, not its parents") from None
        if not stat.S_ISDIR(pst.st_mode):
            raise ConfigError("thawd.socket", f"{parent} is not a directory")
        if pst.st_mode & 0o002 and not pst.st_mode & stat.S_ISVTX:
            raise ConfigError("thawd.socket", f"{parent} is writable by every user without the sticky bit "
                              f"(mode {stat.S_IMODE(pst.st_mode):o}): a directory made there is not safe")
        old = os.umask(0o077)
        try:
            os.mkdir(d, 0o700)
        finally:
            os.umask(old)
        st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError("thawd.socket", f"{d} is not a directory (a symlink or a file)")
    if st.st_uid != os.geteuid():
        raise ConfigError("thawd.socket", f"{d} is owned by uid {st.st_uid}, not root: another user controls it")
    if st.st_mode & 0o022:
        raise ConfigError("thawd.socket", f"{d} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                          "put the socket in a directory of its own, e.g. /run/thaw/thawd.sock")


def prepare_socket(path: Path) -> None:
    """A safe directory for the socket (check_socket_dir); a stale socket is
    removed, a live one (another thawd answers there) is not."""
    if os.geteuid() != 0:
        raise PreconditionError("thawd needs root (it runs runsc and owns the node cache)")
    check_socket_dir(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise PreconditionError(f"{path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a crashed thawd's socket
        return
    finally:
        probe.close()
    raise PreconditionError(f"another thawd serves {path} (with another node.state_dir?); "
                            "refusing to take over its socket", socket=str(path))


def build(settings: Settings, images, tuple_hash: str) -> tuple[grpc.Server, Thawd, Metrics]:
    lock_node(settings)
    prepare_socket(settings.thawd_socket)
    drop_stray_cgroup_mounts()   # in a pod: before any runsc runs (control/thawd/podmounts.py says why)
    metrics = Metrics().install()   # the image path's series (bytes fetched, retries, ...) land here too
    metrics.set("thaw_build_info", 1, version=VERSION, runsc=RUNSC_VERSION_LABEL)
    cache = getattr(images, "cache", None)
    if cache is not None:
        metrics.on_scrape(cache_gauges(cache))
    fix_mmap_threshold()   # before the exit watch's reads begin: exits.py says why
    exits = ExitWatch().start()
    if not exits.available:
        log.warning("process exit events unavailable (%s): a stand-in killed after committing a restore "
                    "is judged by its marker alone (control/thawd/exits.py)", exits.why_not)
    thawd = Thawd(settings, images, metrics, exits=exits, kube=kube_client(settings))
    if cache is not None:   # every idle cache entry re-hashed in the background (issue 30); thawd.close stops it
        from control.images import scrub
        thawd.scrub = scrub.start(cache, settings)
    # Running containers' shim logs, bounded on disk (control/thawd/shimlogs.py says how, and why so).
    thawd.shim_logs = ShimLogs(settings.log_dir / "shim", settings.standin_shim_log_max_bytes).start()
    thawd.parking.recover()    # what a previous thawd parked goes; what containers adopted stays theirs
    thawd.parking.start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=settings.thawd_rpc_workers, thread_name_prefix="rpc"),
                         options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES)],
                         maximum_concurrent_rpcs=max(MAX_CONCURRENT_RPCS, 4 * settings.thawd_rpc_workers))
    pbg.add_ThawdServicer_to_server(ThawdServicer(thawd, tuple_hash, Decisions(settings.thawd_decisions_kept)),
                                    server)
    old = os.umask(0o177)  # the socket is born 0600: not one moment open to other users
    try:
        server.add_insecure_port(f"unix:{settings.thawd_socket}")
    finally:
        os.umask(old)
    return server, thawd, metrics


def kube_client(settings: Settings):
    """The API client Events and pod reads go through (control/thawd/kubeapi.py), when
    either is on; None, logged, when it cannot be made: thawd serves containers without
    the API server (no Events; readiness from annotations) rather than not at all."""
    if not (settings.kubernetes_events or settings.kubernetes_read_pods):
        return None
    from control.thawd import kubeapi
    try:
        client = kubeapi.from_settings(settings)
    except ThawError as e:
        log.error("Kubernetes API off (no Events, readiness from annotations alone): %s", e,
                  extra=fields(reason=str(e)))
        return None
    log.info("Kubernetes API at %s as node %s (events %s, pod specs %s)", client.server, kubeapi.node_name(settings),
             settings.kubernetes_events, settings.kubernetes_read_pods)
    return client


def serve(settings: Settings, images, tuple_hash: str, ready: threading.Event | None = None,
          verbose: int = 0) -> None:
    """Run thawd until SIGTERM/SIGINT; JSON log lines on stderr at the level `thaw -v`
    asks for (info by default, -vv debug)."""
    configure_logs(verbose, json_lines=True, daemon=True)
    server, thawd, metrics = build(settings, images, tuple_hash)
    server.start()
    os.chmod(settings.thawd_socket, 0o600)
    msrv = serve_metrics(metrics, settings.thawd_metrics_addr) if settings.thawd_metrics_addr else None
    log.info("thawd %s serving on %s (metrics %s, tuple %s)", VERSION, settings.thawd_socket,
             settings.thawd_metrics_addr or "off", tuple_hash,
             extra=fields(version=VERSION, socket=str(settings.thawd_socket), tuple_hash=tuple_hash))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if ready:
        ready.set()
    stop.wait()
    log.info("thawd stopping")
    server.stop(grace=5).wait()
    if msrv:
        msrv.shutdown()
    thawd.close()
    try:
        settings.thawd_socket.unlink()
    except FileNotFoundError:
        pass
    # Do not wait for a checkpoint or publish still running in a worker
    # thread (Python joins executor threads at exit): every step of those is
    # crash-safe by design (temp names, manifest last, cache install by
    # rename), so stopping now loses only that work, and SIGTERM must not
    # wait for a multi-GB upload.
    for h in logging.getLogger().handlers:
        h.flush()
    os._exit(0)
