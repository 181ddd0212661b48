"""Transparent restore under containerd: real containerd + gVisor's shim +
thaw's stand-in + runsc + thawd + SeaweedFS. Containers are started with
plain `ctr run`; nothing in how they start knows about thaw."""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from control.dev.testbed import ANNOTATIONS, IMAGE, Stack

from tests.conftest import BUILD, require


@pytest.fixture
def cs(name, runsc_bin):
    require((BUILD / "thaw-runsc").is_file(), "the stand-in built at build/thaw-runsc")
    require((BUILD / "busybox").is_file(), "build/busybox (make setup)")
    base = Path(f"/tmp/thaw-it/{name}")
    s = Stack(base, name)
    try:
        yield s.start()
    finally:
        s.stop()
        subprocess.run(["rm", "-rf", str(base)])


def test_cold_then_published_then_restored(cs):
    cs.ctrd.run(IMAGE, "first", ANNOTATIONS)
    boot1, _ = cs.state("first")
    entry = cs.wait_published()
    assert entry["key"].startswith("ctr-thaw.counter.")   # the containerd namespace is the tenant
    # runsc wrote the image into the cache and the entry is that directory: no staging
    # directory, no partial left, and nothing beside the entry in entries/.
    assert not (cs.base / "state" / "thawd" / "staging").exists()
    assert list((cs.base / "cache" / "tmp").iterdir()) == []
    [cached] = list((cs.base / "cache" / "entries").iterdir())
    assert cached.name.startswith(entry["key"] + "@")
    saved_boot, saved_i = cs.state("first")
    assert saved_boot == boot1  # --leave-running: the cold container keeps serving
    cs.ctrd.remove("first")

    cs.ctrd.run(IMAGE, "second", ANNOTATIONS)
    boot2, i2 = cs.state("second")
    assert boot2 == boot1, "the second container must come up restored, with the first one's memory"
    assert i2 > 1
    d = [x for x in cs.decisions() if x["id"] == "second"]
    assert [x["decision"] for x in d] == ["restore", "restored"], d
    counters = cs.stats()["counters"]
    assert counters.get("thaw_restores_total") == 1 and counters.get("thaw_cold_starts_total") == 1
    cs.ctrd.remove("second")
    assert cs.stats()["entries"][0]["leases"] == 0  # delete released the lease


def test_thawd_down_means_cold_start(cs):
    cs.ctrd.run(IMAGE, "warm", ANNOTATIONS)
    boot1, _ = cs.state("warm")
    cs.wait_published()
    cs.ctrd.remove("warm")
    cs.stop_thawd()
    cs.ctrd.run(IMAGE, "cold", ANNOTATIONS)
    boot2, _ = cs.state("cold")
    assert boot2 != boot1
    d = [x for x in cs.decisions() if x["id"] == "cold"]
    assert d[0]["decision"] == "cold" and "thawd-unavailable" in d[0]["reason"]
    cs.ctrd.remove("cold")


def test_not_opted_in_is_plain_runsc(cs):
    cs.ctrd.run(IMAGE, "plain")
    cs.state("plain")
    assert [x for x in cs.decisions() if x["id"] == "plain"] == []
    cs.ctrd.remove("plain")


# The counter, after a line on stdout (exit 3 if it cannot be written) and with a
# writer that counts into /tmp/wrote while its stdout takes writes and removes it when one fails.
WRITES_STDOUT = ["sh", "-c", "echo start || exit 3; "
                 "(n=0; while sleep 0.2; do n=$((n+1)); if echo tick; then echo $n > /tmp/wrote; else rm -f /tmp/wrote; fi; done) & "
                 "exec /app/run.sh"]


def wrote(cs, cid: str) -> str:
    return cs.ctrd.exec(cid, "cat", "/tmp/wrote", check=False).stdout.strip()


def test_a_workload_without_io_can_write_its_stdout_cold_and_restored(cs):
    # `ctr run --null-io` hands the sandbox a read-only /dev/null as stdout and stderr
    # (go-runc NewNullIO); under plain runsc every write fails with EBADF. The stand-in
    # makes them writable, as runc's init does (docs/gvisor-notes.md).
    cs.ctrd.run(IMAGE, "first", ANNOTATIONS, args=WRITES_STDOUT)
    cs.state("first")
    cs.wait_published()
    w1 = wrote(cs, "first")
    assert w1, "the cold container's writes to its stdout failed"
    cs.ctrd.remove("first")
    cs.ctrd.run(IMAGE, "second", ANNOTATIONS, args=WRITES_STDOUT)
    cs.state("second")
    assert [x["decision"] for x in cs.decisions() if x["id"] == "second"] == ["restore", "restored"]
    # The restored writer counts on from where the checkpoint caught it: two reads a
    # second apart show it still writing.
    time.sleep(0.5)
    w2 = wrote(cs, "second")
    time.sleep(1)
    w3 = wrote(cs, "second")
    assert w2 and w3 and int(w3) > int(w2), f"the restored process's writes to its stdout failed: {w2!r} then {w3!r}"
    cs.ctrd.remove("second")


def test_corrupt_cached_image_is_refetched(cs):
    cs.ctrd.run(IMAGE, "src", ANNOTATIONS)
    boot1, _ = cs.state("src")
    cs.wait_published()
    cs.ctrd.remove("src")
    entry_dir = next((cs.base / "cache" / "entries").iterdir())
    pages = entry_dir / "pages.img"
    with open(pages, "r+b") as f:
        f.seek(pages.stat().st_size // 2)
        f.write(b"\xff" * 4096)
    cs.ctrd.run(IMAGE, "again", ANNOTATIONS)
    boot2, _ = cs.state("again")
    assert boot2 == boot1, "a corrupt cache entry is refetched from the store, then restored"
    assert cs.stats()["counters"].get("thaw_cache_misses_total", 0) >= 1
    cs.ctrd.remove("again")


def test_two_at_once_restore_with_one_download(cs):
    cs.ctrd.run(IMAGE, "seed", ANNOTATIONS)
    boot1, _ = cs.state("seed")
    cs.wait_published()
    cs.ctrd.remove("seed")
    assert cs.thaw("evict", next(e["key"] for e in cs.stats()["entries"])).returncode == 0
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda c: cs.ctrd.run(IMAGE, c, ANNOTATIONS), ["a", "b"]))
    assert cs.state("a")[0] == boot1 and cs.state("b")[0] == boot1
    c = cs.stats()["counters"]
    assert c.get("thaw_restores_total") == 2
    assert c.get("thaw_cache_misses_total", 0) == 1, c  # one fetch served both
    for cid in ("a", "b"):
        cs.ctrd.remove(cid)


def test_pass_through_matches_runsc(cs):
    cs.ctrd.run(IMAGE, "pt", ANNOTATIONS)
    cs.state("pt")
    root = str(cs.ctrd.runsc_root / "thaw")

    def both(*args):
        a = subprocess.run([str(BUILD / "thaw-runsc"), f"--root={root}", *args], capture_output=True, text=True,
                           env={"THAW_REAL_RUNSC": str(BUILD / "runsc"), "PATH": "/usr/bin:/bin"})
        b = subprocess.run([str(BUILD / "runsc"), f"--root={root}", *args], capture_output=True, text=True)
        return a, b

    for args in (["state", "pt"], ["list", "--format=json"]):
        a, b = both(*args)
        assert (a.returncode, a.stdout) == (b.returncode, b.stdout), args
    # The workload forks a `sleep` every 100 ms, so the process list differs between two calls
    # (CI saw [1,7] vs [1,10]); what must match is the exit status, the format and the init process.
    a, b = both("ps", "--format=json", "pt")
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    assert 1 in json.loads(a.stdout) and 1 in json.loads(b.stdout), (a.stdout, b.stdout)
    cs.ctrd.remove("pt")


def test_failed_restores_fall_back_cold_and_quarantine(name, runsc_bin):
    base = Path(f"/tmp/thaw-it/{name}")
    s = Stack(base, name, extra_env={"THAW_THAWD_QUARANTINE_AFTER": "1", "THAW_THAWD_HEALTH_TIMEOUT_S": "3"})
    try:
        s.start()
        s.ctrd.run(IMAGE, "seed", ANNOTATIONS)
        boot1, _ = s.state("seed")
        key = s.wait_published()["key"]
        s.ctrd.remove("seed")
        # A restore that only fails after runsc restored it: its health probe never passes.
        # (Damaging the cached image no longer fails a restore: issue 30 refetches or
        # refuses it, test_a_rotted_cache_entry_starts_cold_as_corrupt_and_is_fetched_again.)
        s.ctrd.run(IMAGE, "victim", {**ANNOTATIONS, "thaw.dev/health": f"file:/tmp/never-{name}"})
        boot2, _ = s.state("victim")
        assert boot2 != boot1, "the failed restore must end in a working cold container"
        d = [x["decision"] for x in s.decisions() if x["id"] == "victim"]
        assert d == ["restore", "restore-failed", "started-cold-after-failed-restore"], d
        # thawd answers "did victim restore or start cold, and why" (issue 33), and its log
        # lines carry the facts as fields.
        why = s.thaw("stats", "--decisions", "10", "--container", "victim", "--json")
        assert why.returncode == 0, why.stderr
        mine = json.loads(why.stdout)["decisions"]
        assert [r["decision"] for r in mine][:2] == ["restore", "restore-failed"], mine
        assert mine[1]["reason"] and mine[0]["key"] == key and mine[0]["tenant"] == key.split(".")[0]
        lines = [json.loads(x) for x in (base / "thawd.log").read_text().splitlines() if x.startswith("{")]
        failed = [x for x in lines if x.get("container") == "victim" and x.get("decision") == "RESTORE_FAILED"]
        assert failed and failed[0]["key"] == key and failed[0]["reason"], lines[-5:]
        entry = next(e for e in s.stats()["entries"] if e["key"] == key)
        assert entry["state"] == "quarantined" and "restores in a row failed" in entry["reason"]
        ls = s.thaw("ls", "--local", "--json")
        assert ls.returncode == 0, ls.stderr
        row = next(e for e in json.loads(ls.stdout)["local"] if e["key"] == key)
        assert "restores in a row failed" in row["quarantined"]
        s.ctrd.remove("victim")

        s.ctrd.run(IMAGE, "after", ANNOTATIONS)
        s.state("after")
        d = [x for x in s.decisions() if x["id"] == "after"]
        assert d[0]["decision"] == "cold" and d[0]["reason"].startswith("quarantined"), d
        s.ctrd.remove("after")
    finally:
        s.stop()
        subprocess.run(["rm", "-rf", str(base)])


def _rot(cache: Path, path: Path) -> None:
    """Flip bytes of a cached file and re-record its inode data in the cache index: a change
    no stat() sees (bit rot, a write below the file system), that only hashing finds."""
    import sqlite3
    with open(path, "r+b") as f:
        f.seek(min(4096, path.stat().st_size // 3))
        f.write(b"\xa5" * 8)
    db = sqlite3.connect(cache / "index.sqlite")
    try:
        eid = path.parent.name
        snap = json.loads(db.execute("SELECT snapshot FROM entries WHERE id = ?", (eid,)).fetchone()[0])
        st = path.stat()
        snap[path.name] = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_nlink]
        db.execute("UPDATE entries SET snapshot = ? WHERE id = ?", (json.dumps(snap), eid))
        db.commit()
    finally:
        db.close()


def test_a_rotted_cache_entry_starts_cold_as_corrupt_and_is_fetched_again(name, runsc_bin):
    """Issue 30 under containerd: thawd restores a cache entry through thaw-gofer, every chunk
    checked as runsc reads it. Bytes of checkpoint.img altered with no trace in stat(): the
    restore fails, the container starts cold with reason `corrupt: ...` (which does not count
    towards quarantine: the entry is marked corrupt and fetched again), and the next start
    restores the seed's memory from a fresh copy."""
    require((BUILD / "thaw-gofer").is_file(), "thaw-gofer built at build/thaw-gofer")
    base = Path(f"/tmp/thaw-it/{name}")
    s = Stack(base, name, extra_env={"THAW_THAWD_QUARANTINE_AFTER": "1",
                                     "THAW_STORE_GOFER": str(BUILD / "thaw-gofer")})
    try:
        s.start()
        s.ctrd.run(IMAGE, "seed", ANNOTATIONS)
        boot1, _ = s.state("seed")
        key = s.wait_published()["key"]
        s.ctrd.remove("seed")
        cached = next((base / "cache" / "entries").iterdir())
        _rot(base / "cache", cached / "checkpoint.img")

        s.ctrd.run(IMAGE, "victim", ANNOTATIONS)
        boot2, _ = s.state("victim")
        assert boot2 != boot1, "an altered image must never be restored"
        d = [x for x in s.decisions() if x["id"] == "victim"]
        assert [x["decision"] for x in d] == ["restore", "restore-failed", "started-cold-after-failed-restore"], d
        failed = next(x for x in d if x["decision"] == "restore-failed")
        assert failed["reason"].startswith("corrupt: ") and "checkpoint.img" in failed["reason"], failed
        assert len(failed["reason"]) < 1000 and "goroutine" not in failed["reason"], failed
        assert not any(e["key"] == key and e["state"] in ("ready", "quarantined") for e in s.stats()["entries"])
        s.ctrd.remove("victim")

        s.ctrd.run(IMAGE, "after", ANNOTATIONS)
        boot3, _ = s.state("after")
        assert boot3 == boot1, "the next start fetches the image again and restores the seed's memory"
        assert [x["decision"] for x in s.decisions() if x["id"] == "after"] == ["restore", "restored"]
        s.ctrd.remove("after")
    finally:
        s.stop()
        subprocess.run(["rm", "-rf", str(base)])


def test_a_miss_streams_through_thaw_gofer_while_the_container_restores(name, runsc_bin):
    """store.stream under containerd (issue 18): thawd answers a cache miss with a
    stream, runsc restores through thaw-gofer while the store (throttled by
    thaw-s3proxy) still sends the image, and the cache ends with one ready entry."""
    from tests.integration import streamed
    from tests.integration.faults.s3proxy import S3Proxy
    for b in ("thaw-runsc", "busybox", "thaw-gofer", "thaw-s3proxy"):
        require((BUILD / b).is_file(), f"build/{b} (make setup)")
    base = Path(f"/tmp/thaw-it/{name}")
    subprocess.run(["rm", "-rf", str(base)])
    s = Stack(base, name, extra_env={"THAW_STORE_STREAM": "1", "THAW_STORE_GOFER": str(BUILD / "thaw-gofer"),
                                     "THAW_STORE_STREAM_DEADLINE_S": "60"})
    proxy = None
    try:
        s.start()
        s.ctrd.run(IMAGE, "seed", ANNOTATIONS)
        boot1, _ = s.state("seed")
        entry = s.wait_published()
        key = entry["key"]
        s.ctrd.remove("seed")
        assert s.thaw("evict", key).returncode == 0
        assert streamed.cache_state(base / "cache", key)["ready"] == []
        # thawd now reads the store through a throttle, so the image is still arriving
        # when runsc restores from it: ~6 s for the whole image.
        proxy = S3Proxy(BUILD / "thaw-s3proxy", s.weed.endpoint, base / "s3proxy.log").start()
        s.stop_thawd()
        s.extra_env["THAW_STORE_ENDPOINT"] = proxy.endpoint
        s.start_thawd()
        proxy.add(kind="throttle", rate_bps=max(1 << 20, entry["bytes"] // 6))

        s.ctrd.run(IMAGE, "streamed", ANNOTATIONS)
        boot2, i2 = s.state("streamed")
        assert boot2 == boot1, "the streamed container must come up restored, with the seed's memory"
        d = [x["decision"] for x in s.decisions() if x["id"] == "streamed"]
        assert d == ["restore", "restored"], d
        streamed.wait_for(lambda: s.stats()["counters"].get('thaw_streams_total{result="installed"}') == 1,
                          120, "the stream installing its entry (thawd log: "
                          f"{(base / 'thawd.log').read_text()[-3000:]})", step=0.5)
        c = s.stats()["counters"]
        assert c.get("thaw_restores_total") == 1 and c.get("thaw_cache_misses_total") == 1, c
        assert 'thaw_streams_total{result="failed"}' not in c, c
        # runsc read through thaw-gofer, and some reads waited for bytes still in flight.
        log = streamed.gofer_logs(base)
        assert " done: " in log and " 0 failed" in log, log[-3000:]
        assert " 0 waited " not in log, log[-3000:]
        assert s.state("streamed")[1] > i2, "the restored container keeps running after its image is all in"
        state = streamed.cache_state(base / "cache", key)
        assert len(state["ready"]) == 1 and state["partials"] == [], state
        # runsc restored from the stream's directory of hard links: it lives as long as
        # the container's lease, and goes with it.
        assert len(state["streams"]) == 1, state
        [ready] = [e for e in s.stats()["entries"] if e["key"] == key and e["state"] == "ready"]
        assert ready["leases"] == 1, ready   # the running container's
        s.ctrd.remove("streamed")
        assert next(e for e in s.stats()["entries"] if e["key"] == key)["leases"] == 0
        state = streamed.cache_state(base / "cache", key)
        assert len(state["ready"]) == 1 and state["streams"] == [], state
    finally:
        if proxy is not None:
            proxy.stop()
        s.stop()
        subprocess.run(["rm", "-rf", str(base)])


def test_a_deeply_nested_manifest_is_a_cold_start_that_names_it(cs):
    """Issue 30: under thawd a manifest nested too deeply was a RecursionError that failed
    the RPC, so the stand-in said `thawd-unavailable`; the reason names the manifest."""
    from control.images.store import Store
    cs.ctrd.run(IMAGE, "seed", ANNOTATIONS)
    cs.state("seed")
    entry = cs.wait_published()
    cs.ctrd.remove("seed")
    store = Store(cs.settings()).for_tenant(entry["key"].split(".", 1)[0])
    name = store.manifest_name(entry["key"], entry["tuple_hash"])
    store.client.put_object(Bucket=store.bucket, Key=name, Body=b"[" * 100_000 + b"]" * 100_000)
    assert cs.thaw("evict", entry["key"]).returncode == 0
    cs.ctrd.run(IMAGE, "after", ANNOTATIONS)
    cs.state("after")
    d = [x for x in cs.decisions() if x["id"] == "after"]
    assert d[0]["decision"] == "cold", d
    reason = d[0]["reason"]
    assert reason.startswith("manifest-invalid: ") and name in reason and "nested too deeply" in reason, reason
    assert "thawd-unavailable" not in reason and len(reason) < 1000
    cs.ctrd.remove("after")
