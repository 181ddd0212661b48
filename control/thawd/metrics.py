"""Prometheus metrics for thawd, in the text exposition format (0.0.4).

Counters and histograms with optional labels, thread-safe, served by a tiny
HTTP endpoint (`serve`). Written here rather than pulled in as a dependency:
thawd needs a dozen series and no client library features.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Histogram buckets in seconds: restores are ~0.1-10 s, fetches up to minutes.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

HELP = {
    "thaw_restore_decisions_total": "create calls answered with restore",
    "thaw_cold_decisions_total": "create calls answered cold, by reason",
    "thaw_restores_total": "containers started by restore",
    "thaw_cold_starts_total": "opted-in containers started cold",
    "thaw_fallbacks_total": "restores that failed and fell back to a cold start, by reason",
    "thaw_cache_hits_total": "restores served from the local cache",
    "thaw_cache_misses_total": "restores that fetched from the store",
    "thaw_checkpoints_total": "checkpoints taken",
    "thaw_auto_checkpoints_total": "automatic checkpoints, by result",
    "thaw_quarantined_total": "images quarantined",
    "thaw_bytes_fetched_total": "bytes fetched from the store",
    "thaw_prepare_seconds": "time to answer create",
    "thaw_restore_seconds": "runsc restore + health check, as the stand-in measured it",
    "thaw_health_seconds": "post-restore health check",
    "thaw_checkpoint_seconds": "runsc checkpoint",
    "thaw_parks_total": "sandboxes restored ahead of demand (park.enabled), by result",
    "thaw_park_seconds": "one park: restore, every page in, CUDA state checkpointed again",
    "thaw_adoptions_total": "containers started by adopting a parked sandbox",
    "thaw_adopt_seconds": "wake of an adopted sandbox: CUDA restore, health check, hooks",
    "thaw_parked_evicted_total": "parked sandboxes removed unused, by reason (budget, idle)",
    "thaw_parked": "parked sandboxes now (gauge)",
    "thaw_parked_host_bytes": "host memory parked sandboxes hold now (gauge)",
}


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    esc = lambda v: str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')  # noqa: E731
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items())) + "}"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, str], float] = {}
        self._hists: dict[tuple[str, str], list] = {}   # [bucket counts..., sum, count]
        self._gauges: dict[tuple[str, str], float] = {}

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        k = (name, _labels(labels))
        with self._lock:
            self._counters[k] = self._counters.get(k, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        """A gauge: the value now."""
        with self._lock:
            self._gauges[(name, _labels(labels))] = float(value)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        k = (name, _labels(labels))
        with self._lock:
            h = self._hists.setdefault(k, [0] * len(BUCKETS) + [0.0, 0])
            for i, b in enumerate(BUCKETS):
                if seconds <= b:
                    h[i] += 1
            h[-2] += seconds
            h[-1] += 1

    def counters(self) -> dict[str, float]:
        """Counters and gauges by name with labels (`thaw stats`)."""
        with self._lock:
            return {n + lab: v for (n, lab), v in sorted({**self._counters, **self._gauges}.items())}

    def render(self) -> str:
        out: list[str] = []
        with self._lock:
            names = sorted({n for n, _ in self._counters} | {n for n, _ in self._hists} |
                           {n for n, _ in self._gauges})
            for name in names:
                kind = "histogram" if any(n == name for n, _ in self._hists) else \
                    "gauge" if any(n == name for n, _ in self._gauges) else "counter"
                out.append(f"# HELP {name} {HELP.get(name, name)}")
                out.append(f"# TYPE {name} {kind}")
                if kind in ("counter", "gauge"):
                    for (n, lab), v in sorted((self._counters if kind == "counter" else self._gauges).items()):
                        if n == name:
                            out.append(f"{name}{lab} {v:g}")
                    continue
                for (n, lab), h in sorted(self._hists.items()):
                    if n != name:
                        continue
                    inner = lab[1:-1] + "," if lab else ""
                    for i, b in enumerate(BUCKETS):
                        out.append(f'{name}_bucket{{{inner}le="{b:g}"}} {h[i]}')
                    out.append(f'{name}_bucket{{{inner}le="+Inf"}} {h[-1]}')
                    out.append(f"{name}_sum{lab} {h[-2]:g}")
                    out.append(f"{name}_count{lab} {h[-1]}")
        return "\n".join(out) + "\n"


def serve(metrics: Metrics, addr: str) -> ThreadingHTTPServer:
    """Serve GET /metrics on host:port in a daemon thread."""
    host, _, port = addr.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # thawd logs its own way
            pass

        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="metrics", daemon=True).start()
    return srv
