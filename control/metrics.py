"""thaw's Prometheus metrics: one table of every series, backed by prometheus-client.

Every series is declared once, in SERIES, with its kind, help, labels and, where
a rate is expected, the label values it starts at zero with (a counter that
appears only at its first increment hides that increment from rate() and
increase()). Names follow Prometheus' conventions: a unit in the name, `_total`
on counters, histograms in `_seconds`.

Two faces:
    Metrics      one registry (thawd has one; every unit test makes its own):
                 inc / observe / set / add by series name, counters() for `thaw stats`,
                 render() and serve() for /metrics (prometheus-client's own handler).
    inc, observe, set_gauge, add
                 for code below thawd (control/images: bytes fetched, retries, store
                 errors, streams, a full cache) that cannot know about a daemon: they
                 go to the Metrics that `install()`ed itself in this process (thawd's),
                 and to nothing in a CLI command, which imports no prometheus-client.

control/thawd/metrics.py keeps its names (Metrics, serve, HELP, BUCKETS) for
its callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# Histogram buckets in seconds: restores are ~0.1-10 s, fetches up to minutes.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


@dataclass(frozen=True)
class Series:
    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()
    zero: tuple[tuple[str, ...], ...] = ()   # label values a counter starts at 0 with (() : unlabelled at 0)


_FALLBACK_REASONS = ("restore-failed", "health-failed", "hook-failed", "stream-failed")
# Every reason thawd answers a create cold with (its text up to the first ':'), so that
# each rate starts at zero; tests/unit/test_metrics.py finds them in the source and
# fails on one missing here.
_COLD_REASONS = (
    # control/thawd/service.py and prepare.py: a lone container, and a pod's sandbox image
    "not-opted-in", "spec", "quarantined", "fetch-in-progress", "no-image", "spec-mismatch",
    # control/thawd/prepare.py fetch_reason: a pull that failed
    "manifest-refused", "no-tenant-key", "manifest-invalid", "tuple-mismatch", "fetch-failed",
    # IdentityError codes (control/thawd/ctrinfo.py, control/lifecycle/tenant.py)
    "identity-unknown", "no-image-digest", "image-moved", "tenant-refused",
    # control/thawd/pods.py: a pod's containers
    "no-declared-containers", "pod-failed-before", "pod-unknown", "pod-failed", "pod-cold", "pod-running",
    "init-satisfied",
)
SERIES: tuple[Series, ...] = (
    # Decisions at create, and how the start went (thawd).
    Series("thaw_restore_decisions_total", COUNTER, "Create calls answered with restore.", zero=((),)),
    Series("thaw_cold_decisions_total", COUNTER, "Create calls answered cold, by reason.", ("reason",),
           zero=tuple((r,) for r in _COLD_REASONS)),
    Series("thaw_restores_total", COUNTER, "Containers started by restore.", zero=((),)),
    Series("thaw_cold_starts_total", COUNTER, "Opted-in containers started cold.", zero=((),)),
    Series("thaw_fallbacks_total", COUNTER, "Restores that failed and fell back to a cold start, by reason.",
           ("reason",), zero=tuple((r,) for r in _FALLBACK_REASONS)),
    Series("thaw_restores_abandoned_total", COUNTER,
           "Restores decided whose stand-in was gone before it could start them.", zero=((),)),
    Series("thaw_cache_hits_total", COUNTER, "Restores served from the node cache.", zero=((),)),
    Series("thaw_cache_misses_total", COUNTER, "Restores that fetched or streamed from the store.", zero=((),)),
    Series("thaw_checkpoints_total", COUNTER, "Checkpoints taken.", zero=((),)),
    Series("thaw_auto_checkpoints_total", COUNTER, "Automatic checkpoints, by result.", ("result",),
           zero=(("ok",), ("error",))),
    Series("thaw_quarantined_total", COUNTER, "Images quarantined after repeated failed restores.", zero=((),)),
    Series("thaw_prepare_seconds", HISTOGRAM, "Time to answer create (PrepareRestore)."),
    Series("thaw_restore_seconds", HISTOGRAM, "runsc restore + health check of a container, by workload "
           "(the key less its identity digest; \"\" where the call site does not say).", ("workload",)),
    Series("thaw_health_seconds", HISTOGRAM, "Post-restore health check."),
    Series("thaw_checkpoint_seconds", HISTOGRAM, "runsc checkpoint, by workload (as thaw_restore_seconds).",
           ("workload",)),
    # Parking (thawd/parking.py).
    Series("thaw_parks_total", COUNTER, "Sandboxes restored ahead of demand (park.enabled), by result.",
           ("result",), zero=(("parked",), ("failed",))),
    Series("thaw_park_seconds", HISTOGRAM, "One park: restore, every page in, CUDA state checkpointed again."),
    Series("thaw_adoptions_total", COUNTER, "Containers started by adopting a parked sandbox.", zero=((),)),
    Series("thaw_adopt_seconds", HISTOGRAM, "Wake of an adopted sandbox: CUDA restore, health check, hooks."),
    Series("thaw_parked_evicted_total", COUNTER, "Parked sandboxes removed unused, by reason.", ("reason",),
           zero=(("budget",), ("idle",), ("dead",))),
    Series("thaw_parked_sandboxes", GAUGE, "Parked sandboxes now."),
    Series("thaw_parked_host_bytes", GAUGE, "Host memory the parked sandboxes hold now."),
    # The Kubernetes API (control/thawd/events.py, podspecs.py).
    Series("thaw_kube_events_total", COUNTER, "Events on pods, by result: posted, aggregated (a repeat's count "
           "patched), dropped (the queue was full), failed (the API server refused or did not answer).",
           ("result",), zero=(("posted",), ("aggregated",), ("dropped",), ("failed",))),
    Series("thaw_kube_pod_reads_total", COUNTER, "Pod specs read for readiness at a sandbox's create, by result: "
           "ok, failed, skipped (the API server did not answer a moment ago), unusable (another uid, or a probe "
           "thaw cannot express); all but ok fall back to the thaw.dev annotations.", ("result",),
           zero=(("ok",), ("failed",), ("skipped",), ("unusable",))),
    # The image path (control/images).
    Series("thaw_store_fetched_bytes_total", COUNTER, "Bytes received from the store by pulls and streams "
           "(as stored: compressed, sealed).", zero=((),)),
    Series("thaw_store_retries_total", COUNTER, "Store requests of pulls and streams retried under the retry "
           "policy.", zero=((),)),
    Series("thaw_store_errors_total", COUNTER, "Store requests that failed for good, by operation.", ("op",),
           zero=(("get",), ("put",), ("head",), ("list",))),
    Series("thaw_streams_total", COUNTER, "Streamed restores, by how the stream ended once the container "
           "ran (installed in the cache, or failed).", ("result",), zero=(("installed",), ("failed",))),
    Series("thaw_streams_in_flight", GAUGE, "Images streaming into the node cache now."),
    Series("thaw_cache_full_total", COUNTER, "Fills refused for want of cache budget (CacheFull).", zero=((),)),
    Series("thaw_cache_used_bytes", GAUGE, "Bytes of the node cache's entries (read at each scrape)."),
    Series("thaw_cache_budget_bytes", GAUGE, "The node cache's budget (cache.budget_bytes)."),
    Series("thaw_cache_entries", GAUGE, "Node cache entries, by state.", ("state",)),
    Series("thaw_cache_leases", GAUGE, "Live leases on node cache entries (containers, parked sandboxes, "
           "pulls in progress)."),
    Series("thaw_build_info", GAUGE, "Always 1: the thaw version and the runsc version label it runs with.",
           ("version", "runsc")),
)
HELP = {s.name: s.help for s in SERIES}
_BY_NAME = {s.name: s for s in SERIES}
# Names callers used before this table; kept so they need not change (one release).
ALIASES = {"thaw_parked": "thaw_parked_sandboxes", "thaw_bytes_fetched_total": "thaw_store_fetched_bytes_total"}


def series(name: str) -> Series:
    """The declared series of `name` (or of its old alias); KeyError for an undeclared one:
    a typo in a call site fails its unit test instead of exporting nothing."""
    return _BY_NAME[ALIASES.get(name, name)]


class Metrics:
    """Every SERIES in one prometheus-client registry of its own."""

    def __init__(self) -> None:
        import prometheus_client as pc   # here, not at import: CLI commands never pay for it
        # No <name>_created series: they double the exposition and no rule here reads them.
        pc.disable_created_metrics()
        self.registry = pc.CollectorRegistry()
        self._collectors: list[Callable[["Metrics"], None]] = []
        metrics = self

        class Fresh:   # first in the registry: scrape-time gauges are read before they are written out
            def collect(self):
                metrics._refresh()
                return []
        self.registry.register(Fresh())
        self._m: dict[str, Any] = {}
        self._set_gauges: set[str] = set()
        kinds = {COUNTER: pc.Counter, GAUGE: pc.Gauge, HISTOGRAM: pc.Histogram}
        for s in SERIES:
            kw: dict = {"buckets": BUCKETS} if s.kind == HISTOGRAM else {}
            # prometheus-client adds _total itself (and wants the name without it).
            base = s.name[:-len("_total")] if s.kind == COUNTER else s.name
            m = kinds[s.kind](base, s.help, list(s.labels), registry=self.registry, **kw)
            for values in s.zero:
                (m.labels(*values) if values else m).inc(0)
            self._m[s.name] = m

    def _child(self, name: str, labels: dict[str, Any]):
        s = series(name)
        m = self._m[s.name]
        if not s.labels:
            if labels:
                raise ValueError(f"{s.name} has no labels, got {sorted(labels)}")
            return s, m
        unknown = set(labels) - set(s.labels)
        if unknown:
            raise ValueError(f"{s.name} has labels {s.labels}, got {sorted(unknown)}")
        return s, m.labels(*(str(labels.get(k, "")) for k in s.labels))

    def inc(self, name: str, value: float = 1.0, **labels: Any) -> None:
        _, c = self._child(name, labels)
        c.inc(value)

    def set(self, name: str, value: float, **labels: Any) -> None:
        """A gauge: the value now."""
        s, g = self._child(name, labels)
        g.set(float(value))
        self._set_gauges.add(s.name)

    def add(self, name: str, delta: float, **labels: Any) -> None:
        """A gauge moved by `delta` (streams in flight)."""
        s, g = self._child(name, labels)
        g.inc(delta)
        self._set_gauges.add(s.name)

    def observe(self, name: str, seconds: float, **labels: Any) -> None:
        _, h = self._child(name, labels)
        h.observe(seconds)

    def on_scrape(self, fn: Callable[["Metrics"], None]) -> None:
        """Run `fn(self)` before every render and counters() (gauges read from elsewhere: the cache)."""
        self._collectors.append(fn)

    def _refresh(self) -> None:
        for fn in self._collectors:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a gauge that cannot be read must not fail the scrape
                pass

    def counters(self) -> dict[str, float]:
        """What happened, by name with labels (`thaw stats`): counters above zero, and
        gauges once set. `name{label="v",...}`, labels sorted."""
        out: dict[str, float] = {}
        for fam in self.registry.collect():
            name = fam.name + "_total" if fam.type == COUNTER else fam.name
            if fam.type not in (COUNTER, GAUGE) or (fam.type == GAUGE and name not in self._set_gauges):
                continue
            for smp in fam.samples:
                if smp.name != name or (fam.type == COUNTER and not smp.value):
                    continue
                lab = ",".join(f'{k}="{v}"' for k, v in sorted(smp.labels.items()))
                out[name + ("{" + lab + "}" if lab else "")] = smp.value
        return dict(sorted(out.items()))

    def render(self) -> str:
        """The text exposition format, as prometheus-client writes it."""
        import prometheus_client as pc
        return pc.generate_latest(self.registry).decode()

    def install(self) -> "Metrics":
        """Make this the process's sink for the module functions below (thawd does, once)."""
        global _sink
        _sink = self
        return self


_sink: Metrics | None = None


def inc(name: str, value: float = 1.0, **labels: Any) -> None:
    """Count on the installed Metrics; nothing when none is (a CLI command). The name
    is checked even then, so a typo fails wherever the line runs."""
    series(name)
    if _sink is not None:
        _sink.inc(name, value, **labels)


def observe(name: str, seconds: float, **labels: Any) -> None:
    series(name)
    if _sink is not None:
        _sink.observe(name, seconds, **labels)


def set_gauge(name: str, value: float, **labels: Any) -> None:
    series(name)
    if _sink is not None:
        _sink.set(name, value, **labels)


def add(name: str, delta: float, **labels: Any) -> None:
    series(name)
    if _sink is not None:
        _sink.add(name, delta, **labels)


def cache_gauges(cache) -> Callable[[Metrics], None]:
    """A scrape-time reader of the node cache's gauges (Metrics.on_scrape): used and
    budget bytes, entries by state, live leases, from the cache's index."""
    def read(m: Metrics) -> None:
        entries = cache.entries()
        m.set("thaw_cache_used_bytes", sum(e.size for e in entries))
        m.set("thaw_cache_budget_bytes", cache.budget)
        for state in ("ready", "corrupt", "evicting"):
            m.set("thaw_cache_entries", sum(e.state == state for e in entries), state=state)
        m.set("thaw_cache_leases", sum(e.leases for e in entries))
    return read


def serve(metrics: Metrics, addr: str):
    """Serve GET /metrics on host:port in a daemon thread (prometheus-client's own
    handler and exposition); the server (`.shutdown()` stops it)."""
    import prometheus_client as pc
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")   # "[::]:9464": every IPv6 address (the chart binds "0.0.0.0:9464": the pod's own)

    srv, thread = pc.start_http_server(int(port), addr=host or "127.0.0.1", registry=metrics.registry)
    return Endpoint(srv, thread)


class Endpoint:
    """The running /metrics server: its port, and shutdown() that also closes its socket."""

    def __init__(self, srv, thread) -> None:
        self._srv, self._thread = srv, thread
        self.server_port = srv.server_port

    def shutdown(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(timeout=5)
