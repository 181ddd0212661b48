"""What an operator reads (issue 33 items 3-4): log lines whose facts are fields and
the -v levels, the decisions ring, `thaw ls` rows, who holds a cache lease."""
from __future__ import annotations

import io
import json
import logging
import os
import sqlite3

import pytest

from control import logfields
from control.images import gc
from control.images import image as images
from control.images.cache import Cache
from control.thawd.decisions import Decisions

from .fakes import TUPLE, FakeStore
from .test_cache import image, publish
from .test_gc import TimedStore


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = (root.handlers[:], root.level,
             {n: logging.getLogger(n).level for n in (*logfields.OWN_LOGGERS, "py.warnings")})
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for n, lv in saved[2].items():
        logging.getLogger(n).setLevel(lv)
    logging.captureWarnings(False)


def lines(buf: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in buf.getvalue().splitlines()]


def test_json_lines_carry_the_facts_as_fields(restore_logging):
    buf = io.StringIO()
    logfields.configure(0, json_lines=True, daemon=True, stream=buf)
    log = logging.getLogger("thawd")
    log.info("outcome %s RESTORED", "c1", extra=logfields.fields(container="c1", key="ctr-a.w.1", decision="restored",
                                                                 duration_s=0.42, reason=None))
    logfields.bound(log, container="c2", tenant="ctr-a").warning("cold", extra=logfields.fields(reason="no-image"))
    log.info("odd", extra=logfields.fields(msg="not the message", level=3))
    a, b, c = lines(buf)
    assert a["msg"] == "outcome c1 RESTORED" and a["level"] == "info" and a["logger"] == "thawd"
    assert (a["container"], a["key"], a["decision"], a["duration_s"]) == ("c1", "ctr-a.w.1", "restored", 0.42)
    assert "reason" not in a and a["time"].endswith("Z")
    assert (b["container"], b["tenant"], b["reason"], b["level"]) == ("c2", "ctr-a", "no-image", "warning")
    assert c["msg"] == "odd" and c["field_msg"] == "not the message" and c["field_level"] == 3


def test_text_lines_append_the_fields(restore_logging):
    buf = io.StringIO()
    logfields.configure(1, stream=buf)
    logging.getLogger("control.images.gc").info("gc", extra=logfields.fields(tenant="t", reason="two words"))
    assert buf.getvalue().rstrip().endswith('gc tenant=t reason="two words"')


@pytest.mark.parametrize("verbose, daemon, thaw_level, others", [
    (0, False, logging.WARNING, logging.WARNING),
    (1, False, logging.INFO, logging.INFO),
    (2, False, logging.DEBUG, logging.INFO),     # -vv: thaw's debug, not boto's wire
    (0, True, logging.INFO, logging.INFO),       # thaw serve says info by default
    (2, True, logging.DEBUG, logging.INFO),      # and thaw -vv serve debug
    (3, True, logging.DEBUG, logging.DEBUG),
])
def test_verbosity(restore_logging, verbose, daemon, thaw_level, others):
    logfields.configure(verbose, daemon=daemon, stream=io.StringIO())
    assert logging.getLogger("thawd").getEffectiveLevel() == thaw_level
    assert logging.getLogger("control.images.store").getEffectiveLevel() == thaw_level
    assert logging.getLogger("botocore").getEffectiveLevel() == others


@pytest.mark.parametrize("verbose, shown", [(0, False), (1, True)])
def test_a_librarys_warning_shows_only_with_v(restore_logging, verbose, shown):
    """CI of 2026-12-05: Debian's pyOpenSSL warned against cryptography 51 on stderr,
    a second line beside a command's one-line error."""
    import warnings
    buf = io.StringIO()
    logfields.configure(verbose, stream=buf)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("DSA is deprecated", UserWarning)
    assert ("DSA is deprecated" in buf.getvalue()) is shown


def test_thaw_serve_passes_its_verbosity_to_the_daemon(restore_logging, monkeypatch):
    from control.thawd import server as daemon
    seen = {}

    def stop(*a, **k):
        seen["level"] = logging.getLogger("thawd").getEffectiveLevel()
        raise SystemExit(0)
    monkeypatch.setattr(daemon, "build", stop)
    with pytest.raises(SystemExit):
        daemon.serve(None, None, "", verbose=2)
    assert seen["level"] == logging.DEBUG


def test_decisions_ring_keeps_the_last_and_remembers_each_containers_key(restore_logging):
    buf = io.StringIO()
    logfields.configure(0, json_lines=True, daemon=True, stream=buf)
    d = Decisions(kept=3)
    d.record("c1", "restore", key="ctr-a.web.0123456789abcdef", seconds=0.01)
    d.record("c2", "cold", "no-image", key="ctr-b.db.fedcba9876543210")
    d.record("c1", "restore-failed", "health check: connection refused", seconds=2.5)
    d.record("c3", "cold", "not-opted-in")
    assert [r.container for r in d.last(10)] == ["c2", "c1", "c3"]            # the oldest went
    c1 = d.last(10, "c1")
    assert [(r.decision, r.key, r.tenant, r.workload) for r in c1] == [
        ("restore-failed", "ctr-a.web.0123456789abcdef", "ctr-a", "ctr-a.web")]
    assert d.last(1)[0].container == "c3" and d.last(0) == []
    logged = lines(buf)
    assert logged[2]["decision"] == "restore-failed" and logged[2]["reason"].startswith("health check")
    assert logged[2]["duration_s"] == 2.5 and logged[2]["key"] == "ctr-a.web.0123456789abcdef"


def test_lease_holders_say_who_and_an_old_index_gains_the_column(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    db = sqlite3.connect(root / "index.sqlite")   # an index written before the holder column
    db.execute("CREATE TABLE leases (id INTEGER PRIMARY KEY AUTOINCREMENT, entry TEXT NOT NULL, "
               "pid INTEGER NOT NULL, pid_start TEXT NOT NULL, created REAL NOT NULL)")
    db.commit()
    db.close()
    cache = Cache(root, 1 << 30)
    store = FakeStore()
    publish(store, tmp_path, "ctr-t.w", image(6))
    first = images.pull(cache, store, "ctr-t.w", TUPLE, workers=2).lease
    first.describe("container c-1")
    second = cache.lease(first.entry.id, holder="parked sandbox p-1")
    who = cache.lease_holders(first.entry.id)
    assert len(who) == 2 and all(w.startswith(f"pid {os.getpid()} (") for w in who)
    assert who[0].endswith("): container c-1") and who[1].endswith("): parked sandbox p-1")
    assert not cache.evict(first.entry.id)
    first.release()
    second.release()
    assert cache.lease_holders(first.entry.id) == []


def test_ls_rows_have_size_age_last_use_tenant_compatibility_and_holders(tmp_path):
    shared = TimedStore()
    store = shared.for_tenant("ctr-t")
    from .test_gc import publish as gc_publish, files
    gc_publish(store, tmp_path, "ctr-t.w.0123456789abcdef", files(1))
    cache = Cache(tmp_path / "c", 1 << 30)
    lease = images.pull(cache, store, "ctr-t.w.0123456789abcdef", TUPLE, workers=2).lease
    lease.describe("container c-9")
    d = images.listing(cache, store, TUPLE)
    (loc,), (rem,) = d["local"], d["remote"]
    assert loc["tenant"] == rem["tenant"] == "ctr-t" and loc["match"] and rem["match"]
    assert loc["size"] > 0 and loc["age_s"] >= 0 and loc["last_used_s"] >= 0 and "age_s" in rem
    assert loc["held_by"] and loc["held_by"][0].endswith("container c-9")
    lease.release()
    assert images.listing(cache, store, TUPLE)["local"][0]["held_by"] == []
    assert gc.workload_of("ctr-t.w.0123456789abcdef") == "ctr-t.w"
