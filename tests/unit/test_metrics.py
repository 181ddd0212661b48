"""control/metrics.py: one table of series on prometheus-client, their names, the
zeros rates need, the image path's series reaching thawd's registry, /metrics."""
from __future__ import annotations

import re
import subprocess
import threading
import urllib.request

import pytest

from control import metrics as mod
from control.images import image as images
from control.images.cache import Cache
from control.images.retry import RetryPolicy
from control.thawd.metrics import Metrics, serve
from tests.conftest import REPO

from .fakes import TUPLE, FakeStore
from .test_cache import image, publish


@pytest.fixture(autouse=True)
def no_sink():
    saved = mod._sink
    mod._sink = None
    yield
    mod._sink = saved


def test_every_series_is_declared_once_with_help_and_a_conventional_name():
    names = [s.name for s in mod.SERIES]
    assert len(names) == len(set(names))
    for s in mod.SERIES:
        assert re.fullmatch(r"thaw_[a-z0-9_]+", s.name) and s.help.endswith(".") and len(s.help) > 15, s
        if s.kind == mod.COUNTER:
            assert s.name.endswith("_total"), s.name
        elif s.kind == mod.HISTOGRAM:
            assert s.name.endswith("_seconds"), s.name
        else:
            assert not s.name.endswith(("_total", "_seconds")), s.name
        for values in s.zero:
            assert len(values) == len(s.labels), s.name
    text = Metrics().render()
    for s in mod.SERIES:
        assert f"# HELP {s.name} {s.help}" in text
        assert f"# TYPE {s.name} {s.kind}" in text
    assert "_created" not in text


def test_counters_a_rate_is_taken_of_start_at_zero():
    text = Metrics().render()
    assert 'thaw_fallbacks_total{reason="restore-failed"} 0.0' in text
    assert "thaw_store_fetched_bytes_total 0.0" in text
    assert 'thaw_store_errors_total{op="get"} 0.0' in text
    assert "thaw_quarantined_total 0.0" in text


def cold_reasons_in_the_source() -> set[str]:
    """Every reason thawd can answer a create cold with, as the metric's label (the text
    before the first ':'), read from the code that makes them."""
    import inspect

    from control.thawd import pods, prepare
    out: set[str] = set()
    for path in (REPO / "control").rglob("*.py"):
        out |= set(re.findall(r'IdentityError\(\s*"([a-z-]+)"', path.read_text()))
    lead = r'f?"((?:\{[A-Z_]+\}|[a-z-])+)[:"]'
    for path in (REPO / "control" / "thawd").glob("*.py"):
        text = path.read_text()
        for found in re.findall(r'(?:Decision\(False,\s*|_cold\(rt, [\w.]+, |p\.reason = \(?)' + lead, text):
            out.add(re.sub(r"\{([A-Z_]+)\}", lambda m: getattr(pods, m.group(1)), found))
    out |= set(re.findall(r'return "([a-z-]+)"', inspect.getsource(prepare.fetch_reason)))
    return out


def test_every_cold_reason_thawd_emits_starts_at_zero():
    found = cold_reasons_in_the_source()
    # The scan finds each kind of site (so that it cannot pass by finding nothing).
    assert {"not-opted-in", "spec", "no-image", "spec-mismatch", "manifest-invalid", "tenant-refused",
            "no-image-digest", "pod-failed", "pod-failed-before", "init-satisfied", "pod-running"} <= found
    zeroed = {v[0] for v in mod.series("thaw_cold_decisions_total").zero}
    assert found - zeroed == set()
    text = Metrics().render()
    for r in found:
        assert f'thaw_cold_decisions_total{{reason="{r}"}} 0.0' in text


def test_every_name_a_call_site_uses_is_declared():
    """A call site naming an undeclared series would raise at run time: find them all now."""
    out = subprocess.run(["git", "grep", "-ohE", r"""metrics\.(inc|observe|set|add|set_gauge)\(\s*["'][a-z_]+["']"""],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    used = set(re.findall(r"""["'](thaw_[a-z_]+)["']""", out))
    assert {"thaw_restores_total", "thaw_parked", "thaw_store_fetched_bytes_total"} <= used
    for name in used:
        mod.series(name)


def test_labels_are_checked_and_a_missing_one_is_empty():
    m = Metrics()
    with pytest.raises(ValueError, match="has no labels"):
        m.inc("thaw_restores_total", reason="x")
    with pytest.raises(ValueError, match="has labels"):
        m.inc("thaw_fallbacks_total", why="x")
    with pytest.raises(KeyError):
        m.inc("thaw_no_such_total")
    m.observe("thaw_restore_seconds", 0.2)                      # a call site that does not say the workload
    m.observe("thaw_restore_seconds", 0.3, workload="ctr-a.web")
    text = m.render()
    assert 'thaw_restore_seconds_count{workload=""} 1.0' in text
    assert 'thaw_restore_seconds_bucket{le="0.5",workload="ctr-a.web"} 1.0' in text


def test_counters_say_what_happened_and_old_names_still_work():
    m = Metrics()
    assert m.counters() == {}
    m.inc("thaw_cold_decisions_total", reason="no-image")
    m.inc("thaw_cold_decisions_total", reason="no-image")
    m.set("thaw_parked", 2)                                     # the old gauge name (parking.py)
    m.inc("thaw_bytes_fetched_total", 10)
    assert m.counters() == {'thaw_cold_decisions_total{reason="no-image"}': 2.0, "thaw_parked_sandboxes": 2.0,
                            "thaw_store_fetched_bytes_total": 10.0}


def test_the_image_path_counts_into_the_installed_registry_only(tmp_path):
    mod.inc("thaw_store_retries_total", 3)                      # no sink: nothing, no error
    with pytest.raises(KeyError):
        mod.inc("thaw_store_retrys_total")                      # a typo fails even without one
    m = Metrics().install()
    store = FakeStore()
    publish(store, tmp_path, "k", image(3))
    r = images.pull(Cache(tmp_path / "c", 1 << 30), store, "k", TUPLE, workers=2)
    r.lease.release()
    assert m.counters()["thaw_store_fetched_bytes_total"] == r.fill.fetched_bytes > 0
    other = Metrics()
    assert "thaw_store_fetched_bytes_total" not in other.counters()


def values(m: Metrics) -> dict[str, float]:
    """Every sample of the exposition, zeros included (counters() leaves them out)."""
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in m.render().splitlines()
            if ln and not ln.startswith("#")}


def test_a_pull_whose_gets_were_retried_counts_its_retries(tmp_path):
    m = Metrics().install()
    store = FakeStore()
    store.policy = RetryPolicy(max_attempts=3, budget_s=10.0)
    publish(store, tmp_path, "k", image(5))
    assert values(m)["thaw_store_retries_total"] == 0
    store.objects.fail_next_gets = 2           # two 500s (transient): thaw-fetch retries them
    r = images.pull(Cache(tmp_path / "c", 1 << 30), store, "k", TUPLE, workers=2)
    r.lease.release()
    assert r.fill.retries == 2 and m.counters()["thaw_store_retries_total"] == 2


def test_a_stream_is_in_flight_until_it_ends_and_counts_the_gofers_retries(tmp_path, monkeypatch):
    """control/images/stream.py with thaw-gofer replaced at its seam (_Job._run_gofer): the
    gauge is 1 while the stream fills, 0 once it installed; its retries are counted."""
    from control import config
    from control.images import stream as streammod

    class Orderless(FakeStore):                # no learned fetch order in this store
        def get_order(self, key, th):
            return None

    m = Metrics().install()
    store = Orderless()
    files = image(6)
    publish(store, tmp_path, "k", files)
    gofer = tmp_path / "thaw-gofer"            # never run (the seam below): only required to exist
    gofer.write_text("#!/bin/sh\nexit 1\n")
    gofer.chmod(0o755)
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_NODE_LOG_DIR": str(tmp_path / "log"),
                             "THAW_STORE_GOFER": str(gofer), "THAW_RUNSC_PATH": str(tmp_path / "no-runsc")},
                    config_file=tmp_path / "empty.toml")
    go = threading.Event()

    def run_gofer(job, plan, names):           # thaw-gofer stream: listening, then every byte, then its stats
        job.result = job.stream
        job.ready.set()
        assert go.wait(30)
        for n in names:                        # the stream's files are hard links of the partial's
            with open(job.stream.path / n, "r+b") as f:
                f.write(files[n])
        return {"stats": {"retries": 3, "fetched_bytes": 10}}
    monkeypatch.setattr(streammod._Job, "_run_gofer", run_gofer)
    st = streammod.open_image(Cache(tmp_path / "c", 1 << 30), store, s, "k", TUPLE)
    try:
        assert isinstance(st, streammod.Stream) and not st.done
        assert values(m)["thaw_streams_in_flight"] == 1
        go.set()
        assert st.wait(30) and st.error is None and st.entry_id
        v = values(m)
        assert v["thaw_streams_in_flight"] == 0 and v["thaw_store_retries_total"] == 3
    finally:
        go.set()
        st.release()


def test_cache_gauges_are_read_at_each_scrape(tmp_path):
    m = Metrics()
    cache = Cache(tmp_path / "c", 1 << 30)
    m.on_scrape(mod.cache_gauges(cache))
    store = FakeStore()
    publish(store, tmp_path, "k", image(4))
    assert "thaw_cache_used_bytes 0.0" in m.render()
    lease = images.pull(cache, store, "k", TUPLE, workers=2).lease
    text = m.render()
    value = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if not ln.startswith("#")}
    assert value["thaw_cache_used_bytes"] == lease.entry.size
    assert value['thaw_cache_entries{state="ready"}'] == 1 and value["thaw_cache_leases"] == 1
    assert value["thaw_cache_budget_bytes"] == 1 << 30
    lease.release()
    assert "thaw_cache_leases 0.0" in m.render()


def test_the_endpoint_is_prometheus_clients_handler():
    m = Metrics()
    m.set("thaw_build_info", 1, version="9.9.9-test", runsc="thaw-gvisor-x")
    srv = serve(m, "127.0.0.1:0")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_port}/metrics", timeout=10) as r:
            body = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain")
        assert 'thaw_build_info{runsc="thaw-gvisor-x",version="9.9.9-test"} 1.0' in body
    finally:
        srv.shutdown()
