"""Flood benchmark: checkpoint/restore an epoll HTTP server under a connection
and packet flood, with thaw's network mitigations on and off.

Each cycle: open keep-alive client connections (one request each), start the
flood (TCP connects, requests, garbage, half requests, resets through the
published port; UDP datagrams to the sandbox address), checkpoint the running
sandbox (it exits), restore the image under a new id, then measure

- answer: time from "ready" to the first HTTP 200 on a NEW connection through
  the published port, polled every 2 ms. "Ready" is the instant the gate
  opened (mitigations on: after the health check passed) or the instant
  `runsc restore` returned (mitigations off: no gate, no health check);
- the fate of the connections open at checkpoint time: answered, a clean
  failure (reset, or an error such as ETIMEDOUT / EHOSTUNREACH), or a hang
  (neither within OPEN_CONN_BOUND_S);
- whether the restored process is the same one (boot id) and its counters.

The next cycle checkpoints the restored sandbox. A restore that never answers
is counted, removed, and a cold sandbox takes its place.

Mitigations on = gate closed over save and restore + the checkpoint's address
+ health check before the gate opens. Off = no gate, a NEW address in a fresh
netns, no health check: what a naive implementation does.

This is the CLI door (thaw's own sandboxes). `--door containerd` runs the same
cycles through containerd, gVisor's shim, the stand-in and thawd, each a new
container restored from one image thawd saved: bench/network_flood_containerd.py,
which shares this module's flood, measurements and table.

Usage (root, after `make setup`):
    .venv/bin/python bench/network_flood.py [--door cli|containerd] --cycles 50 [--modes on,off]
        [--out bench/results/network-flood-2026-11-29.json] [--doc docs/benchmarks.md]

Traffic goes only to 127.0.0.1 and to sandbox addresses inside the namespaces
the run creates (its own subnet, which has an `unreachable` route).
"""
from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import os
import platform
import random
import select
import shutil
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from control import config as configmod  # noqa: E402
from control.errors import ThawError, UnhealthyRestore  # noqa: E402
from control.lifecycle.sandbox import Mitigations, Sandboxes  # noqa: E402
from runsc_hooks import network as netmod  # noqa: E402
from runsc_hooks import spec as specmod  # noqa: E402
from runsc_hooks.runsc import remove_root  # noqa: E402

WORKLOAD = REPO / "control" / "dev" / "workloads" / "epoll_server.py"
SANDBOX_PORT = 8080
ANSWER_BUDGET_MS = 200.0      # the bar: every restore answers within 200 ms of ready
ANSWER_DEADLINE_S = 5.0       # no answer by then: the restore is broken
OPEN_CONNS = 4                # client connections open across each checkpoint
OPEN_CONN_BOUND_S = 5.0       # no answer and no error by then: a hang
COLD_DEADLINE_S = 60.0


# The epoll server: the host's Python (stdlib only), bound read-only, in both doors.
SERVER_ARGV = [sys.executable, str(WORKLOAD), str(SANDBOX_PORT)]
SERVER_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


def server_mounts() -> list[dict]:
    """Read-only binds of the host's system directories, its Python and the workload."""
    return specmod.host_layout([sys.prefix, sys.base_prefix, str(WORKLOAD.parent)])


def server_spec(settings: configmod.Settings, sid: str) -> dict:
    """The epoll server as a command sandbox of the CLI door."""
    rootfs = specmod.prepare_host_rootfs(settings.state_dir / "rootfs" / sid)
    return specmod.command_spec(SERVER_ARGV, rootfs=str(rootfs), env=SERVER_ENV,
                                extra_mounts=server_mounts(), hostname="thaw-flood")


# -- plain HTTP client (unmarked: what any client of the node does) --------------------

def _read_response(s: socket.socket, deadline: float) -> tuple[int, bytes]:
    buf = b""
    while True:
        head, sep, body = buf.partition(b"\r\n\r\n")
        if sep:
            length = next((int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n")[1:]
                           if ln.lower().startswith(b"content-length:")), 0)
            if len(body) >= length:
                parts = head.split(b"\r\n", 1)[0].split()
                return int(parts[1]), body[:length]
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete response")
        s.settimeout(left)
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionResetError(errno.ECONNRESET, "closed before a complete response")
        buf += chunk


def get(host: str, port: int, path: str, timeout_s: float) -> tuple[int, bytes]:
    deadline = time.monotonic() + timeout_s
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return _read_response(s, deadline)


def first_answer(host: str, port: int, since: float, deadline_s: float) -> dict | None:
    """The first 200 on a new connection after `since` (time.monotonic): {"ms" from `since`,
    "attempts", "connect_ms" and "response_ms" of the attempt that answered}; None: none in time."""
    end = since + deadline_s
    attempts = 0
    while time.monotonic() < end:
        attempts += 1
        t0 = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=min(1.0, max(end - t0, 0.01))) as s:
                t1 = time.monotonic()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                status, _ = _read_response(s, t1 + min(1.0, max(end - t1, 0.01)))
            t2 = time.monotonic()
            if status == 200:
                return {"ms": (t2 - since) * 1000.0, "attempts": attempts, "connect_ms": (t1 - t0) * 1000.0,
                        "response_ms": (t2 - t1) * 1000.0}
        except OSError:
            pass
        time.sleep(0.002)
    return None


def first_answer_ms(host: str, port: int, since: float, deadline_s: float) -> float | None:
    """Milliseconds from `since` (time.monotonic) to the first 200 on a new connection; None: none in time."""
    a = first_answer(host, port, since, deadline_s)
    return a["ms"] if a else None


# -- the flood ---------------------------------------------------------------------

@dataclass(frozen=True)
class FloodConfig:
    tcp_threads: int = 3
    udp_threads: int = 1
    tcp_rate: float = 150.0          # operations per second per TCP thread (a cap)
    udp_rate: float = 500.0          # datagrams per second per UDP thread (a cap)
    connect_timeout_s: float = 0.2


# "moderate" is what the integration test uses; "heavy" is what two cores can
# still drive from Python next to the sandbox (the achieved rates are recorded).
PROFILES = {
    "moderate": FloodConfig(),
    "heavy": FloodConfig(tcp_threads=4, tcp_rate=400.0, udp_threads=2, udp_rate=1500.0),
}


class Flooder:
    """Bounded background load. Threads stop on stop() or after max_s by themselves."""

    OPS = ("get", "get", "garbage", "half", "rst", "syn")

    def __init__(self, tcp: tuple[str, int], udp: tuple[str, int] | None, cfg: FloodConfig, allowed: str,
                 max_s: float = 120.0, seed: int = 0) -> None:
        for host in [tcp[0]] + ([udp[0]] if udp else []):
            ip = ipaddress.ip_address(host)
            if not (ip.is_loopback or ip in ipaddress.ip_network(allowed)):
                raise ValueError(f"flood target {host} is neither loopback nor in {allowed}")
        self.tcp, self.udp, self.cfg = tcp, udp, cfg
        self.deadline = time.monotonic() + max_s
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.stats: dict[str, int] = {}
        self.threads = [threading.Thread(target=self._tcp_loop, args=(seed * 100 + i,), daemon=True)
                        for i in range(cfg.tcp_threads)]
        if udp:
            self.threads += [threading.Thread(target=self._udp_loop, args=(seed * 100 + 50 + i,), daemon=True)
                             for i in range(cfg.udp_threads)]

    def _count(self, key: str) -> None:
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + 1

    def _running(self) -> bool:
        return not self.stop_event.is_set() and time.monotonic() < self.deadline

    def _tcp_loop(self, seed: int) -> None:
        rng = random.Random(seed)
        period = 1.0 / self.cfg.tcp_rate
        while self._running():
            t0 = time.monotonic()
            op = rng.choice(self.OPS)
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # Close with RST: no TIME_WAIT piles up on the client side.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            try:
                if op == "syn":
                    s.setblocking(False)
                    s.connect_ex(self.tcp)
                    self._count("syn")
                    continue
                s.settimeout(self.cfg.connect_timeout_s)
                s.connect(self.tcp)
                self._count("connected")
                if op == "get":
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    status, _ = _read_response(s, time.monotonic() + 0.5)
                    self._count("answered" if status == 200 else f"status {status}")
                elif op == "garbage":
                    s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randint(16, 512))) + b"\r\n\r\n")
                    self._count("garbage")
                elif op == "half":
                    s.sendall(b"GET /hea")
                    self._count("half")
                else:
                    self._count("rst")
            except OSError as e:
                self._count(errno.errorcode.get(e.errno, type(e).__name__) if e.errno else type(e).__name__)
            finally:
                s.close()
                # Never spin: failures (refused, unreachable) come back instantly.
                time.sleep(max(period - (time.monotonic() - t0), 0.001))

    def _udp_loop(self, seed: int) -> None:
        rng = random.Random(seed)
        period = 1.0 / self.cfg.udp_rate
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            while self._running():
                t0 = time.monotonic()
                try:
                    u.sendto(rng.randbytes(rng.randint(32, 1024)), self.udp)
                    self._count("udp_sent")
                except OSError as e:
                    self._count("udp " + errno.errorcode.get(e.errno, "error"))
                time.sleep(max(period - (time.monotonic() - t0), 0.001))

    def start(self) -> "Flooder":
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> dict[str, int]:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=5)
        with self.lock:
            return dict(self.stats)


# -- connections held open across a checkpoint -------------------------------------------

def open_connections(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=2.0)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _ = _read_response(s, time.monotonic() + 2.0)
        if status != 200:
            raise RuntimeError(f"open connection got {status}")
        socks.append(s)
    return socks


def fate_of(socks: list[socket.socket], bound_s: float) -> list[str]:
    """Send one request on each connection; answered / reset / error:<errno> / hang."""
    out: dict[int, str] = {}
    bufs: dict[int, bytes] = {}
    for i, s in enumerate(socks):
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            bufs[i] = b""
        except OSError as e:
            out[i] = _classify(e)
    deadline = time.monotonic() + bound_s
    while len(out) < len(socks) and time.monotonic() < deadline:
        pending = {socks[i]: i for i in range(len(socks)) if i not in out}
        ready, _, _ = select.select(list(pending), [], [], max(deadline - time.monotonic(), 0))
        for s in ready:
            i = pending[s]
            try:
                chunk = s.recv(65536)
            except OSError as e:
                out[i] = _classify(e)
                continue
            if not chunk:
                out[i] = "reset"  # an orderly close without an answer: a clean failure too
                continue
            bufs[i] += chunk
            if b"\r\n\r\n" in bufs[i]:
                out[i] = "answered" if bufs[i].startswith(b"HTTP/1.1 200") else "error:status"
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    return [out.get(i, "hang") for i in range(len(socks))]


def _classify(e: OSError) -> str:
    if e.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
        return "reset"
    return "error:" + errno.errorcode.get(e.errno or 0, type(e).__name__)


# -- cycles ------------------------------------------------------------------------------

@dataclass
class Cycle:
    mode: str
    index: int
    answered: bool = False              # a new connection got 200 within ANSWER_DEADLINE_S of ready
    answer_ms: float | None = None      # ready -> first 200 on a new connection
    answer_detail: dict = field(default_factory=dict)  # attempts; connect and response time of the answering one
    checkpoint_s: float = 0.0
    restore_s: float = 0.0              # restore() until ready (plumbing, runsc, health, gate)
    runsc_restore_s: float = 0.0
    health_s: float | None = None
    gate_dropped: int | None = None     # packets the gate held off during the restore
    address_changed: bool = False
    same_process: bool | None = None    # boot id unchanged
    open_conns: list[str] = field(default_factory=list)
    flood: dict[str, int] = field(default_factory=dict)
    flood_s: float = 0.0                # how long the flood ran in this cycle
    error: str | None = None
    late_failure: str | None = None     # answered after restore, then stopped serving before the next cycle
    diagnosis: dict = field(default_factory=dict)
    loadavg_1m: float = 0.0             # of the whole machine (other jobs share it), at the cycle's end


def _settings(base: Path, subnet: str) -> configmod.Settings:
    env = {
        "THAW_NODE_STATE_DIR": str(base / "state"),
        "THAW_NODE_LOG_DIR": str(base / "log"),
        "THAW_RUNSC_ROOT": str(base / "runsc-root"),
        "THAW_RUNSC_PATH": str(REPO / "build" / "runsc"),
        "THAW_NETWORK_SUBNET": subnet,
        "THAW_CACHE_DIR": str(base / "cache"),
        "THAW_THAWD_HEALTH_TIMEOUT_S": "10",
        "THAW_THAWD_HEALTH_ATTEMPT_TIMEOUT_S": "0.5",
    }
    base.mkdir(parents=True, exist_ok=True)
    (base / "empty-config.toml").write_text("")
    return configmod.load(environ=env, config_file=base / "empty-config.toml")


def _start_cold(sb: Sandboxes, sid: str, node_port: int) -> str:
    sb.run(sid, server_spec(sb.settings, sid), probes=(f"http:{SANDBOX_PORT}/health",),
           ports=(netmod.Port(node_port, SANDBOX_PORT),))
    if first_answer_ms("127.0.0.1", node_port, time.monotonic(), COLD_DEADLINE_S) is None:
        raise RuntimeError(f"cold sandbox {sid} never answered on 127.0.0.1:{node_port}")
    return sid


def _boot_id(node_port: int) -> str | None:
    try:
        status, body = get("127.0.0.1", node_port, "/state", 2.0)
        return json.loads(body)["boot_id"] if status == 200 else None
    except (OSError, ValueError, KeyError):
        return None


def _diagnose(sb: Sandboxes, sid: str) -> dict:
    """What still works on a sandbox that stopped answering through the published port."""
    return diagnose_address(sb.address(sid), sb.settings.network_probe_mark)


def diagnose_address(address: str | None, mark: int) -> dict:
    """Probe the server at its sandbox address, past any gate (probes carry the mark)."""
    from runsc_hooks import probe as probemod
    target = probemod.Target(address=address, mark=mark)
    out = {}
    for probe in (f"tcp:{SANDBOX_PORT}", f"http:{SANDBOX_PORT}/state"):
        try:
            out[probe] = probemod.parse(probe).attempt(target, 3.0)
        except probemod.ProbeFailed as e:
            out[probe] = f"failed: {e}"
    return out


class ModeRunner:
    """Checkpoint/restore cycles of one server sandbox with mitigations `mode` ("on" | "off")."""

    def __init__(self, settings: configmod.Settings, name: str, mode: str, node_port: int, flood: FloodConfig,
                 workdir: Path) -> None:
        self.sb = Sandboxes(settings)
        self.settings, self.name, self.mode, self.port, self.flood = settings, name, mode, node_port, flood
        self.mit = Mitigations() if mode == "on" else Mitigations.off()
        self.workdir = workdir
        self.out: list[Cycle] = []
        self.cur = ""

    def start(self) -> "ModeRunner":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cur = _start_cold(self.sb, f"{self.name}-{self.mode}-cold0", self.port)
        return self

    def cycle(self, i: int) -> Cycle:
        sb, port, mit = self.sb, self.port, self.mit
        c = Cycle(self.mode, i)
        nxt = f"{self.name}-{self.mode}-{i}"
        image = self.workdir / f"{self.mode}-{i}"
        boot = _boot_id(port)
        try:
            socks = open_connections(port, OPEN_CONNS)
        except (OSError, RuntimeError) as e:
            # The last restore answered, then stopped serving: a failure of that restore.
            if self.out:
                self.out[-1].late_failure = f"{type(e).__name__}: {e}"
                self.out[-1].diagnosis = _diagnose(sb, self.cur)
            sb.delete(self.cur, force=True)
            self.cur = _start_cold(sb, f"{self.name}-{self.mode}-cold{i}x", port)
            boot = _boot_id(port)
            socks = open_connections(port, OPEN_CONNS)
        before_ip = sb.address(self.cur)
        fl = Flooder(("127.0.0.1", port), (before_ip, SANDBOX_PORT), self.flood, self.settings.network_subnet,
                     seed=i).start()
        t_flood = time.monotonic()
        try:
            time.sleep(0.3)  # the server is under load when the save starts
            ck = sb.checkpoint(self.cur, image, mitigations=mit)
            c.checkpoint_s = ck.seconds
            t0 = time.monotonic()
            try:
                rs = sb.restore(image, nxt, mitigations=mit)
            except UnhealthyRestore as e:
                c.error = f"unhealthy: {e.message}"
                rs = None
            except ThawError as e:  # a failed restore is a result here, not the end of the run
                c.error = f"{type(e).__name__}: {e.message}"
                rs = None
            if rs is not None:
                self.cur = nxt
                c.restore_s, c.runsc_restore_s = rs.ready_at - t0, rs.runsc_s
                c.health_s = rs.health.seconds if rs.health else None
                c.gate_dropped = rs.gate_dropped
                c.address_changed = rs.sandbox_ip != before_ip
                a = first_answer("127.0.0.1", port, rs.ready_at, ANSWER_DEADLINE_S)
                c.answered = a is not None
                if a:
                    c.answer_ms = a.pop("ms")
                    c.answer_detail = {k: round(v, 2) for k, v in a.items()}
            c.open_conns = fate_of(socks, OPEN_CONN_BOUND_S)
        finally:
            c.flood = fl.stop()
            c.flood_s = round(time.monotonic() - t_flood, 3)
            shutil.rmtree(image, ignore_errors=True)
        c.loadavg_1m = round(os.getloadavg()[0], 2)
        if c.answered:
            c.same_process = _boot_id(port) == boot
        else:
            c.error = c.error or f"no answer within {ANSWER_DEADLINE_S:g}s of ready"
            if sb.get(nxt) is not None:
                sb.delete(nxt, force=True)
            self.cur = _start_cold(sb, f"{self.name}-{self.mode}-cold{i + 1}", port)
        self.out.append(c)
        return c

    def close(self) -> None:
        prefix = f"{self.name}-{self.mode}-"
        for rec in self.sb.list_records():
            if rec.id.startswith(prefix):
                self.sb.delete(rec.id, force=True)
        for d in (self.settings.state_dir / "rootfs").glob(prefix + "*"):
            shutil.rmtree(d, ignore_errors=True)


def run_mode(settings: configmod.Settings, name: str, mode: str, cycles: int, node_port: int,
             flood: FloodConfig, workdir: Path, progress=None) -> list[Cycle]:
    """`cycles` checkpoint/restore cycles under flood with mitigations `mode` ("on" | "off")."""
    return run_interleaved(settings, name, [mode], cycles, {mode: node_port}, flood, workdir, progress)[mode]


def run_interleaved(settings: configmod.Settings, name: str, modes: list[str], cycles: int,
                    ports: dict[str, int], flood: FloodConfig, workdir: Path, progress=None) -> dict[str, list[Cycle]]:
    """Cycles of several modes taken in turn (on 0, off 0, on 1, ...): whatever else loads the
    machine meanwhile weighs on every mode alike."""
    runners = {}
    try:
        for m in modes:
            runners[m] = ModeRunner(settings, name, m, ports[m], flood, workdir).start()
        for i in range(cycles):
            for m in modes:
                c = runners[m].cycle(i)
                if progress:
                    progress(c)
    finally:
        for r in runners.values():
            r.close()
    return {m: r.out for m, r in runners.items()}


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 2)


def summarize(cycles: list[Cycle]) -> dict:
    ans = [c.answer_ms for c in cycles if c.answer_ms is not None]
    conn = [c.answer_detail["connect_ms"] for c in cycles if c.answer_detail]
    resp = [c.answer_detail["response_ms"] for c in cycles if c.answer_detail]
    fates: dict[str, int] = {}
    for c in cycles:
        for f in c.open_conns:
            fates[f] = fates.get(f, 0) + 1
    flood: dict[str, int] = {}
    for c in cycles:
        for k, v in c.flood.items():
            flood[k] = flood.get(k, 0) + v
    n = len(cycles)
    within = sum(1 for c in cycles if c.answer_ms is not None and c.answer_ms <= ANSWER_BUDGET_MS)
    return {
        "cycles": n,
        "answered_within_200ms": within,
        "failure_rate_200ms": round((n - within) / n, 4) if n else None,
        "never_answered": sum(1 for c in cycles if not c.answered),
        "failure_rate_never_answered": round(sum(1 for c in cycles if not c.answered) / n, 4) if n else None,
        "stopped_serving_later": sum(1 for c in cycles if c.late_failure),
        "loadavg_1m_max": max((c.loadavg_1m for c in cycles), default=None),
        "unhealthy_restores": sum(1 for c in cycles if (c.error or "").startswith("unhealthy")),
        "answer_ms": {"p50": _pct(ans, 0.5), "p95": _pct(ans, 0.95), "max": round(max(ans), 2) if ans else None,
                      "min": round(min(ans), 2) if ans else None},
        "same_process": sum(1 for c in cycles if c.same_process),
        "open_connections": fates,
        "open_connections_hung": fates.get("hang", 0),
        "restore_ms_p50": _pct([c.restore_s * 1000 for c in cycles if c.restore_s], 0.5),
        "runsc_restore_ms_p50": _pct([c.runsc_restore_s * 1000 for c in cycles if c.runsc_restore_s], 0.5),
        "health_ms_p50": _pct([c.health_s * 1000 for c in cycles if c.health_s is not None], 0.5),
        "checkpoint_ms_p50": _pct([c.checkpoint_s * 1000 for c in cycles if c.checkpoint_s], 0.5),
        # Of the answering attempt: a slow connect is the listener's SYN path, a slow response the server.
        "answer_connect_ms": {"p50": _pct(conn, 0.5), "max": round(max(conn), 2) if conn else None},
        "answer_response_ms": {"p50": _pct(resp, 0.5), "max": round(max(resp), 2) if resp else None},
        "answer_attempts_max": max((c.answer_detail.get("attempts", 0) for c in cycles), default=0),
        "gate_dropped_packets_total": sum(c.gate_dropped or 0 for c in cycles),
        "flood_totals": flood,
        "flood_seconds": round(sum(c.flood_s for c in cycles), 1),
    }


def markdown(result: dict) -> str:
    profiles = [p for p in PROFILES if p in result["profiles"]]
    return "\n\n".join(_table(result, prof) for prof in profiles) + "\n\n" + _footer(result)


# What each door's "fates" row counts. Under containerd every cycle restores a
# NEW container from the one image thawd saved: no connection is open at a
# checkpoint; the counted ones were open to the container the cycle replaced.
FATES_LABEL = {
    "cli": "connections open at checkpoint: answered / reset / error / hang",
    "containerd": "connections open to the replaced container: answered / reset / error / hang",
}
MARKERS = {
    "cli": ("<!-- flood-table:start -->", "<!-- flood-table:end -->"),
    "containerd": ("<!-- flood-table-containerd:start -->", "<!-- flood-table-containerd:end -->"),
}


def _table(result: dict, profile: str) -> str:
    door = result.get("door", "cli")
    rows = [("cycles", "cycles"), ("new connection answered within 200 ms of ready", "within"),
            ("restores that never answered (5 s)", "never"),
            ("answered, then stopped serving before the next cycle", "late"),
            ("answer time p50 / p95 / max (ms)", "dist"),
            ("same process after restore (boot id)", "same"),
            (FATES_LABEL[door], "fates"),
            ("restore to ready, p50 (ms)", "restore"),
            ("answering attempt, worst case (ms): connect / response", "split"),
            ("packets held off by the gate (all cycles)", "dropped")]
    pr = result["profiles"][profile]
    modes = [m for m in ("on", "off") if m in pr["modes"]]

    def cell(s: dict, key: str) -> str:
        if key == "cycles":
            return str(s["cycles"])
        if key == "within":
            return f"{s['answered_within_200ms']}/{s['cycles']} (failure rate {s['failure_rate_200ms']:.0%})"
        if key == "never":
            return f"{s['never_answered']}/{s['cycles']} ({s['failure_rate_never_answered']:.0%})"
        if key == "late":
            return f"{s['stopped_serving_later']}/{s['cycles']}"
        if key == "dist":
            a = s["answer_ms"]
            return " / ".join("-" if a[k] is None else f"{a[k]:.1f}" for k in ("p50", "p95", "max"))
        if key == "same":
            return f"{s['same_process']}/{s['cycles']}"
        if key == "fates":
            f = s["open_connections"]
            err = sum(v for k, v in f.items() if k.startswith("error"))
            return f"{f.get('answered', 0)} / {f.get('reset', 0)} / {err} / {f.get('hang', 0)}"
        if key == "restore":
            return (f"{s['restore_ms_p50']:.0f} (runsc restore {s['runsc_restore_ms_p50']:.0f}"
                    + ("" if s["health_ms_p50"] is None else f", health check {s['health_ms_p50']:.1f}") + ")")
        if key == "split":
            return f"{s['answer_connect_ms']['max']:.1f} / {s['answer_response_ms']['max']:.1f}"
        if key == "dropped":
            return str(s["gate_dropped_packets_total"]) if s["gate_dropped_packets_total"] else "- (no gate)"
        raise KeyError(key)

    f = pr["flood"]
    head = (f"| {profile} flood ({f['tcp_threads']} TCP threads x {f['tcp_rate']:g}/s, {f['udp_threads']} UDP x "
            f"{f['udp_rate']:g}/s) | " + " | ".join(f"mitigations {m}" for m in modes) + " |")
    lines = [head, "|---|" + "---|" * len(modes)]
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(cell(pr["modes"][m]["summary"], key) for m in modes) + " |")
    return "\n".join(lines)


def _footer(result: dict) -> str:
    env = result["environment"]
    if result.get("door") == "containerd":
        from bench import network_flood_containerd
        return network_flood_containerd.footer(result)
    return (f"Measured {result['date']} on {env['machine']} ({env['cpus']} CPUs, kernel {env['kernel']}), "
            f"runsc `{env['runsc_version']}`, platform {env['platform']}; {OPEN_CONNS} client connections held "
            f"open across each checkpoint; \"ready\" is the gate opening (on) or `runsc restore` returning (off). "
            f"Data: `bench/results/{Path(result['out']).name}`.")


def replace_between(path: Path, text: str, start: str = "<!-- flood-table:start -->",
                    end: str = "<!-- flood-table:end -->") -> None:
    doc = path.read_text()
    if start not in doc or end not in doc:
        raise SystemExit(f"{path} lacks the markers {start} ... {end}")
    a, b = doc.index(start) + len(start), doc.index(end)
    path.write_text(doc[:a] + "\n" + text + "\n" + doc[b:])


def profile_result(flood: FloodConfig, seconds: float, by_mode: dict[str, list[Cycle]]) -> dict:
    """One profile's entry of the results JSON (both doors)."""
    return {"flood": asdict(flood), "seconds": round(seconds, 1),
            "modes": {m: {"summary": summarize(cs), "cycles": [asdict(c) for c in cs]} for m, cs in by_mode.items()}}


def progress(profile: str, c: Cycle) -> None:
    print(f"[{profile} {c.mode}] cycle {c.index}: answer {c.answer_ms and round(c.answer_ms, 1)} ms "
          f"{c.answer_detail}, restore {c.restore_s:.2f}s, open conns {c.open_conns}, "
          f"load {c.loadavg_1m}, error {c.error}", flush=True)


def _run_cli(a: argparse.Namespace, result: dict) -> None:
    """The CLI door: thaw's own sandboxes (Sandboxes), `thaw checkpoint` + `thaw restore` per cycle."""
    settings = _settings(a.base, a.subnet)
    name = "bench-flood"
    sb = Sandboxes(settings)
    result["environment"].update({"runsc_version": sb.runsc().version(), "platform": settings.runsc_platform})
    try:
        for prof in a.profiles.split(","):
            flood = PROFILES[prof]
            modes = a.modes.split(",")
            t0 = time.monotonic()
            ports = {m: a.node_port + k for k, m in enumerate(modes)}
            by_mode = run_interleaved(settings, name, modes, a.cycles, ports, flood, a.base / "images",
                                      lambda c, prof=prof: progress(prof, c))
            result["profiles"][prof] = profile_result(flood, time.monotonic() - t0, by_mode)
            print(json.dumps({prof: {m: v["summary"] for m, v in result["profiles"][prof]["modes"].items()}},
                             indent=2), flush=True)
    finally:
        Sandboxes(settings).recover()
        netmod.cleanup_leftovers(set(), prefix=name)
        netmod.remove_subnet_route(a.subnet)
        remove_root(settings.runsc_root)
        shutil.rmtree(a.base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--door", choices=("cli", "containerd"), default="cli",
                    help="cli: thaw's own sandboxes (thaw checkpoint/restore); containerd: ctr run through "
                         "containerd, gVisor's shim, the stand-in and thawd (bench/network_flood_containerd.py)")
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--modes", default="on,off")
    ap.add_argument("--profiles", default="moderate,heavy", help=f"flood profiles: {', '.join(PROFILES)}")
    ap.add_argument("--base", type=Path, default=Path("/tmp/thaw-bench/network-flood"))
    ap.add_argument("--subnet", default="10.215.32.0/20")
    ap.add_argument("--node-port", type=int, default=28080)
    ap.add_argument("--out", type=Path, default=None,
                    help="results JSON (default: bench/results/network-flood-2026-11-29.json for the cli door, "
                         "network-flood-containerd-<today>.json for containerd)")
    ap.add_argument("--doc", type=Path, action="append", default=[])
    ap.add_argument("--logs", type=Path, default=None,
                    help="containerd door: keep thawd's, the stand-in's and containerd's logs here")
    ap.add_argument("--render", type=Path, default=None,
                    help="Only re-render the table from a results JSON into --doc files (no run).")
    a = ap.parse_args(argv)
    if a.render:
        result = json.loads(a.render.read_text())
        for doc in a.doc:
            replace_between(doc, markdown(result), *MARKERS[result.get("door", "cli")])
        print(markdown(result))
        return 0
    if a.out is None:
        a.out = REPO / "bench" / "results" / ("network-flood-2026-11-29.json" if a.door == "cli" else
                                              f"network-flood-containerd-{time.strftime('%Y-%m-%d')}.json")
    if os.geteuid() != 0:
        raise SystemExit("network_flood: needs root (runsc, netns)")
    result: dict = {"date": time.strftime("%Y-%m-%d"), "door": a.door, "out": str(a.out),
                    "open_connections_per_cycle": OPEN_CONNS,
                    "answer_budget_ms": ANSWER_BUDGET_MS, "answer_deadline_s": ANSWER_DEADLINE_S,
                    "open_conn_bound_s": OPEN_CONN_BOUND_S, "profiles": {}}
    result["environment"] = {"machine": platform.node() or "unknown", "cpus": os.cpu_count(),
                             "kernel": platform.release(), "python": platform.python_version(),
                             "loadavg_at_start": os.getloadavg()}
    if a.door == "containerd":
        from bench import network_flood_containerd
        network_flood_containerd.run(a, result)
    else:
        _run_cli(a, result)
    result["environment"]["loadavg_at_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    table = markdown(result)
    print(table)
    for doc in a.doc:
        replace_between(doc, table, *MARKERS[a.door])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ThawError as e:
        print(f"network_flood: {e}", file=sys.stderr)
        sys.exit(1)
