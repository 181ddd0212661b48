"""The store GC against real SeaweedFS and the real `thaw` CLI (issue 33 item 1):
`thaw rm` and two GC runs reclaim an image, and whatever runs beside a GC (a
publish that dedups against removed images, pulls, a GC SIGKILLed anywhere),
no manifest ever names a pack that is gone and every live image pulls whole.

Images are files of seeded random bytes named like a runsc image (the store
never looks inside), chunked by the real thaw-chunk at 16 KiB so a run has
hundreds of pointers to HEAD and delete. The grace is 3 s (store.gc_grace_s),
so an object is old after 4 s (the slack of S3's whole-second LastModified)."""
from __future__ import annotations

import dataclasses
import os
import random
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from control.errors import StoreError
from control.images import gc
from control.images import image as images
from control.images.store import Store
from control.thawd import podtables
from tests.conftest import REPO

from ..conftest import cli_env, make_settings, store_thaw_json

TENANT = "user-root"     # the CLI's tenant as root
GRACE = 3.0


@pytest.fixture
def s(weed, name, scratch):
    st = make_settings(weed, name, scratch / "cache", **{"store.gc_grace_s": GRACE,
                                                         "pack.avg_chunk_bytes": "16k"})
    store = Store(st)
    store.delete_bucket()
    store.ensure_bucket()
    yield st
    store.delete_bucket()


def env_of(s) -> dict:
    return {"THAW_STORE_GC_GRACE_S": str(GRACE), "THAW_PACK_AVG_CHUNK_BYTES": "16k"}


def view(s, tenant=TENANT) -> Store:
    return Store(s).for_tenant(tenant)


def make_image(d: Path, seed: int, base: int | None = None, mb: int = 2) -> Path:
    """checkpoint.img of `mb` MiB of seed's bytes; pages.img of `mb` MiB of `base`'s
    (an image sharing half its bytes with image `base`), or of its own."""
    d.mkdir(parents=True)
    (d / "checkpoint.img").write_bytes(random.Random(seed).randbytes(mb << 20))
    (d / "pages.img").write_bytes(random.Random(base if base is not None else seed + 10_000).randbytes(mb << 20))
    return d


def push(s, d: Path, key: str, tenant: str = TENANT):
    return images.push(None, view(s, tenant), d, key, NODE[0], chunker=s.pack_chunker, avg_chunk=s.pack_avg_chunk_bytes, workers=s.store_workers)


NODE: list = []   # this node's tuple (the session fixture), for the helpers


@pytest.fixture(autouse=True)
def _node(node):
    NODE[:] = [node]


def missing_packs(s, tenant: str = TENANT) -> dict[str, list[str]]:
    """key -> packs its manifest names that the store lacks (must stay empty)."""
    st = view(s, tenant)
    out = {}
    for key, th, _ in st.list_manifests():
        m = images.read_manifest(st, key, th)
        gone = [p for p in m.packs if st.head("packs/" + p) is None]
        if gone:
            out[key] = gone
    return out


def pull_whole(s, key: str, tag: str) -> None:
    """A pull into a fresh cache: every chunk fetched and checked against its SHA-256."""
    other = dataclasses.replace(s, cache_dir=s.cache_dir.parent / f"pull-{tag}")
    r = images.pull(images.open_cache(other), view(other), key, NODE[0], workers=other.store_workers)
    r.lease.release()
    assert not r.hit


def gc_json(s, *args) -> dict:
    return store_thaw_json(s, "gc", "--store", *args, **env_of(s))["store"][0]


def publish_table(s, key: str, tenant: str = TENANT) -> str:
    """A pod table naming `key`, published as thawd publishes one (podtables.PodTables.publish);
    its name in the tenant's view."""
    lookup = f"{tenant}.gcpod.0123456789"
    t = podtables.Table(lookup, key, {"app": {"key": key, "spec": "0" * 16, "gpus": 0}}, ["gcpod"], time.time())
    podtables.PodTables(Path("/nonexistent"), lambda _lookup: view(s, tenant)).publish(t)
    return f"pods/{lookup}/{key}.json"


def table_names(s, tenant=TENANT) -> set[str]:
    return {o.name for o in view(s, tenant).list_objects("pods/")}


def pack_names(s, tenant=TENANT) -> set[str]:
    return {o.name[len("packs/"):] for o in view(s, tenant).list_objects("packs/")}


def test_rm_and_two_gc_runs_reclaim_an_image_and_keep_what_others_name(s, scratch):
    a = push(s, make_image(scratch / "a", 1), f"{TENANT}.gc-a")
    b = push(s, make_image(scratch / "b", 2, base=1), f"{TENANT}.gc-b")      # dedups against a
    c = push(s, make_image(scratch / "c", 4), f"{TENANT}.gc-c")
    other = push(s, make_image(scratch / "o", 3), "ctr-other.gc-o", tenant="ctr-other")
    ma, mb, mc = (images.read_manifest(view(s), x.key, x.tuple_hash) for x in (a, b, c))
    assert set(ma.packs) <= set(mb.packs), "b names a's packs through the pointers it found"
    ta, tb = publish_table(s, a.key), publish_table(s, b.key)
    orphan = publish_table(s, f"{TENANT}.gc-never-saved")         # a pod whose image never came
    t_other = publish_table(s, "ctr-other.gc-o", tenant="ctr-other")
    time.sleep(GRACE + 2)
    for x, t in ((a, ta), (c, None)):
        rm = store_thaw_json(s, "rm", x.key, **env_of(s))
        assert sorted(rm["removed"]) == sorted([f"manifests/{x.key}/{x.tuple_hash}.json"] + ([t] if t else []))
    young = publish_table(s, f"{TENANT}.gc-saved-soon")           # within the grace: its image may follow
    born = view(s).head(young).mtime
    assert table_names(s) == {tb, orphan, young}

    def tables_gone(r) -> list[str]:   # what a run must remove, by the store's clock it read
        return sorted([orphan] + ([young] if r["now"] - born > GRACE + gc.SLACK_S else []))
    dry = gc_json(s, "--dry-run")
    r1 = gc_json(s)
    assert dry["condemned_packs"] == r1["condemned_packs"] and r1["deleted_packs"] == []
    assert dry["removed_pod_tables"] == tables_gone(dry) and r1["removed_pod_tables"] == tables_gone(r1)
    assert table_names(s) == {tb} | ({young} if young not in r1["removed_pod_tables"] else set())
    assert set(r1["condemned_packs"]) == set(mc.packs) and r1["removed_pointers"] > 0   # a's: b names them
    r2 = gc_json(s)
    assert r2["deleted_packs"] == []                         # the markers are not old yet
    time.sleep(GRACE + 2)
    r3 = gc_json(s)
    # The young table went in the one run that found it older than the grace (by the store's clock).
    took = [r for r in (r1, r2, r3) if young in r["removed_pod_tables"]]
    assert len(took) == 1 and took[0]["now"] - born > GRACE + gc.SLACK_S, (born, [r["now"] for r in (r1, r2, r3)])
    assert table_names(s) == {tb}
    assert set(r3["deleted_packs"]) == set(mc.packs)
    assert pack_names(s) == set(mb.packs)
    assert missing_packs(s) == {}
    pull_whole(s, b.key, "b")
    # Never across tenants: the other tenant's image is untouched and still whole.
    mo = images.read_manifest(view(s, "ctr-other"), other.key, other.tuple_hash)
    assert pack_names(s, "ctr-other") == set(mo.packs)
    # Retention through the CLI: a 1 s age limit takes b.
    r4 = gc_json(s, "--max-age", "1s")
    assert [x["key"] for x in r4["removed_manifests"]] == [b.key]
    assert r4["removed_pod_tables"] == [tb] and table_names(s) == set()   # b's table with b
    assert table_names(s, "ctr-other") == {t_other}
    assert store_thaw_json(s, "ls", **env_of(s))["remote"] == []


def _dedup_bait(s, scratch, n: int) -> list[int]:
    """n published then removed images: old packs, old pointers, no manifest."""
    seeds = list(range(100, 100 + n))
    for sd in seeds:
        push(s, make_image(scratch / f"bait-{sd}", sd), f"{TENANT}.bait-{sd}")
        gc.remove(view(s), f"{TENANT}.bait-{sd}")
    time.sleep(GRACE + 2)
    return seeds


def _gc_loop(s, stop: threading.Event, runs: list) -> None:
    env = cli_env(s) | env_of(s)
    while not stop.is_set():
        p = subprocess.run([str(REPO / ".venv/bin/thaw"), "gc", "--store", "--json"], env=env,
                           capture_output=True, text=True, timeout=120)
        runs.append((p.returncode, p.stderr[-500:]))
        time.sleep(random.uniform(0, 1))


def test_gc_racing_publishes_that_dedup_against_removed_images(s, scratch):
    bait = _dedup_bait(s, scratch, 3)
    stop, runs = threading.Event(), []
    t = threading.Thread(target=_gc_loop, args=(s, stop, runs))
    t.start()
    published, refused = [], []
    try:
        for i in range(12):
            key = f"{TENANT}.pub-{i}"
            d = make_image(scratch / f"pub-{i}", 1000 + i, base=bait[i % len(bait)] + 10_000, mb=1)
            try:
                push(s, d, key)
                published.append(key)
            except StoreError as e:
                assert "store.gc_grace_s" in str(e), e   # too slow for the grace: refused, not broken
                refused.append(key)
            time.sleep(random.uniform(0, 1.5))
    finally:
        stop.set()
        t.join()
    assert runs and all(rc == 0 for rc, _ in runs), runs
    assert len(published) >= 6, (published, refused)
    assert missing_packs(s) == {}
    # Two more runs a grace apart: every pack of the bait no publish names is gone.
    time.sleep(GRACE + 2)
    gc_json(s)
    time.sleep(GRACE + 2)
    gc_json(s)
    st = view(s)
    named = set()
    for key, th, _ in st.list_manifests():
        named |= set(images.read_manifest(st, key, th).packs)
    assert pack_names(s) == named
    for i, key in enumerate(published):
        pull_whole(s, key, f"p{i}")


def test_gc_racing_pulls(s, scratch):
    live = [push(s, make_image(scratch / f"live-{i}", 200 + i, base=300), f"{TENANT}.live-{i}").key
            for i in range(3)]
    _dedup_bait(s, scratch, 2)
    stop, runs = threading.Event(), []
    t = threading.Thread(target=_gc_loop, args=(s, stop, runs))
    t.start()
    pulls = 0
    try:
        deadline = time.monotonic() + 3 * (GRACE + 2)     # long enough for the bait to be deleted
        while time.monotonic() < deadline:
            pull_whole(s, live[pulls % len(live)], f"r{pulls}")
            pulls += 1
    finally:
        stop.set()
        t.join()
    assert all(rc == 0 for rc, _ in runs), runs
    assert pulls >= 6 and missing_packs(s) == {}
    st = view(s)
    named = set()
    for key, th, _ in st.list_manifests():
        named |= set(images.read_manifest(st, key, th).packs)
    assert named <= pack_names(s)


def test_gc_killed_midway_never_deletes_what_a_live_image_needs(s, scratch):
    live = [push(s, make_image(scratch / f"k-live-{i}", 400 + i, base=500 + i), f"{TENANT}.k-live-{i}").key
            for i in range(2)]
    # Bait that shares half its bytes with the live images: their packs must survive every kill.
    for i in range(4):
        push(s, make_image(scratch / f"k-bait-{i}", 600 + i, base=500 + i % 2), f"{TENANT}.k-bait-{i}")
        gc.remove(view(s), f"{TENANT}.k-bait-{i}")
    time.sleep(GRACE + 2)
    env = cli_env(s) | env_of(s)
    kills = 0
    for round_ in range(8):
        p = subprocess.Popen([str(REPO / ".venv/bin/thaw"), "-v", "gc", "--store"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            if round_ % 2 == 0:       # at the first deletion it logs
                end = time.monotonic() + 60
                while time.monotonic() < end:
                    ready, _, _ = select.select([p.stderr], [], [], 1)
                    line = p.stderr.readline() if ready else b""
                    if b"deleted" in line or b"condemned" in line or p.poll() is not None:
                        break
            else:
                time.sleep(random.uniform(0.05, 1.5))
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                kills += 1
        finally:
            p.wait(timeout=30)
            p.stderr.close()
        assert missing_packs(s) == {}, f"round {round_}"
        if round_ % 3 == 2:
            time.sleep(GRACE + 2)   # let markers age, so later kills land among pack deletions
    assert kills >= 4
    for i, key in enumerate(live):
        pull_whole(s, key, f"k{i}")
    for _ in range(2):
        time.sleep(GRACE + 2)
        gc_json(s)
    st = view(s)
    named = set()
    for key, th, _ in st.list_manifests():
        named |= set(images.read_manifest(st, key, th).packs)
    assert pack_names(s) == named and missing_packs(s) == {}
    assert not list(st.list_objects(gc.MARKERS))
