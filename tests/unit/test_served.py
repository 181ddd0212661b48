"""Integrity of cache entries at rest and on use (issue 30): the view a verified restore
reads (control/images/served.py), the scrub (control/images/scrub.py), `thaw pull`'s
freshness rule, and the cheap check's ctime. In-memory store, real files; thaw-gofer's
own checks are go/internal/stream's tests, the whole path tests/integration/test_cache_integrity.py."""
import json
import os
import stat
import time

import pytest

from control import config
from control.errors import IntegrityError
from control.images import served
from control.images.cache import CORRUPT_REPORT, MANIFEST_FILE, VIEWS_DIR, Cache
from control.images.scrub import Scrub

from .test_cache import image, publish, pull
from .fakes import FakeStore


@pytest.fixture
def store():
    return FakeStore()


def settings(tmp_path, **over):
    gofer = tmp_path / "thaw-gofer"
    gofer.write_text("#!/bin/sh\n")
    o = {"store.gofer": str(gofer), "node.state_dir": str(tmp_path / "state"), "runsc.path": str(tmp_path / "runsc")}
    o.update(over)
    return config.load(overrides=o, environ={})


def cached(tmp_path, store, key="k"):
    publish(store, tmp_path, key, image(3))
    cache = Cache(tmp_path / "c", 1 << 30)
    return cache, pull(cache, store, key).lease


def test_a_view_serves_the_entry_through_the_gofer_and_changes_nothing_of_it(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    e = lease.entry
    before = {p.name: p.stat() for p in e.path.iterdir()}
    src = served.for_restore(cache, settings(tmp_path), lease)
    assert isinstance(src, served.Served) and src.path.parent == cache.root / VIEWS_DIR
    cfg = json.loads((src.path / "gcs_opts.json").read_text())
    assert cfg["verify"] == str(e.path / MANIFEST_FILE) and cfg["socket"] == "" and cfg["version"] == 2
    assert [f["name"] for f in cfg["files"]] == ["checkpoint.img", "pages.img", "pages_meta.img"]
    assert all(f["path"].startswith(str(e.path) + "/") for f in cfg["files"])
    assert (src.path / "pages.img").is_symlink() and (src.path / "pages.img").read_bytes() == \
        (e.path / "pages.img").read_bytes()
    assert stat.S_IMODE(src.path.stat().st_mode) == 0o700
    assert "GVISOR_SIDECAR_BINARIES_DIR" in src.env()
    assert src.verdict() is None
    src.release()
    assert not src.path.exists() and cache.check_entry(cache.entries()[0]) is None
    # Symbolic links, not hard links: the entry's inode data (ctime, link count) stays as installed.
    after = {p.name: p.stat() for p in e.path.iterdir()}
    assert {n: (s.st_ctime_ns, s.st_nlink) for n, s in before.items()} == \
        {n: (s.st_ctime_ns, s.st_nlink) for n, s in after.items()}


def test_a_gofer_report_marks_the_entry_corrupt_and_it_goes_once_released(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    src = served.for_restore(cache, settings(tmp_path), lease)
    (src.path / CORRUPT_REPORT).write_text(json.dumps({"file": "pages.img", "offset": 4096, "length": 8192,
                                                       "chunk": "ab" * 32, "got": "cd" * 32}))
    # Any use of the entry meanwhile sees the report too (a restore still holds the view).
    assert "pages.img at 4096" in cache.check_entry(cache.entries()[0])
    err = src.verdict()
    assert isinstance(err, IntegrityError) and err.where == "cache" and err.chunk == "ab" * 8
    assert "pages.img bytes 4096+8192" in err.message and "corrupt" in err.message
    from control.images.stream import failure_reason
    assert failure_reason(err).startswith("corrupt: ")
    assert [e.state for e in cache.entries()] == ["corrupt"]
    src.release()
    assert cache.entries() == []   # evicted: the next use fetches it again


def test_leftover_views_of_dead_restores_go_and_their_reports_count(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    eid = lease.entry.id
    dead = cache.root / VIEWS_DIR / f"{eid}.0000.999999999-1"
    dead.mkdir(parents=True)
    (dead / CORRUPT_REPORT).write_text("{}")
    live = served.serve(cache, settings(tmp_path), lease)
    assert not dead.exists() and live.path.exists()
    assert [e.state for e in cache.entries()] == ["corrupt"]
    live.release()


def test_without_the_gofer_a_full_check_comes_first(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    s = settings(tmp_path, **{"store.gofer": str(tmp_path / "absent")})
    assert served.for_restore(cache, s, lease) is lease
    lease.release()
    p = lease.path / "pages.img"
    data = bytearray(p.read_bytes())
    data[10] ^= 1
    p.write_bytes(bytes(data))
    lease2 = cache.lease(cache.entries()[0].id)
    with pytest.raises(IntegrityError, match="does not hash"):
        served.for_restore(cache, s, lease2)
    assert [e.state for e in cache.entries()] == ["corrupt"]


def test_stat_mode_hands_the_lease_over_as_before(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    assert served.for_restore(cache, settings(tmp_path, **{"cache.verify": "stat"}), lease) is lease


def test_the_cheap_check_sees_a_write_whose_mtime_was_put_back(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    lease.release()
    p = lease.path / "pages.img"
    st = p.stat()
    with open(p, "r+b") as f:
        f.write(b"\0" * 8)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "ctime changed" in cache.check_entry(cache.entries()[0])


def test_the_cheap_check_sees_a_file_replaced(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    lease.release()
    p = lease.path / "pages.img"
    st = p.stat()
    tmp = p.with_name("x")
    tmp.write_bytes(p.read_bytes())
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, p)
    assert "replaced" in cache.check_entry(cache.entries()[0])


def test_a_link_count_change_is_no_false_alarm(tmp_path, store):
    """A streamed restore's directory links the entry's files and later removes the links:
    that moves ctime, and must not make the entry corrupt."""
    cache, lease = cached(tmp_path, store)
    lease.release()
    link = tmp_path / "link"
    os.link(lease.path / "pages.img", link)   # there at install (the stream links before it installs)
    cache.mark_verified(lease.entry.id)       # re-records the snapshot, as at install
    link.unlink()                             # the stream's directory goes with its lease
    assert cache.check_entry(cache.entries()[0]) is None


def test_files_and_directories_of_an_entry_are_owner_only(tmp_path, store):
    old = os.umask(0o022)
    try:
        cache, lease = cached(tmp_path, store)
    finally:
        os.umask(old)
    for p in [lease.path, *lease.path.iterdir()]:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))


def test_pull_rehashes_an_entry_not_checked_within_the_interval(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    lease.release()
    from tests.unit.test_cache import _as_if_below_the_file_system
    p = lease.path / "pages.img"
    data = bytearray(p.read_bytes())
    data[100] ^= 1
    p.write_bytes(bytes(data))
    _as_if_below_the_file_system(cache, lease.entry.id, p)
    r = pull(cache, store, "k", fresh_s=3600)          # checked at install, a moment ago: trusted
    assert r.hit
    r.lease.release()
    r = pull(cache, store, "k", fresh_s=1e-6)          # older than that: hashed, found, fetched again
    assert not r.hit and r.fill.fetched_chunks == 1 and any("corrupt" in n for n in r.notes)
    r.lease.release()
    r = pull(cache, store, "k", fresh_s=1e-6)          # intact: re-hashed, and recorded
    assert r.hit and any("re-hashed" in n for n in r.notes)
    assert cache.entries()[0].verified > time.time() - 5
    r.lease.release()


def test_the_scrub_marks_an_altered_idle_entry_and_keeps_its_rate(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    lease.release()
    _, other = cached(tmp_path, store, key="k2")
    other.release()
    from tests.unit.test_cache import _as_if_below_the_file_system
    p = lease.path / "pages.img"
    data = bytearray(p.read_bytes())
    data[100] ^= 1
    p.write_bytes(bytes(data))
    _as_if_below_the_file_system(cache, lease.entry.id, p)
    now = [time.time() + 7200]
    rate = 256 << 10
    sc = Scrub(cache, 3600, rate, clock=lambda: now[0])
    held = cache.lease(other.entry.id)            # in use: not idle, not scrubbed now
    assert [e.id for e in sc.due()] == [lease.entry.id]
    assert sc.step() == 0.0
    assert sc.found == [lease.entry.id] and [e.key for e in cache.entries()] == ["k2"]
    held.release()
    assert [e.id for e in sc.due()] == [other.entry.id]
    t0 = time.monotonic()
    sc.step()
    took = time.monotonic() - t0
    assert sc.found == [lease.entry.id] and cache.entries()[0].verified > time.time() - 5
    # Never ahead of the rate bound (less the 50 ms it may run ahead).
    assert took >= other.entry.size / rate - 0.06, (took, other.entry.size)
    now[0] = time.time()
    assert sc.due() == [] and sc.step() > 0


def test_scrub_is_off_at_interval_zero(tmp_path, store):
    cache, _ = cached(tmp_path, store)
    sc = Scrub(cache, 0, 1 << 20).start()
    assert sc._thread is None


def test_a_directory_with_a_manifest_is_served_checked_and_marks_its_entry(tmp_path, store):
    cache, lease = cached(tmp_path, store)
    lease.release()
    s = settings(tmp_path)
    assert served.for_directory(s, tmp_path) is None                  # no manifest: nothing names its chunks
    assert served.for_directory(settings(tmp_path, **{"cache.verify": "stat"}), lease.path) is None
    v = served.for_directory(s, lease.path, cache)
    cfg = json.loads((v.path / "gcs_opts.json").read_text())
    assert cfg["verify"] == str(lease.path.resolve() / MANIFEST_FILE) and v.verdict() is None
    (v.path / CORRUPT_REPORT).write_text(json.dumps({"file": "pages.img", "offset": 0, "length": 4096,
                                                     "chunk": "ab" * 32, "got": "cd" * 32}))
    err = v.verdict()
    assert err.where == "image" and "marked corrupt" in err.message and str(lease.path) in err.message
    assert [e.state for e in cache.entries()] == ["corrupt"]
    v.release()
    assert not v.path.exists()


def test_every_restorable_answers_the_protocol_the_cli_uses(tmp_path, store):
    """The CLI (control/cli/sandbox.py restore_from_store) sees only Restorable
    (control/images/source.py): each kind names its entry as `source`, says whether its
    `verdict()` can tell why reads failed (`checked`), and answers `wait()` and `to_dict()`."""
    from typing import get_type_hints

    from control.images.source import Restorable
    from control.images.stream import Stream
    members = {n for n in vars(Restorable) if not n.startswith("_")} | set(get_type_hints(Restorable))
    assert {"path", "source", "hit", "streamed", "checked", "env", "verdict", "wait", "to_dict", "describe",
            "release"} <= members
    cache, lease = cached(tmp_path, store)
    view = served.for_restore(cache, settings(tmp_path), cache.lease(lease.entry.id))
    directory = served.for_directory(settings(tmp_path), lease.path, cache)
    stream = Stream("k", tmp_path / "streaming", tmp_path / "sidecars")
    kinds = {"lease": lease, "served": view, "directory": directory, "stream": stream}
    for name, src in kinds.items():
        missing = [m for m in members if not hasattr(src, m)]
        assert not missing, f"{name} lacks {missing}"
    assert [(k, src.checked) for k, src in kinds.items()] == [
        ("lease", False), ("served", True), ("directory", True), ("stream", True)]
    assert lease.source == lease.path and view.source == lease.entry.path != view.path
    assert directory.source == lease.path and stream.source == stream.path
    assert lease.wait() and view.wait() and directory.wait() and not stream.wait(0)
    assert lease.to_dict()["verified_reads"] is False and view.to_dict()["verified_reads"] is True
    view.release()
    directory.release()
