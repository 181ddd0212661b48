"""Cache + transfer + images.pull against an in-memory store."""
import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from control.images import image as images

from control.images import transfer
from control.images.cache import MANIFEST_FILE, Cache
from control.errors import (CacheFull, ImageError, IntegrityError, ManifestError, NotFound, PreconditionError,
                            StoreError, ThawError, Timeout, TupleMismatch)

from .fakes import TUPLE, FakeStore, layout


def publish(store, tmp_path, key, files, chunk=4096, tup=TUPLE):
    d = tmp_path / f"src-{key}"
    d.mkdir()
    for n, data in files.items():
        (d / n).write_bytes(data)
    lay = layout(key, d, chunk, tup)
    locs, _ = transfer.upload(lay, d, store, workers=4)
    m = dataclasses.replace(lay, locations=locs)
    assert store.put_manifest_if_absent(key, m.tuple_hash, m.to_json())
    return m


def image(seed: int, n: int = 64 * 1024) -> dict:
    rnd = bytes((i * seed + (i >> 7)) % 251 for i in range(n))
    return {"checkpoint.img": rnd[:5000], "pages_meta.img": b"m" * 100,
            "pages.img": os.urandom(n // 2) + bytes(8192) + rnd}


def pull(cache, store, key, **kw):
    return images.pull(cache, store, key, TUPLE, workers=4, **kw)


@pytest.fixture
def store():
    return FakeStore()


def test_pull_installs_verified_files_and_second_pull_hits(tmp_path, store):
    files = image(3)
    publish(store, tmp_path, "k", files)
    cache = Cache(tmp_path / "c", 1 << 30)
    r = pull(cache, store, "k")
    assert not r.hit and r.fill.fetched_chunks > 0
    for n, data in files.items():
        assert (r.lease.path / n).read_bytes() == data
    assert (r.lease.path / MANIFEST_FILE).is_file()
    r.lease.release()
    gets = store.gets
    r2 = pull(cache, store, "k")
    assert r2.hit and store.gets == gets and r2.lease.path == r.lease.path
    r2.lease.release()


def test_chunks_on_node_are_not_fetched_again(tmp_path, store):
    a = image(3)
    b = dict(a)
    b["pages.img"] = a["pages.img"][:20000] + b"different" * 100 + a["pages.img"][20900:]  # same length: fixed chunks
    publish(store, tmp_path, "a", a)
    mb = publish(store, tmp_path, "b", b)
    cache = Cache(tmp_path / "c", 1 << 30)
    pull(cache, store, "a").lease.release()
    r = pull(cache, store, "b")
    assert r.fill.local_chunks > 0
    assert r.fill.fetched_raw_bytes < mb.size // 4
    assert (r.lease.path / "pages.img").read_bytes() == b["pages.img"]
    r.lease.release()


def test_zero_chunks_become_holes(tmp_path, store):
    files = {"checkpoint.img": b"c" * 10, "pages.img": bytes(4096 * 4) + b"tail"}
    publish(store, tmp_path, "z", files)
    r = pull(Cache(tmp_path / "c", 1 << 30), store, "z")
    assert r.fill.zero_chunks == 1 and r.fill.zero_bytes == 4096
    assert (r.lease.path / "pages.img").read_bytes() == files["pages.img"]
    r.lease.release()


@pytest.mark.parametrize("chunk", [4096, 3000, 10001])
def test_direct_io_fill_writes_the_same_bytes(tmp_path, store, chunk):
    """O_DIRECT fills (thaw-fetch's whole pages; its fallback to buffered writes
    is go/internal/fetch TestDirectWriteRefusedFallsBackToBuffered): unaligned
    chunk boundaries, compressed chunks, a chunk placed twice and a zero hole
    all come out byte-identical."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    os.close(os.open(probe, os.O_WRONLY | os.O_DIRECT))   # else tmp_path's file system refuses O_DIRECT
    rnd = os.urandom(200_000)
    files = {"checkpoint.img": rnd[:7777], "pages_meta.img": b"m" * 100,
             "pages.img": rnd + bytes(30_000) + b"ab" * 40_000 + rnd[:chunk * 3] + os.urandom(12_345)}
    publish(store, tmp_path, "d", files, chunk=chunk)
    r = pull(Cache(tmp_path / "c", 1 << 30, direct_io=True), store, "d")
    for n, data in files.items():
        assert (r.lease.path / n).read_bytes() == data, n
    # Whole pages only, and only of runs whose bytes sit in the range at their file offset
    # modulo 4096 (one alignment per range: its first uncompressed chunk's).
    assert r.fill.direct_bytes > 0 and r.fill.direct_bytes % 4096 == 0
    r.lease.release()
    buffered = pull(Cache(tmp_path / "c2", 1 << 30, direct_io=False), store, "d")
    assert buffered.fill.direct_bytes == 0 and buffered.fill.written_bytes == r.fill.written_bytes
    buffered.lease.release()


def test_concurrent_pulls_of_one_key_download_once(tmp_path, store):
    publish(store, tmp_path, "k", image(5))
    results, errors = [], []

    def one():
        try:
            r = pull(Cache(tmp_path / "c", 1 << 30), store, "k")
            results.append(r)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=one) for _ in range(6)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors
    assert sum(not r.hit for r in results) == 1
    assert len({r.lease.path for r in results}) == 1
    for r in results:
        r.lease.release()


def test_store_failure_leaves_nothing_behind(tmp_path, store):
    publish(store, tmp_path, "k", image(3))
    store.fail_gets = True
    cache = Cache(tmp_path / "c", 1 << 30)
    with pytest.raises(StoreError):
        pull(cache, store, "k")
    assert cache.entries() == [] and list((tmp_path / "c" / "tmp").iterdir()) == []
    assert list((tmp_path / "c" / "entries").iterdir()) == []
    store.fail_gets = False
    pull(cache, store, "k").lease.release()


def test_altered_store_chunk_is_an_integrity_error(tmp_path, store):
    m = publish(store, tmp_path, "k", image(3))
    name = store.pack_name(m.packs[0])
    body = bytearray(store.objects[name])
    body[10] ^= 0xFF
    store.objects[name] = bytes(body)
    cache = Cache(tmp_path / "c", 1 << 30)
    with pytest.raises(IntegrityError) as e:
        pull(cache, store, "k")
    assert e.value.where == "store"
    assert cache.entries() == []


def test_modified_cache_entry_is_refetched_using_its_good_chunks(tmp_path, store):
    files = image(3)
    publish(store, tmp_path, "k", files)
    cache = Cache(tmp_path / "c", 1 << 30)
    r = pull(cache, store, "k")
    r.lease.release()
    with open(r.lease.path / "pages.img", "r+b") as f:
        f.seek(100)
        f.write(b"XXXX")
    r2 = pull(cache, store, "k")
    assert not r2.hit and r2.fill.fetched_chunks == 1 and r2.fill.bad_sources
    assert any("corrupt" in n for n in r2.notes)
    assert (r2.lease.path / "pages.img").read_bytes() == files["pages.img"]
    assert [e.state for e in cache.entries()] == ["ready"]
    r2.lease.release()


def test_verify_finds_silent_corruption_and_evicts(tmp_path, store):
    publish(store, tmp_path, "k", image(3))
    cache = Cache(tmp_path / "c", 1 << 30)
    r = pull(cache, store, "k")
    r.lease.release()
    p = r.lease.path / "pages.img"
    st = p.stat()
    data = bytearray(p.read_bytes())
    data[5] ^= 1
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))   # same size, same mtime
    # The cheap check sees the write by its ctime (issue 30: the mtime alone was defeated).
    assert "ctime changed" in cache.check_entry(cache.entries()[0])
    _as_if_below_the_file_system(cache, cache.entries()[0].id, p)   # bit rot: not even the ctime moves
    assert cache.check_entry(cache.entries()[0]) is None
    rows = images.verify(cache)
    assert rows[0]["ok"] is False and rows[0]["evicted"] is True
    assert cache.entries() == []
    pull(cache, store, "k").lease.release()


def test_budget_smaller_than_image(tmp_path, store):
    m = publish(store, tmp_path, "k", image(3))
    cache = Cache(tmp_path / "c", m.size - 1)
    with pytest.raises(CacheFull, match="larger than the whole cache budget"):
        pull(cache, store, "k")
    assert store.gets == 0 and cache.entries() == []


def test_lru_eviction_skips_leased_entries(tmp_path, store):
    ma = publish(store, tmp_path, "a", image(3))
    mb = publish(store, tmp_path, "b", image(4))
    publish(store, tmp_path, "c", image(5))
    cache = Cache(tmp_path / "c", ma.size + mb.size + 100)
    la = pull(cache, store, "a").lease        # held: in use
    pull(cache, store, "b").lease.release()
    rc = pull(cache, store, "c")              # must evict b (a is leased)
    assert {e.key for e in cache.entries()} == {"a", "c"}
    rc.lease.release()
    lb = pull(cache, store, "b").lease        # evicts c (a still leased)
    assert {e.key for e in cache.entries()} == {"a", "b"}
    with pytest.raises(CacheFull, match="in use"):
        pull(cache, store, "c")              # a and b both leased
    la.release()
    lb.release()
    pull(cache, store, "c").lease.release()
    assert "c" in {e.key for e in cache.entries()}


def test_crash_leftovers_are_never_served_and_are_cleaned(tmp_path, store):
    publish(store, tmp_path, "k", image(3))
    cache = Cache(tmp_path / "c", 1 << 30)
    part = cache.root / "tmp" / "k@0123456789abcdef@dead.partial"
    part.mkdir()
    (part / "pages.img").write_bytes(b"half")
    orphan = cache.root / "entries" / "k@0123456789abcdef@beef"
    orphan.mkdir()
    (orphan / "pages.img").write_bytes(b"installed but never indexed")
    assert cache.find_locked("k", TUPLE)[0] is None
    r = pull(cache, store, "k")
    assert not r.hit and not part.exists() and not orphan.exists()
    assert sum("recovered" in n for n in r.notes) == 2
    r.lease.release()


def test_dead_process_leases_are_reaped(tmp_path, store):
    ma = publish(store, tmp_path, "a", image(3))
    publish(store, tmp_path, "b", image(4))
    cache = Cache(tmp_path / "c", ma.size + 10)
    r = pull(cache, store, "a")
    with cache._tx() as db:   # pretend the lease holder died
        db.execute("UPDATE leases SET pid = 999999999")
    pull(cache, store, "b").lease.release()
    assert [e.key for e in cache.entries()] == ["b"]
    r.lease.released = True


def test_tuple_mismatch_and_not_found(tmp_path, store):
    other = dataclasses.replace(TUPLE, machine_type="big")
    publish(store, tmp_path, "k", image(3), tup=other)
    cache = Cache(tmp_path / "c", 1 << 30)
    with pytest.raises(TupleMismatch) as e:
        pull(cache, store, "k")
    assert any("machine_type: image has 'big', node has 'test'" in r for r in e.value.reasons)
    with pytest.raises(NotFound):
        pull(cache, store, "nothing")


def test_superset_node_finds_image_by_listing(tmp_path, store):
    publish(store, tmp_path, "k", image(3))
    node = dataclasses.replace(TUPLE, cpu_features=TUPLE.cpu_features + ("avx512f",))
    r = images.pull(Cache(tmp_path / "c", 1 << 30), store, "k", node, workers=2)
    assert not r.hit
    r.lease.release()


def test_invalid_manifest_in_store(tmp_path, store):
    m = publish(store, tmp_path, "k", image(3))
    store.objects[store.manifest_name("k", m.tuple_hash)] = m.to_json().replace(
        b'"schema_version":1', b'"schema_version":7')
    with pytest.raises(ManifestError) as e:
        pull(Cache(tmp_path / "c", 1 << 30), store, "k")
    assert e.value.field == "schema_version"


def test_lock_timeout_names_the_lock(tmp_path, store):
    cache = Cache(tmp_path / "c", 1 << 30, lock_timeout_s=0.2)
    with cache.key_lock("k"):
        other = Cache(tmp_path / "c", 1 << 30, lock_timeout_s=0.2)
        with pytest.raises(Timeout, match="k.lock"):
            with other.key_lock("k"):
                pass


def test_push_race_both_nodes_end_with_the_winner(tmp_path, store):
    a, b = image(3), image(4)
    da, db_ = tmp_path / "da", tmp_path / "db"
    for d, files in ((da, a), (db_, b)):
        d.mkdir()
        for n, data in files.items():
            (d / n).write_bytes(data)
    # Two nodes: each packs its own image under the same key and tuple.
    ca, cb = Cache(tmp_path / "ca", 1 << 30), Cache(tmp_path / "cb", 1 << 30)
    orig = images.chunk.chunk_image
    images.chunk.chunk_image = lambda d, key, tup, chunker, avg: layout(key, d)
    try:
        ra = images.push(ca, store, da, "k", TUPLE, chunker=None, avg_chunk=4096, workers=2)
        rb = images.push(cb, store, db_, "k", TUPLE, chunker=None, avg_chunk=4096, workers=2)
    finally:
        images.chunk.chunk_image = orig
    assert ra.published and not rb.published
    for c in (ca, cb):
        [e] = c.entries("k")
        assert (e.path / "pages.img").read_bytes() == a["pages.img"]


def test_a_missing_fetcher_is_a_clear_error_naming_its_setting_and_nothing_is_kept(tmp_path, store):
    publish(store, tmp_path, "k", image(5))
    store.fetcher = tmp_path / "no-such-thaw-fetch"
    cache = Cache(tmp_path / "c", 1 << 30)
    with pytest.raises(PreconditionError) as e:
        pull(cache, store, "k")
    assert "thaw-fetch not found" in str(e.value) and str(store.fetcher) in str(e.value)
    assert "store.fetcher (THAW_STORE_FETCHER)" in str(e.value)   # the setting that points at it
    assert cache.entries() == [] and list((tmp_path / "c" / "tmp").iterdir()) == []


FAKE_FETCHER = r'''#!{python}
import json, sys
plan = json.load(sys.stdin)
assert plan["version"] == 2 and "/packs/" in plan["objects"][0]["url"] and plan["retry"]["max_attempts"] == 1
first = plan["ranges"][0]
chunk = first[3][0]
assert len(chunk) == 7 and chunk[6] == "" and plan["direct_io"] is True
print(json.dumps({{"done": 4096}}), flush=True)
mode = sys.argv[0].rsplit("-", 1)[1]
if mode == "integrity":
    print(json.dumps({{"error": {{"kind": "integrity", "chunk": chunk[0], "object": plan["objects"][0]["name"],
                                 "offset": first[1], "detail": "bytes have sha256 x, not y: altered"}}}}))
    sys.exit(1)
if mode == "store":
    print(json.dumps({{"error": {{"kind": "store", "object": plan["objects"][0]["name"], "offset": first[1],
                                 "length": first[2], "detail": "HTTP 503"}}}}))
    sys.exit(1)
sys.stderr.write("thaw-fetch: a crash with no JSON\n")
sys.exit(2)
'''


@pytest.mark.parametrize("mode", ["integrity", "store", "crash"])
def test_fetcher_answers_become_the_same_errors_and_nothing_is_kept(tmp_path, store, mode):
    """control/images/fetcher.py's side of the thaw-fetch protocol (its Go side: go test ./cmd/thaw-fetch;
    both together: tests/integration/test_store.py). A stand-in fetcher answers each way."""
    m = publish(store, tmp_path, "k", image(6))
    fetcher = tmp_path / f"fetcher-{mode}"
    fetcher.write_text(FAKE_FETCHER.format(python=sys.executable))
    fetcher.chmod(0o755)
    store.fetcher = fetcher
    cache = Cache(tmp_path / "c", 1 << 30, direct_io=True)
    done = []
    want = {"integrity": IntegrityError, "store": StoreError, "crash": ThawError}[mode]
    with pytest.raises(want) as e:
        pull(cache, store, "k", progress=done.append)
    assert done[-1] == 4096   # the fetcher's progress reached the caller (earlier: the zero chunk)
    if mode == "integrity":
        assert e.value.chunk in m.locations and "altered" in str(e.value)
    elif mode == "store":
        assert str(e.value).startswith("store get s3://fake/packs/") and "HTTP 503" in str(e.value)
    else:
        assert "exit 2" in str(e.value) and "a crash with no JSON" in str(e.value)
    assert cache.entries() == [] and list((tmp_path / "c" / "tmp").iterdir()) == []


# -- an image written straight into the cache, published, installed by rename ------------

@pytest.fixture
def py_chunker(monkeypatch):
    """Chunk with fakes.layout (hashlib, fixed 4 KiB chunks) instead of thaw-chunk."""
    monkeypatch.setattr(images.chunk, "chunk_image", lambda d, key, tup, chunker, avg: layout(key, d))


def stage_publish(cache, store, key, files, **kw):
    with images.staged(cache, key, TUPLE) as st:
        for n, data in files.items():
            (st.path / n).write_bytes(data)
        inodes = {n: (st.path / n).stat().st_ino for n in files}
        r = images.publish_staged(cache, store, st, chunker=None, avg_chunk=4096, workers=2, **kw)
    return r, inodes


def test_staged_image_is_published_then_installed_by_rename_without_hashing_again(tmp_path, store, py_chunker,
                                                                                  monkeypatch):
    cache = Cache(tmp_path / "c", 1 << 30)
    files = image(7)
    # Neither the upload nor the install may hash the image again (thaw-chunk's names are trusted).
    monkeypatch.setattr(images.chunk, "sha256", lambda data: pytest.fail("hashed again"))
    r, inodes = stage_publish(cache, store, "k", files)
    monkeypatch.undo()
    assert r.published and r.upload.uploaded_chunks == r.upload.chunks > 0
    [e] = cache.entries("k")
    assert r.installed == e.id and e.state == "ready"
    for n, data in files.items():
        assert (e.path / n).read_bytes() == data
        assert (e.path / n).stat().st_ino == inodes[n]   # the very file written into the partial: no copy
    assert list((cache.root / "tmp").iterdir()) == []
    assert cache.check_entry(e, full=True) is None
    stored = images.remote_manifest(store, "k", TUPLE)
    assert cache.manifest_of(e).files == stored.files
    # Another node fetches what was published, every chunk checked against its name.
    other = pull(Cache(tmp_path / "c2", 1 << 30), store, "k")
    assert not other.hit and (other.lease.path / "pages.img").read_bytes() == files["pages.img"]
    other.lease.release()


def test_a_failed_publish_leaves_no_partial_no_entry_and_no_manifest(tmp_path, store, py_chunker):
    cache = Cache(tmp_path / "c", 1 << 30)

    def refuse(p, body):
        raise StoreError("put", f"packs/{p}", "connection refused")
    store.put_pack = refuse
    with pytest.raises(StoreError):
        stage_publish(cache, store, "k", image(3))
    assert cache.entries() == [] and list((cache.root / "tmp").iterdir()) == []
    assert list(store.list_manifests()) == []


def test_an_image_changed_after_chunking_is_not_published(tmp_path, store, py_chunker, monkeypatch):
    cache = Cache(tmp_path / "c", 1 << 30)
    real = images.transfer.upload

    def upload_then_change(layout_, src, store_, **kw):
        out = real(layout_, src, store_, **kw)
        with open(src / "pages.img", "r+b") as f:   # same size: only the file state tells
            f.write(b"\xff")
        return out
    monkeypatch.setattr(images.transfer, "upload", upload_then_change)
    with pytest.raises(ImageError, match="changed while being published"):
        stage_publish(cache, store, "k", image(3))
    assert list(store.list_manifests()) == [] and cache.entries() == []
    assert list((cache.root / "tmp").iterdir()) == []


def test_a_file_shorter_than_its_chunks_is_refused_by_the_upload(tmp_path, store):
    d = tmp_path / "img"
    d.mkdir()
    for n, data in image(3).items():
        (d / n).write_bytes(data)
    lay = layout("k", d)
    os.truncate(d / "pages.img", 100)
    with pytest.raises(ImageError, match="shorter than when it was chunked"):
        transfer.upload(lay, d, store, workers=2)


def test_a_live_writers_partial_survives_recovery_a_dead_ones_is_reclaimed(tmp_path, store):
    cache = Cache(tmp_path / "c", 1 << 30)
    # A checkpoint that was killed -9 while runsc wrote into its partial: its writer is gone.
    code = ("import os, sys; from control.images.cache import Cache; from tests.unit.fakes import TUPLE; "
            "_, p = Cache(sys.argv[1], 1 << 30).new_partial('k', TUPLE.hash()); "
            "(p / 'pages.img').write_bytes(b'half'); print(p, flush=True); os.kill(os.getpid(), 9)")
    out = subprocess.run([sys.executable, "-c", code, str(cache.root)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == -9, out.stderr
    dead = cache.root / "tmp" / os.path.basename(out.stdout.strip())
    assert dead.is_dir()
    with images.staged(cache, "k", TUPLE) as live:
        (live.path / "pages.img").write_bytes(b"being written")
        # A pull of the same key meanwhile (here: nothing published yet) recovers the key.
        with pytest.raises(NotFound):
            pull(cache, store, "k")
        assert live.path.is_dir() and not dead.exists()
        assert cache.find_locked("k", TUPLE)[0] is None   # never served while being written
    assert not live.path.exists()                          # not installed: removed at the end


def test_gc_reclaims_a_dead_checkpoints_partial_of_a_key_it_never_locked(tmp_path):
    cache = Cache(tmp_path / "c", 1 << 30)
    left = cache.root / "tmp" / "never-locked@0123456789abcdef@0bad.999999999-1.partial"
    left.mkdir()
    (left / "pages.img").write_bytes(b"half")
    assert not (cache.root / "locks" / "never-locked.lock").exists()
    assert cache.gc()["removed_partial_or_orphan"] == [str(left)]
    assert not left.exists()


def test_published_but_no_room_in_the_cache_is_a_note_not_an_error(tmp_path, store, py_chunker):
    cache = Cache(tmp_path / "c", 1000)
    r, _ = stage_publish(cache, store, "k", image(3))
    assert r.published and r.installed is None and "not cached" in r.notes[0]
    assert cache.entries() == [] and list((cache.root / "tmp").iterdir()) == []
    assert images.remote_manifest(store, "k", TUPLE).size == r.size


def test_push_with_a_cache_copies_the_directory_once_and_leaves_it_alone(tmp_path, store, py_chunker):
    d = tmp_path / "user-image"
    d.mkdir()
    files = image(9)
    for n, data in files.items():
        (d / n).write_bytes(data)
    cache = Cache(tmp_path / "c", 1 << 30)
    r = images.push(cache, store, d, "k", TUPLE, chunker=None, avg_chunk=4096, workers=2)
    [e] = cache.entries("k")
    assert r.published and r.installed == e.id
    for n, data in files.items():
        assert (d / n).read_bytes() == data and (e.path / n).read_bytes() == data
        assert (e.path / n).stat().st_ino != (d / n).stat().st_ino
    assert cache.check_entry(e, full=True) is None and list((cache.root / "tmp").iterdir()) == []


def _as_if_below_the_file_system(cache: Cache, eid: str, p) -> None:
    """Re-record `p`'s inode data in the entry's snapshot: a change the cheap check cannot see
    (bit rot, a write to the block device), which only hashing finds."""
    import json
    import sqlite3
    db = sqlite3.connect(cache.root / "index.sqlite")
    snap = json.loads(db.execute("SELECT snapshot FROM entries WHERE id = ?", (eid,)).fetchone()[0])
    st = p.stat()
    snap[p.name] = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_nlink]
    db.execute("UPDATE entries SET snapshot = ? WHERE id = ?", (json.dumps(snap), eid))
    db.commit()
    db.close()
