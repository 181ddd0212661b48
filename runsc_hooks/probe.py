"""Probes: the one grammar of readiness and health checks, with timeouts and retries.

Every door uses it: `thaw run --probe`, `thaw health`, `thaw restore`, and the
annotations of containers under containerd (`thaw.dev/ready`, `thaw.dev/health`).
A restored sandbox gets traffic only after its health check passes (the gate,
`gate.py`, opens then); an unhealthy restore is torn down and the caller starts
the container cold. A workload is checkpointed automatically only after its
readiness probe passes. Probes, in their text form (flags, annotations, records,
images):

    running                       the sandbox's container is running (the default)
    tcp:PORT                      a TCP connect to the sandbox address succeeds
    http:PORT/PATH[=STATUS][~BODY] GET answers STATUS (default 200; LO-HI: any in that range,
                                  as a Kubernetes httpGet probe's 200-399), body contains BODY
    gpu:PORT/PATH[#FIELD]         GET answers 200 with a JSON body whose FIELD (default
                                  "gpu") is present and truthy: proof the GPU answered
    exec:COMMAND ARGS...          `runsc exec` in the sandbox exits 0 (split like a shell
                                  would; use exec:/bin/sh -c '...' for shell syntax)
    file:/PATH                    the file exists inside the sandbox (`runsc exec test -e`)
    delay:SECONDS                 passes SECONDS after the check started (0..3600): a
                                  last resort for workloads that can say nothing else

Where the sandbox has no address the node can reach (a container under
containerd without a network namespace thaw knows), tcp/http/gpu probes run
inside the sandbox instead: the request is made from the sandbox's own
loopback by `runsc exec` of python3 (or busybox-style `wget`), see
`http_request`, which the workload profiles' HTTP hooks use too
(control/lifecycle/profiles.py).

TCP is the weakest: netstack completes a handshake for a listener whose
application is stuck, so prefer http (or exec) where the workload allows.

Network probes set SO_MARK to the probe mark, which the closed gate lets pass;
they connect to the sandbox address directly (never through a published port).
Each probe is retried with exponential backoff (10 ms doubling to 250 ms)
until it passes or the check's deadline passes; each attempt has its own
timeout, and the last one starts early enough to have all of it (or half the
check, when the check is shorter than two attempts). The result records
attempts and timings per probe.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol, Sequence

from control.errors import UserError

BACKOFF_FIRST_S = 0.01
BACKOFF_MAX_S = 0.25
MAX_RESPONSE_BYTES = 1 << 20
GONE_CHECK_S = 0.5       # how often a failing check asks whether the workload still exists


class ProbeFailed(Exception):
    """One attempt failed; the message says how."""


# exec(argv, timeout_s) -> (exit code, output): `runsc exec` in the sandbox; the
# output is its stdout then stderr, bytes decoded as UTF-8 with newlines as they are
ExecFn = Callable[[Sequence[str], float], "tuple[int, str]"]


@dataclass(frozen=True)
class Target:
    """What thaw talks to in a sandbox: probes here and the workload profiles'
    hooks (control/lifecycle/profiles.py). Without an address, HTTP goes from
    inside the sandbox through `exec` (`http_request`): thawd does not know the
    address of containers containerd started. The callables are the seams unit
    tests replace."""
    address: str | None = None                                   # sandbox IPv4 address as the node reaches it
    mark: int | None = None                                      # SO_MARK: passes the closed gate (gate.py)
    exec: ExecFn | None = None
    running: Callable[[], bool] | None = None
    started: float | None = None                                 # clock() when the check began (delay:)
    gone: Callable[[], bool] | None = None                       # the workload has exited or was deleted


class Probe(Protocol):
    def attempt(self, target: Target, timeout_s: float) -> str: ...
    def __str__(self) -> str: ...


@dataclass(frozen=True)
class RunningProbe:
    def attempt(self, target: Target, timeout_s: float) -> str:
        if target.running is None:
            raise ProbeFailed("no way to ask runsc for the container state")
        if not target.running():
            raise ProbeFailed("container is not running")
        return "running"

    def __str__(self) -> str:
        return "running"


def _connect(target: Target, port: int, timeout_s: float) -> socket.socket:
    if not target.address:
        raise ProbeFailed("the sandbox has no network address")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if target.mark:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, target.mark)
        s.settimeout(max(timeout_s, 0.001))
        s.connect((target.address, port))
        return s
    except OSError as e:
        s.close()
        raise ProbeFailed(f"connect {target.address}:{port}: {e.strerror or e}") from None


@dataclass(frozen=True)
class TcpProbe:
    port: int

    def attempt(self, target: Target, timeout_s: float) -> str:
        if not target.address and target.exec is not None:
            _exec_http(target, self.port, "/", timeout_s, connect_only=True)
            return "connected (from inside the sandbox)"
        _connect(target, self.port, timeout_s).close()
        return "connected"

    def __str__(self) -> str:
        return f"tcp:{self.port}"


def http_request(target: Target, port: int, path: str, timeout_s: float, method: str = "GET",
                 body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 request to the sandbox: (status, body), any status. Over a
    socket to the address, marked so it passes a closed gate; without an
    address, from inside the sandbox (`_exec_http`). ProbeFailed when nothing
    answered, or not in HTTP. The deadline covers the whole exchange."""
    if not target.address:
        if target.exec is None:
            raise ProbeFailed("the sandbox has no network address and no way to exec in it")
        return _exec_http(target, port, path, timeout_s, method, body)
    deadline = time.monotonic() + timeout_s
    s = _connect(target, port, timeout_s)
    try:
        s.sendall(_request(method, path, f"{target.address}:{port}", body))
        buf = b""
        while len(buf) < MAX_RESPONSE_BYTES:
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            rhead, sep, rbody = buf.partition(b"\r\n\r\n")
            if sep:
                length = _content_length(rhead)
                if length is not None and len(rbody) >= length:
                    break
    except OSError as e:
        raise ProbeFailed(f"{method} {path}: {e.strerror or e}") from None
    finally:
        s.close()
    return _response(method, path, buf)


def _request(method: str, path: str, host: str, body: bytes) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    if body or method in ("POST", "PUT", "PATCH"):
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _response(method: str, path: str, buf: bytes) -> tuple[int, bytes]:
    """(status, body) of the HTTP response in buf; ProbeFailed when it is none."""
    rhead, sep, rbody = buf.partition(b"\r\n\r\n")
    parts = rhead.split(b"\r\n", 1)[0].split()
    if not sep or len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ProbeFailed(f"{method} {path}: not an HTTP response: {buf[:80]!r}")
    if _header(rhead, b"transfer-encoding").lower() == b"chunked":
        rbody = _dechunk(rbody)
    else:
        length = _content_length(rhead)
        if length is not None:
            rbody = rbody[:length]
    return int(parts[1]), rbody


# The HTTP client run inside the sandbox (to its own loopback) when the node has
# no address for it: argv = port, timeout, the request (latin-1). It writes the
# raw response (up to MAX_RESPONSE_BYTES) to stdout for http_request's own
# parser (the exec's output comes back as UTF-8 text), and exits 0 whenever
# something answered. Plain sockets under `python3 -I -S`: no site, no urllib
# (http.client, email, ssl), whose imports in a gVisor sandbox cost more than
# the request: one attempt 0.097 s against urllib's 0.190 s, `runsc exec` alone
# 0.027 s (bench/probe_exec.py, bench/results/probe-exec-2026-12-02.json, 2-core
# VM). On the H200 node such a health probe took 0.279 s of a parked start.
IN_SANDBOX_HTTP = (
    "import socket,sys\n"
    "p,t,q=sys.argv[1:4]\n"
    "s=socket.create_connection(('127.0.0.1',int(p)),float(t))\n"
    "s.settimeout(float(t))\n"
    "s.sendall(q.encode('latin-1'))\n"
    "b=b''\n"
    "while len(b)<%d:\n"
    " c=s.recv(65536)\n"
    " if not c: break\n"
    " b+=c\n"
    "sys.stdout.buffer.write(b)" % MAX_RESPONSE_BYTES
)


def _exec_http(target: Target, port: int, path: str, timeout_s: float, method: str = "GET", body: bytes = b"",
               connect_only: bool = False) -> tuple[int, bytes]:
    """`http_request` from inside the sandbox: python3 when the image has it,
    else (GET only) busybox/GNU wget, which exits non-zero on any status >= 400
    without saying which, so a 200 is all it can report."""
    url = f"http://127.0.0.1:{port}{path}"
    # runsc exec and python3's start on top of the request: 1 s for a probe's
    # attempt, 5 s for a hook's long request.
    exec_timeout = timeout_s + max(1.0, min(5.0, timeout_s / 20))
    t = f"{max(timeout_s, 0.001):.3f}"
    req = _request(method, path, f"127.0.0.1:{port}", body).decode("latin-1")
    rc, out = target.exec(["python3", "-I", "-S", "-c", IN_SANDBOX_HTTP, str(port), t, req], exec_timeout)
    if rc == 0:
        return _response(method, url, out.encode())
    elif method == "GET" and (rc in (126, 127) or "executable file not found" in out
                              or "no such file" in out.lower()):
        secs = str(max(1, int(timeout_s + 0.999)))
        rc, out = target.exec(["wget", "-q", "-T", secs, "-O", "-", url], exec_timeout)
        if rc == 0:
            return 200, out.encode()
        if connect_only and "refused" not in out.lower():
            return 0, b""  # something answered the connection (wget says nothing else)
    raise ProbeFailed(f"{method} {url} from inside the sandbox failed (exit {rc}): {out.strip()[-200:]}")


def _header(head: bytes, name: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name:
            return v.strip()
    return b""


def _dechunk(body: bytes) -> bytes:
    """A chunked body's data (what urllib gave hooks before); what is cut off stays cut off."""
    out, rest = b"", body
    while rest:
        size, sep, rest = rest.partition(b"\r\n")
        try:
            n = int(size.split(b";")[0].strip() or b"0", 16)
        except ValueError:
            return body
        if not sep or n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    return out


def _content_length(head: bytes) -> int | None:
    v = _header(head, b"content-length")
    return int(v) if v.isdigit() else None


@dataclass(frozen=True)
class HttpProbe:
    port: int
    path: str = "/"
    status: int = 200
    body: str | None = None      # a substring the body must contain
    status_max: int | None = None   # set: any status from `status` to this passes

    def attempt(self, target: Target, timeout_s: float) -> str:
        status, body = http_request(target, self.port, self.path, timeout_s)
        if not self.status <= status <= (self.status_max or self.status):
            raise ProbeFailed(f"GET {self.path} answered {status}, expected {self._statuses()}")
        if self.body is not None and self.body.encode() not in body:
            raise ProbeFailed(f"GET {self.path} body lacks {self.body!r}: {body[:80]!r}")
        return f"{status}"

    def _statuses(self) -> str:
        return f"{self.status}-{self.status_max}" if self.status_max else str(self.status)

    def __str__(self) -> str:
        return f"http:{self.port}{self.path}" + (f"={self._statuses()}" if self._statuses() != "200" else "") + \
            (f"~{self.body}" if self.body is not None else "")


@dataclass(frozen=True)
class GpuProbe:
    """An HTTP request the workload answers by using its GPU; the JSON field proves it did."""
    port: int
    path: str = "/gpu"
    field: str = "gpu"

    def attempt(self, target: Target, timeout_s: float) -> str:
        status, body = http_request(target, self.port, self.path, timeout_s)
        if status != 200:
            raise ProbeFailed(f"GET {self.path} answered {status}, expected 200")
        try:
            doc = json.loads(body)
        except ValueError:
            raise ProbeFailed(f"GET {self.path} did not answer JSON: {body[:80]!r}") from None
        value = doc.get(self.field) if isinstance(doc, dict) else None
        if not value:
            raise ProbeFailed(f"GET {self.path}: field {self.field!r} is missing or false: {body[:120]!r}")
        return f"{self.field}={json.dumps(value)[:80]}"

    def __str__(self) -> str:
        return f"gpu:{self.port}{self.path}" + (f"#{self.field}" if self.field != "gpu" else "")


@dataclass(frozen=True)
class ExecProbe:
    argv: tuple[str, ...]

    def attempt(self, target: Target, timeout_s: float) -> str:
        if target.exec is None:
            raise ProbeFailed("no way to exec in the sandbox")
        rc, out = target.exec(list(self.argv), timeout_s)
        if rc != 0:
            raise ProbeFailed(f"{shlex.join(self.argv)} exited {rc}: {out.strip()[-200:]}")
        return "exit 0"

    def __str__(self) -> str:
        return "exec:" + shlex.join(self.argv)


@dataclass(frozen=True)
class FileProbe:
    """A file the workload creates when it is ready, checked inside the sandbox."""
    path: str

    def attempt(self, target: Target, timeout_s: float) -> str:
        if target.exec is None:
            raise ProbeFailed("no way to exec in the sandbox")
        rc, out = target.exec(["test", "-e", self.path], timeout_s)
        if rc != 0:
            raise ProbeFailed(f"{self.path} does not exist (test exited {rc}{': ' + out.strip()[-120:] if out.strip() else ''})")
        return "exists"

    def __str__(self) -> str:
        return f"file:{self.path}"


@dataclass(frozen=True)
class DelayProbe:
    """Passes once `seconds` have gone by since the check started."""
    seconds: float

    def attempt(self, target: Target, timeout_s: float) -> str:
        if target.started is None:
            raise ProbeFailed("no start time for a delay probe")
        left = target.started + self.seconds - time.monotonic()
        if left > 0:
            time.sleep(min(left, timeout_s))
            left = target.started + self.seconds - time.monotonic()
        if left > 0:
            raise ProbeFailed(f"{left:.1f} s of {self.seconds:g} s to go")
        return f"{self.seconds:g} s passed"

    def __str__(self) -> str:
        return f"delay:{self.seconds:g}"


def parse(text: str) -> Probe:
    """A probe from its text form (module docstring); UserError naming the probe when bad."""
    kind, sep, rest = str(text).partition(":")
    try:
        if text == "running":
            return RunningProbe()
        if not sep:
            raise ValueError("expected KIND:...")
        if kind == "tcp":
            return TcpProbe(_port(rest))
        if kind == "exec":
            argv = tuple(shlex.split(rest))
            if not argv:
                raise ValueError("exec needs a command")
            return ExecProbe(argv)
        if kind == "file":
            if not rest.startswith("/") or "\0" in rest:
                raise ValueError("file needs an absolute path inside the sandbox")
            return FileProbe(rest)
        if kind == "delay":
            secs = float(rest)
            if not 0 <= secs <= 3600:
                raise ValueError(f"delay must be 0..3600 seconds, got {rest!r}")
            return DelayProbe(secs)
        if kind in ("http", "gpu"):
            port_s, slash, path = rest.partition("/")
            path = "/" + path if slash else "/"
            if kind == "gpu":
                path, _, fld = path.partition("#")
                return GpuProbe(_port(port_s), path if slash else "/gpu", fld or "gpu")
            path, _, body = path.partition("~")
            path, eq, status = path.partition("=")
            lo, dash, hi = status.partition("-")
            st, top = (int(lo) if eq else 200), (int(hi) if dash else None)
            for x in (st, top or st):
                if not 100 <= x <= 599:
                    raise ValueError(f"status {x} is not an HTTP status")
            if top is not None and top < st:
                raise ValueError(f"status range {status} is empty")
            return HttpProbe(_port(port_s), path, st, body if "~" in rest else None, top)
        raise ValueError(f"unknown kind {kind!r}: use running, tcp, http, gpu, exec, file or delay")
    except ValueError as e:
        raise UserError(f"probe {text!r}: {e}", probe=str(text)) from None


def _gone(target: Target) -> bool:
    if target.gone is None:
        return False
    try:
        return bool(target.gone())
    except Exception:  # noqa: BLE001 - a state query that fails is not proof the workload is gone
        return False


def parse_all(texts) -> list:
    """Probes from their text forms (a flag's values, an annotation's comma-free list)."""
    return [parse(t) if isinstance(t, str) else t for t in texts]


def _port(s: str) -> int:
    p = int(s)
    if not 0 < p < 65536:
        raise ValueError(f"port {p} outside 1-65535")
    return p


GONE = "the workload is gone (exited or deleted), not waiting for it"


@dataclass(frozen=True)
class Policy:
    timeout_s: float = 30.0          # deadline of the whole check
    attempt_timeout_s: float = 2.0   # of one attempt
    setting: str = ""                # the configuration key timeout_s comes from (a failed check names it)


@dataclass
class ProbeResult:
    probe: str
    ok: bool
    attempts: int
    seconds: float                   # from the check's start to this probe's verdict
    detail: str                      # the passing answer, or the last failure


@dataclass
class HealthResult:
    healthy: bool
    seconds: float
    probes: list[ProbeResult] = field(default_factory=list)
    checked_at: float = 0.0          # wall clock, for records
    deadline_s: float = 0.0          # the check's deadline (Policy.timeout_s) and its setting
    setting: str = ""

    def to_dict(self) -> dict:
        return {"healthy": self.healthy, "seconds": round(self.seconds, 4), "checked_at": self.checked_at,
                "probes": [{**asdict(p), "seconds": round(p.seconds, 4)} for p in self.probes],
                "deadline_s": self.deadline_s, "setting": self.setting}

    def summary(self) -> str:
        text = "; ".join(f"{p.probe}: {'ok' if p.ok else 'FAILED'} after {p.attempts} attempt(s), "
                         f"{p.seconds:.3f}s ({p.detail})" for p in self.probes)
        failed = [p for p in self.probes if not p.ok]
        if failed and GONE not in failed[-1].detail and self.deadline_s:
            # It ran out of time: say which deadline, and what sets it.
            text += f"; the check's deadline is {self.deadline_s:g} s" + (f" ({self.setting})" if self.setting else "")
        return text


def check(probes: list[Probe], target: Target, policy: Policy = Policy(),
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> HealthResult:
    """Run `probes` in order, each retried until it passes or the deadline passes.
    When the container stops running the check fails at once: a workload that is
    gone will not come back, so waiting out the deadline would only delay the
    caller's cold start."""
    t0 = clock()
    if target.started is None:
        target = dataclasses.replace(target, started=time.monotonic())  # DelayProbe reads the real clock
    deadline = t0 + policy.timeout_s
    floor = min(policy.attempt_timeout_s, policy.timeout_s / 2)  # the least time an attempt is given
    results = []
    next_gone_check = t0  # asking runsc costs ~10 ms: at most every GONE_CHECK_S
    for probe in probes or [RunningProbe()]:
        attempts, backoff, detail, ok, last = 0, BACKOFF_FIRST_S, "", False, False
        while True:
            attempts += 1
            left = deadline - clock()
            try:
                detail = probe.attempt(target, max(min(policy.attempt_timeout_s, left), 0.001))
                ok = True
                break
            except ProbeFailed as e:
                detail = str(e)
            if clock() >= next_gone_check:
                next_gone_check = clock() + GONE_CHECK_S
                if _gone(target):
                    detail = f"{detail}; {GONE}"
                    break
            # The next attempt gets `floor` at least: the backoff's last sleep is cut
            # short for it, and none is made when less is left. Sleeping up to the
            # deadline made the last attempt a 1 ms one, which under load timed out and
            # hid what the workload had answered (CI, 2-core VM: 16 attempts answered
            # 404, the 17th said "timed out"; tests/integration/test_network.py).
            room = deadline - clock() - floor
            if room < 0 or last:
                break
            last = room <= backoff   # this sleep ends where the last attempt must start
            sleep(min(backoff, room))
            backoff = min(backoff * 2, BACKOFF_MAX_S)
        results.append(ProbeResult(str(probe), ok, attempts, clock() - t0, detail))
        if not ok:
            break  # later probes would only burn the deadline
    return HealthResult(all(r.ok for r in results) and len(results) == len(probes or [1]), clock() - t0,
                        results, time.time(), policy.timeout_s, policy.setting)
