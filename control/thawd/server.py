"""thawd: the gRPC server on a root-only Unix socket (`thaw serve`).
The client is control/thawd/client.py.

Errors are converted once, here: a ThawError becomes the gRPC status its
class maps to in control.errors.GRPC_STATUS; anything else is logged with
its traceback and answered INTERNAL. A bad request fails alone: the server
keeps serving every other one.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import stat
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from control import errors as errmod
from control.config import Settings
from control.errors import PreconditionError, ThawError
from control.thawd.metrics import Metrics, serve as serve_metrics
from control.thawd.rpc import thawd_pb2 as pb
from control.thawd.rpc import thawd_pb2_grpc as pbg
from control.thawd.service import RuntimeRef, Thawd

log = logging.getLogger("thawd")
VERSION = "0.1.0"


class JsonFormatter(logging.Formatter):
    """Structured logs: one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        d = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
             "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d)


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
            log.info("%s rejected: %s", f.__name__, e)
            context.abort(_status_of(e), f"{type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - one bad request must not take the server down
            log.exception("%s failed", f.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")
    return wrapper


def _rt(m: pb.Runtime) -> RuntimeRef:
    return RuntimeRef.validate(m.container_id, m.bundle, m.runsc_root, list(m.global_flags))


class ThawdServicer(pbg.ThawdServicer):
    def __init__(self, thawd: Thawd, tuple_hash: str) -> None:
        self.t = thawd
        self.tuple_hash = tuple_hash

    @_rpc
    def PrepareRestore(self, request, context):
        d = self.t.prepare_restore(_rt(request.runtime))
        return pb.PrepareRestoreResponse(
            decision=pb.PrepareRestoreResponse.RESTORE if d.restore else pb.PrepareRestoreResponse.COLD,
            reason=d.reason, workload_key=d.key, restore_timeout_ms=int(d.restore_timeout_s * 1000))

    @_rpc
    def Restore(self, request, context):
        # The stand-in waits for this answer; when it dies (SIGKILL) or its
        # deadline passes, the RPC is cancelled, and a restore nobody will
        # report to containerd must not keep running (issue 14: the task and
        # containerd's view must agree).
        ok, detail, secs = self.t.restore(_rt(request.runtime), cancelled=lambda: not context.is_active())
        return pb.RestoreResponse(restored=ok, detail=detail, seconds=secs)

    @_rpc
    def ReportOutcome(self, request, context):
        names = {v: k for k, v in pb.ReportOutcomeRequest.Outcome.items()}
        outcome = names.get(request.outcome, str(request.outcome))
        if len(request.reason) > 4096:
            raise errmod.UserError("reason is longer than 4096 bytes", field="reason")
        self.t.report_outcome(_rt(request.runtime), outcome, request.reason)
        return pb.ReportOutcomeResponse()

    @_rpc
    def Release(self, request, context):
        return pb.ReleaseResponse(released=self.t.release(request.container_id, request.runsc_root))

    @_rpc
    def Stats(self, request, context):
        s = self.t.stats()
        return pb.StatsResponse(counters=s["counters"], entries=[
            pb.CacheEntry(workload_key=e["key"], tuple_hash=e.get("tuple_hash", ""), bytes=e.get("bytes", 0),
                          leases=e.get("leases", 0), state=e.get("state", ""), reason=e.get("reason", ""))
            for e in s["entries"]])

    @_rpc
    def Evict(self, request, context):
        return pb.EvictResponse(evicted=self.t.evict(request.workload_key))

    @_rpc
    def Health(self, request, context):
        return pb.HealthResponse(ok=True, version=VERSION, tuple_hash=self.tuple_hash)


def prepare_socket(path: Path) -> None:
    """A root-only directory (0700) for the socket; a stale socket is removed."""
    if os.geteuid() != 0:
        raise PreconditionError("thawd needs root (it runs runsc and owns the node cache)")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise PreconditionError(f"{path} exists and is not a socket; refusing to remove it")
    path.unlink()


def build(settings: Settings, images, tuple_hash: str) -> tuple[grpc.Server, Thawd, Metrics]:
    metrics = Metrics()
    thawd = Thawd(settings, images, metrics)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=settings.thawd_rpc_workers, thread_name_prefix="rpc"))
    pbg.add_ThawdServicer_to_server(ThawdServicer(thawd, tuple_hash), server)
    prepare_socket(settings.thawd_socket)
    server.add_insecure_port(f"unix:{settings.thawd_socket}")
    return server, thawd, metrics


def serve(settings: Settings, images, tuple_hash: str, ready: threading.Event | None = None) -> None:
    """Run thawd until SIGTERM/SIGINT."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    server, thawd, metrics = build(settings, images, tuple_hash)
    server.start()
    os.chmod(settings.thawd_socket, 0o600)
    msrv = serve_metrics(metrics, settings.thawd_metrics_addr) if settings.thawd_metrics_addr else None
    log.info("thawd %s serving on %s (metrics %s, tuple %s)", VERSION, settings.thawd_socket,
             settings.thawd_metrics_addr or "off", tuple_hash)
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
