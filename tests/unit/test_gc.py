"""The store lifecycle's mark and sweep (control/images/gc.py) against an in-memory
store with a clock the test moves: what goes, what stays, in which run, and that
no manifest ever names a pack that is gone, whatever the interleaving."""
from __future__ import annotations

import dataclasses
import os

import pytest

from control.errors import NotFound, PreconditionError, StoreError, UserError
from control.images import gc
from control.images import image as images
from control.images import transfer
from control.images.cache import Cache
from control.images.store import Obj

from .fakes import TUPLE, FakeStore, layout

TENANT = "ctr-gc"
GRACE = 10.0


class TimedStore(FakeStore):
    """FakeStore plus what gc.py uses: listings with LastModified from a clock the
    test sets (`self.t`, shared by every tenant view), HEAD, delete, empty objects."""

    def __init__(self) -> None:
        super().__init__()
        self.clock_box = [1000.0]
        self.mtimes: dict[str, float] = {}
        store = self

        from .fakes import Objects

        class Timed(Objects):
            def __setitem__(self, k, v):
                store.mtimes[k] = store.clock_box[0]
                super().__setitem__(k, v)
        self.objects = Timed()
        self.gc_grace_s = None     # the publish bound is tested on its own (below)
        self.deletes = 0
        self.fail_delete_after: int | None = None

    @property
    def t(self) -> float:
        return self.clock_box[0]

    @t.setter
    def t(self, v: float) -> None:
        self.clock_box[0] = v

    def list_objects(self, under: str):
        base = self.prefix + under
        for name in sorted(self.objects):
            if name.startswith(base):
                yield Obj(name[len(self.prefix):], len(self.objects[name]), int(self.mtimes[name]))

    def head(self, name: str):
        full = self.prefix + name
        if full not in self.objects:
            return None
        m = self.meta.get(full)
        meta = {"thaw-pack": m["pack"]} if m else {}
        return Obj(name, len(self.objects[full]), int(self.mtimes[full]), meta)

    def put_empty(self, name: str) -> None:
        self.objects[self.prefix + name] = b""

    def delete(self, names: list[str]) -> None:
        self.deletes += 1
        if self.fail_delete_after is not None and self.deletes > self.fail_delete_after:
            raise StoreError("delete", names[0], "killed")   # the process died here
        for n in names:
            self.objects.pop(self.prefix + n, None)
            self.meta.pop(self.prefix + n, None)

    def clock(self) -> float:
        self.put_empty("gc/clock")
        return int(self.t)

    def get_order(self, key, th):
        return None


@pytest.fixture
def shared():
    return TimedStore()


@pytest.fixture
def store(shared):
    return shared.for_tenant(TENANT)


def files(seed: int, shared_with: int | None = None, n: int = 6) -> dict:
    """An image of n 4 KiB chunks; with `shared_with`, its first half is that image's."""
    def chunk(s, i):
        return bytes(((s * 7919 + i * 31 + j) * 2654435761 >> 13) % 256 for j in range(4096))
    body = b"".join(chunk(shared_with if shared_with is not None and i < n // 2 else seed, i) for i in range(n))
    return {"checkpoint.img": body}


def upload(store, tmp_path, key, data):
    """A publish's upload (probes, packs, pointers), without its manifest yet."""
    d = tmp_path / f"src-{key}-{os.urandom(3).hex()}"
    d.mkdir()
    for n, b in data.items():
        (d / n).write_bytes(b)
    lay = dataclasses.replace(layout(key, d), tenant=store.tenant)
    locs, _ = transfer.upload(lay, d, store, workers=2)
    return dataclasses.replace(lay, locations=locs)


def publish(store, tmp_path, key, data):
    m = upload(store, tmp_path, key, data)
    assert store.put_manifest_if_absent(key, m.tuple_hash, m.to_json())
    return m


def intact(store) -> None:
    """The invariant: every pack any manifest of the tenant names exists."""
    manifests, _ = gc._manifest_objects(store)
    for key, th in manifests:
        m = images.read_manifest(store, key, th)
        missing = [p for p in m.packs if store.pack_name(p) not in store.objects]
        assert not missing, f"{key}: packs gone under a live manifest: {missing}"


def pull_ok(store, tmp_path, key) -> None:
    cache = Cache(tmp_path / f"cache-{os.urandom(3).hex()}", 1 << 30)
    with images.pull(cache, store, key, TUPLE, workers=2).lease:
        pass


def packs(store) -> set[str]:
    return {n.rsplit("/", 1)[1] for n in store.objects if n.startswith(store.prefix + "packs/")}


def run(store, **kw):
    return gc.collect(store, grace_s=GRACE, **kw)


# -- thaw rm ------------------------------------------------------------------------

def test_rm_removes_the_manifests_and_hints_of_one_key_only(store, tmp_path):
    publish(store, tmp_path, f"{TENANT}.a", files(1))
    publish(store, tmp_path, f"{TENANT}.b", files(2))
    m = upload(store, tmp_path, f"{TENANT}.a", files(1))
    store.objects[store.manifest_name(f"{TENANT}.a", m.tuple_hash).replace(".json", ".order")] = b"[]"
    assert gc.remove(store, f"{TENANT}.a", dry_run=True) and store.get_manifest(f"{TENANT}.a", m.tuple_hash)
    gone = gc.remove(store, f"{TENANT}.a")
    assert sorted(n.rsplit(".", 1)[1] for n in gone) == ["json", "order"]
    assert [k for k, _, _ in store.list_manifests()] == [f"{TENANT}.b"]
    with pytest.raises(NotFound, match="holds no manifest"):
        gc.remove(store, f"{TENANT}.a")
    with pytest.raises(UserError, match="is not tenant"):
        gc.remove(store, "ctr-other.a")


LOOKUP = f"{TENANT}.web.0123456789"      # a pod's lookup key (control/lifecycle/pod.py lookup)


def put_table(store, key: str, lookup: str = LOOKUP) -> str:
    """A pod table naming `key`, as control/thawd/podtables.py publishes it (its body is
    not read by the GC); its name in the tenant's view."""
    name = f"pods/{lookup}/{key}.json"
    store.objects[store.prefix + name] = b'{"schema": "thaw.pod-table"}'
    return name


def tables(store) -> set[str]:
    return {n[len(store.prefix):] for n in store.objects if n.startswith(store.prefix + "pods/")}


def test_rm_removes_the_pod_tables_naming_its_key_with_its_last_manifest(store, tmp_path):
    key, other = f"{LOOKUP}-00000000aa", f"{LOOKUP}-00000000bb"
    m = publish(store, tmp_path, key, files(30))
    publish(store, tmp_path, other, files(31))
    mine, theirs = put_table(store, key), put_table(store, other)
    another_lookup = put_table(store, key, lookup=f"{TENANT}.web.abcdefabcd")   # the GC never parses keys
    # A second tuple of the key: rm of one tuple leaves the key alive, and its tables.
    store.objects[store.manifest_name(key, "f" * 64)] = store.get_manifest(key, m.tuple_hash)
    assert gc.remove(store, key, tuple_hash="f" * 12) == [f"manifests/{key}/{'f' * 64}.json"]
    assert tables(store) == {mine, theirs, another_lookup}
    dry = gc.remove(store, key, dry_run=True)
    assert set(dry) == {f"manifests/{key}/{m.tuple_hash}.json", mine, another_lookup}
    assert tables(store) == {mine, theirs, another_lookup}
    assert set(gc.remove(store, key)) == set(dry)
    assert tables(store) == {theirs}
    # A table left without any manifest (a pod never saved) is still the key's to remove.
    orphan = put_table(store, f"{LOOKUP}-00000000cc")
    assert gc.remove(store, f"{LOOKUP}-00000000cc") == [orphan]
    with pytest.raises(NotFound, match="holds no manifest"):
        gc.remove(store, f"{LOOKUP}-00000000cc")


def test_the_lifecycle_refuses_a_store_that_is_no_tenants_view(shared):
    with pytest.raises(UserError, match="one tenant's prefix"):
        gc.collect(shared, grace_s=GRACE)


# -- retention ------------------------------------------------------------------------

def obj(t: float) -> Obj:
    return Obj("m", 1, t)


def test_retention_by_age_and_by_count_per_workload_and_tuple():
    now = 10_000.0
    ms = {("t.web.0123456789abcdef", "A"): obj(now - 50), ("t.web.fedcba9876543210", "A"): obj(now - 500),
          ("t.web.00000000000000aa", "A"): obj(now - 5000), ("t.web.00000000000000aa", "B"): obj(now - 5000),
          ("t.db.0123456789abcdef", "A"): obj(now - 9000), ("t.cli-image", "A"): obj(now - 20)}
    assert gc.retention(ms, now, 0, 0) == []
    by_age = gc.retention(ms, now, 1000, 0)
    assert {(r["key"], r["tuple_hash"]) for r in by_age} == {("t.web.00000000000000aa", "A"),
                                                             ("t.web.00000000000000aa", "B"),
                                                             ("t.db.0123456789abcdef", "A")}
    keep1 = gc.retention(ms, now, 0, 1)
    # web on tuple A has three images: the two older go; one of tuple B, db and the CLI key stay.
    assert {(r["key"], r["tuple_hash"]) for r in keep1} == {("t.web.fedcba9876543210", "A"),
                                                            ("t.web.00000000000000aa", "A")}
    assert all("newest of workload t.web" in r["why"] for r in keep1)
    assert gc.workload_of("k8s-ns.model.0123456789abcdef") == "k8s-ns.model"
    assert gc.workload_of("user-root.myapp") == "user-root.myapp"
    assert gc.workload_of("k8s-ns.web.0123456789-abcdef0123") == "k8s-ns.web"    # a pod's key


def test_retention_runs_inside_the_gc_and_its_packs_follow_in_two_runs(store, tmp_path):
    publish(store, tmp_path, f"{TENANT}.web.0000000000000001", files(1))
    store.t += 100
    publish(store, tmp_path, f"{TENANT}.web.0000000000000002", files(2))
    store.t += 100
    r = run(store, keep=1)
    assert [x["key"] for x in r.removed_manifests] == [f"{TENANT}.web.0000000000000001"]
    assert r.condemned_packs and not r.deleted_packs
    store.t += GRACE + 2
    r2 = run(store, keep=1)
    assert sorted(r2.deleted_packs) == sorted(r.condemned_packs) and not r2.removed_manifests
    intact(store)
    pull_ok(store, tmp_path, f"{TENANT}.web.0000000000000002")


def test_retention_removes_the_pod_tables_of_the_images_it_removes(store, tmp_path):
    old_key, new_key = f"{LOOKUP}-0000000001", f"{LOOKUP}-0000000002"
    t_old = put_table(store, old_key)              # assembled, then saved: the table comes first
    publish(store, tmp_path, old_key, files(32))
    store.t += 100
    t_new = put_table(store, new_key)
    publish(store, tmp_path, new_key, files(33))
    store.t += 100
    dry = run(store, keep=1, dry_run=True)
    assert dry.removed_pod_tables == [t_old] and "1 pod tables" in dry.summary()
    assert tables(store) == {t_old, t_new}
    r = run(store, keep=1)
    assert [x["key"] for x in r.removed_manifests] == [old_key] and r.removed_pod_tables == [t_old]
    assert tables(store) == {t_new}


# -- the sweep ------------------------------------------------------------------------

def test_an_unreferenced_pack_goes_in_two_runs_and_a_shared_one_stays(store, tmp_path):
    a = publish(store, tmp_path, f"{TENANT}.a", files(1))
    store.t += 1
    b = publish(store, tmp_path, f"{TENANT}.b", files(2, shared_with=1))   # half of its chunks are a's
    c = publish(store, tmp_path, f"{TENANT}.c", files(3))
    assert set(a.packs) < set(b.packs), "b reuses a's pack through its pointers"
    store.t += 100
    first = run(store)
    assert first.deleted_packs == [] and first.condemned_packs == [] and first.removed_pointers == 0
    gc.remove(store, f"{TENANT}.a")         # its pack stays: b names it
    gc.remove(store, f"{TENANT}.c")         # its pack goes
    r1 = run(store)
    assert set(r1.condemned_packs) == set(c.packs) and r1.deleted_packs == [] and r1.removed_pointers > 0
    store.t += GRACE / 2
    r2 = run(store)
    assert r2.deleted_packs == [] and r2.waiting_packs == len(c.packs)
    store.t += GRACE
    r3 = run(store)
    assert set(r3.deleted_packs) == set(c.packs) and r3.deleted_bytes > 0
    assert packs(store) == set(b.packs)
    assert not [n for n in store.objects if gc.MARKERS in n]
    intact(store)
    pull_ok(store, tmp_path, f"{TENANT}.b")
    assert run(store).deleted_packs == []          # nothing left to do


def test_a_publish_in_flight_keeps_its_young_packs_and_pointers(store, tmp_path):
    m = upload(store, tmp_path, f"{TENANT}.flight", files(3))     # packs and pointers, no manifest yet
    store.t += GRACE / 2
    r = run(store)
    assert r.young_packs == len(m.packs) and r.removed_pointers == 0 and not r.condemned_packs
    assert store.put_manifest_if_absent(m.key, m.tuple_hash, m.to_json())
    store.t += 3 * GRACE
    run(store)
    store.t += 3 * GRACE
    assert run(store).deleted_packs == []
    intact(store)
    pull_ok(store, tmp_path, m.key)


def test_a_publish_that_dedups_against_a_removed_image_keeps_what_it_names(store, tmp_path):
    """The case the grace alone would not cover: the pack is old, its manifest gone, and a
    publish in flight learned its name from a pointer. Its manifest lands within the grace
    of that probe (image.check_publish_time), and the run that would delete the pack sees it."""
    old = publish(store, tmp_path, f"{TENANT}.old", files(4))
    store.t += 100
    gc.remove(store, f"{TENANT}.old")
    c = upload(store, tmp_path, f"{TENANT}.new", files(5, shared_with=4))   # probes old's pointers
    reused = set(c.packs) & set(old.packs)
    store.t += 1
    r1 = run(store)                         # old's pointers go, its packs are condemned
    assert set(r1.condemned_packs) == set(old.packs)
    store.t += GRACE - 4
    assert run(store).deleted_packs == []   # a run meanwhile waits out the marker's grace
    store.t += 1                            # the publish is still within its bound...
    assert store.put_manifest_if_absent(c.key, c.tuple_hash, c.to_json())
    store.t += 10
    r2 = run(store)                         # ...and this run, past the marker's grace, sees it
    intact(store)
    assert not set(r2.deleted_packs) & set(c.packs) and reused
    pull_ok(store, tmp_path, c.key)


def test_a_publish_slower_than_the_grace_is_refused_before_its_manifest(store, tmp_path, monkeypatch):
    d = tmp_path / "img"
    d.mkdir()
    (d / "checkpoint.img").write_bytes(files(6)["checkpoint.img"])
    monkeypatch.setattr(images.chunk, "chunk_image", lambda dd, k, tup, chunker, avg: layout(k, dd))
    store.gc_grace_s = 0.0                  # every publish is "too slow"
    with pytest.raises(StoreError, match="store.gc_grace_s"):
        images.push(None, store, d, f"{TENANT}.slow", TUPLE, chunker=None, avg_chunk=4096, workers=2)
    assert list(store.list_manifests()) == []
    store.gc_grace_s = 3600.0
    assert images.push(None, store, d, f"{TENANT}.slow", TUPLE, chunker=None, avg_chunk=4096, workers=2).published


def test_a_pointer_to_a_dead_pack_goes_even_when_its_chunk_is_live(store, tmp_path):
    """Two writers of one chunk: the pointer names the loser's pack, the manifest the
    winner's. The loser's pack dies, and its pointer with it (pointers are only an index)."""
    a = publish(store, tmp_path, f"{TENANT}.a", files(7))
    loser = upload(store.for_tenant(TENANT), tmp_path, f"{TENANT}.a2", files(8))
    h = next(iter(a.unique_chunks()))
    store.meta[store.chunk_name(h)] = {**store.meta[store.chunk_name(h)], "pack": loser.packs[0]}
    store.t += 100
    run(store)
    store.t += GRACE + 2
    r = run(store)
    assert set(r.deleted_packs) == set(loser.packs)
    assert store.chunk_name(h) not in store.objects        # no pointer left naming a pack that is gone
    intact(store)
    pull_ok(store, tmp_path, a.key)


def test_an_unreadable_manifest_stops_the_run_before_anything_is_deleted(store, tmp_path):
    publish(store, tmp_path, f"{TENANT}.a", files(9))
    m = publish(store, tmp_path, f"{TENANT}.b", files(10))
    gc.remove(store, f"{TENANT}.a")
    store.objects[store.manifest_name(m.key, m.tuple_hash)] = b'{"schema": "thaw.manifest", "schema_version": 99}'
    store.t += 100
    before = dict(store.objects)
    with pytest.raises(PreconditionError, match=r"stopped before deleting anything: manifest ctr-gc.b/"):
        run(store)
    assert set(store.objects) - {store.prefix + "gc/clock"} == set(before) - {store.prefix + "gc/clock"}


def test_a_dry_run_changes_nothing_and_says_what_a_run_would_do(store, tmp_path):
    publish(store, tmp_path, f"{TENANT}.a", files(11))
    publish(store, tmp_path, f"{TENANT}.b", files(12))
    gc.remove(store, f"{TENANT}.a")
    store.t += 100
    names = set(store.objects)
    dry = run(store, dry_run=True)
    assert set(store.objects) - {store.prefix + "gc/clock"} == names - {store.prefix + "gc/clock"}
    real = run(store)
    assert (dry.removed_pointers, dry.condemned_packs) == (real.removed_pointers, real.condemned_packs)
    store.t += GRACE + 2
    dry2 = run(store, dry_run=True)
    assert dry2.deleted_packs == run(store).deleted_packs != []
    assert "would remove" in dry2.summary()


def test_orphan_markers_and_hints_go(store, tmp_path):
    store.put_empty(gc.MARKERS + "f" * 64)
    store.objects[store.prefix + "manifests/ctr-gc.x/" + "0" * 64 + ".order"] = b"[]"
    store.t += 100
    r = run(store)
    assert r.removed_markers == ["f" * 64] and len(r.removed_orders) == 1
    assert [n for n in store.objects if n.endswith(("gc/condemned/" + "f" * 64, ".order"))] == []


def test_a_pod_table_without_a_live_manifest_goes_once_older_than_the_grace(store, tmp_path):
    live_key = f"{LOOKUP}-00000000aa"
    publish(store, tmp_path, live_key, files(34))
    live = put_table(store, live_key)
    orphan = put_table(store, f"{LOOKUP}-00000000dd")            # its pod was never saved
    store.t += GRACE / 2
    waiting = put_table(store, f"{LOOKUP}-00000000ee")           # assembled now: its image may follow
    store.t += GRACE / 2 + 2
    r = run(store)
    assert r.removed_pod_tables == [orphan] and tables(store) == {live, waiting}
    assert store.put_manifest_if_absent(*(lambda m: (m.key, m.tuple_hash, m.to_json()))(
        upload(store, tmp_path, f"{LOOKUP}-00000000ee", files(35))))
    store.t += 10 * GRACE
    assert run(store).removed_pod_tables == [] and tables(store) == {live, waiting}
    intact(store)


@pytest.mark.parametrize("after", range(0, 6))
def test_a_run_killed_at_any_delete_leaves_every_live_image_whole(store, tmp_path, after):
    publish(store, tmp_path, f"{TENANT}.a", files(13))
    b = publish(store, tmp_path, f"{TENANT}.b", files(14, shared_with=13))
    publish(store, tmp_path, f"{TENANT}.c", files(15))
    gc.remove(store, f"{TENANT}.a")
    gc.remove(store, f"{TENANT}.c")
    store.t += 100
    for step in range(4):
        store.deletes, store.fail_delete_after = 0, after
        try:
            run(store)
        except StoreError:
            pass                            # killed here
        intact(store)
        store.t += GRACE / 2 + 1
    store.fail_delete_after = None
    for _ in range(3):
        run(store)
        store.t += GRACE + 2
    intact(store)
    pull_ok(store, tmp_path, b.key)
    assert packs(store) == set(b.packs)
    assert not [n for n in store.objects if gc.MARKERS in n]


def test_tenants_never_cross(shared, tmp_path):
    mine, theirs = shared.for_tenant(TENANT), shared.for_tenant("ctr-other")
    publish(theirs, tmp_path, "ctr-other.a", files(16))
    publish(mine, tmp_path, f"{TENANT}.a", files(17))
    # The other tenant's tables: one of a key only it has, one of a key that is also mine.
    theirs_tables = {put_table(theirs, "ctr-other.b", lookup="ctr-other.b"),
                     put_table(theirs, f"{TENANT}.a", lookup=LOOKUP)}
    put_table(mine, f"{TENANT}.orphan")
    gc.remove(mine, f"{TENANT}.a")
    for _ in range(3):
        shared.t += GRACE + 2
        gc.collect(mine, grace_s=GRACE)
    assert packs(theirs) and not packs(mine)
    assert tables(theirs) == theirs_tables and not tables(mine)
    assert all(n.startswith(("tenants/ctr-other/", f"tenants/{TENANT}/gc/")) for n in shared.objects)
    intact(theirs)
