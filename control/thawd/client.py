"""The CLI's client of thawd's socket.

gRPC statuses come back as the ThawError classes the server raised: the
server writes "<ClassName>: <message>" as the status details
(control/thawd/server.py `_rpc`), the client looks the class up in
control.errors and, for a name it does not know, takes the first class of
control.errors.GRPC_STATUS with that status. Twin of the Go stand-in's
mapping (go/internal/standin/errors.go).
"""

from __future__ import annotations

from control import errors as errmod
from control.config import Settings
from control.errors import PreconditionError, ThawError


def error_from_status(code_name: str, details: str) -> ThawError:
    """The ThawError a status (grpc.StatusCode member name + details) stands for."""
    name, sep, message = details.partition(": ")
    cls = getattr(errmod, name, None) if sep else None
    if not (isinstance(cls, type) and issubclass(cls, ThawError)):
        cls, message = ThawError, details
        for c, status in errmod.GRPC_STATUS:
            if status == code_name:
                cls = c
                break
    err = ThawError.__new__(cls)
    ThawError.__init__(err, message or details, status=code_name)
    return err


class Client:
    """thawd's RPCs as plain calls; a failed call raises the server's ThawError class."""

    def __init__(self, settings: Settings, timeout_s: float = 10.0) -> None:
        import grpc

        from control.thawd.rpc import thawd_pb2 as pb
        from control.thawd.rpc import thawd_pb2_grpc as pbg
        self._grpc, self.pb = grpc, pb
        sock = settings.thawd_socket
        if not sock.exists():
            raise PreconditionError(f"thawd is not running: no socket at {sock} (start `thaw serve`)")
        self._channel = grpc.insecure_channel(f"unix:{sock}")
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise PreconditionError(f"thawd at {sock} does not answer") from None
        self.stub = pbg.ThawdStub(self._channel)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self._channel.close()

    def call(self, method: str, request, timeout_s: float):
        try:
            return getattr(self.stub, method)(request, timeout=timeout_s)
        except self._grpc.RpcError as e:
            raise error_from_status(e.code().name, e.details() or "") from None

    def stats(self, decisions: int = 0, container: str = "") -> dict:
        r = self.call("Stats", self.pb.StatsRequest(decisions=decisions, container_id=container), 10)
        return {"counters": dict(r.counters), "entries": [
            {"key": e.workload_key, "tuple_hash": e.tuple_hash, "bytes": e.bytes, "leases": e.leases,
             "state": e.state, "reason": e.reason} for e in r.entries], "decisions": [
            {"time": d.time, "container": d.container_id, "decision": d.decision, "reason": d.reason,
             "key": d.workload_key, "tenant": d.tenant, "seconds": d.seconds} for d in r.decisions]}

    def evict(self, key: str) -> bool:
        return self.evict_why(key)["evicted"]

    def evict_why(self, key: str) -> dict:
        """{"evicted", "reason", "held_by"}: what went, and why the rest did not."""
        r = self.call("Evict", self.pb.EvictRequest(workload_key=key), 30)
        return {"evicted": r.evicted, "reason": r.reason, "held_by": list(r.held_by)}

    def health(self) -> dict:
        r = self.call("Health", self.pb.HealthRequest(), 10)
        return {"ok": r.ok, "version": r.version, "tuple_hash": r.tuple_hash}
