"""The store path against real SeaweedFS and real runsc checkpoint images:
push, pull, ls, verify, gc, and every fault the issue lists (docs/store.md)."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from control.images import image as images

from control.dev import seaweed
from control.images.cache import MANIFEST_FILE
from control.errors import CacheFull, IntegrityError, ManifestError, StoreError, TupleMismatch
from control.images.store import Store
from runsc_hooks.runsc import CreateOptions, GlobalOptions, RestoreOptions, Runsc
from tests.conftest import REPO

from .conftest import cli_env, make_settings, run_all, store_thaw, store_thaw_json


# The CLI's tenant when it runs as root (control/lifecycle/tenant.py cli_tenant): the
# library calls below use the same tenant's view of the store, and keys in its namespace.
TENANT = "user-root"


def same_files(a: Path, b: Path) -> None:
    for f in sorted(a.iterdir()):
        assert (b / f.name).read_bytes() == f.read_bytes(), f.name


def push(s, image, key, node, cache=True):
    return images.push(images.open_cache(s) if cache else None, Store(s).for_tenant(TENANT), image, key, node,
                       chunker=s.pack_chunker, avg_chunk=s.pack_avg_chunk_bytes, workers=s.store_workers)


def pull(s, key, node, **kw):
    return images.pull(images.open_cache(s), Store(s).for_tenant(TENANT), key, node, workers=s.store_workers, **kw)


def other_node(s, scratch, tag):
    return dataclasses.replace(s, cache_dir=scratch / f"cache-{tag}")



# -- the happy path, through the CLI, ending in a real restore -----------------------

def test_cli_push_pull_ls_verify_gc_then_restore(settings, checkpoints, scratch, runsc_bin):
    img = checkpoints["runtime"]
    out = store_thaw_json(settings, "push", str(img), "--key", "user-root.wl-runtime")
    assert out["published"] is True and out["upload"]["uploaded_chunks"] > 0 and out["installed"]
    again = store_thaw_json(settings, "push", str(img), "--key", "user-root.wl-runtime", "--no-cache")
    assert again["published"] is False and again["upload"]["uploaded_chunks"] == 0

    b = other_node(settings, scratch, "b")
    r = store_thaw(b, "pull", "user-root.wl-runtime", "--progress")
    assert "/s" in r.stderr and "fetched into" in r.stdout
    pulled = store_thaw_json(b, "pull", "user-root.wl-runtime")
    assert pulled["hit"] is True
    entry = Path(pulled["path"])
    same_files(img, entry)
    assert (entry / MANIFEST_FILE).is_file()

    ls = store_thaw_json(b, "ls")
    assert [e["key"] for e in ls["local"]] == ["user-root.wl-runtime"] and ls["local"][0]["match"]
    [remote] = ls["remote"]
    assert remote["key"] == "user-root.wl-runtime" and remote["match"] and remote["size"] == ls["local"][0]["size"]
    assert "user-root.wl-runtime" in store_thaw(b, "ls").stdout
    assert all(row["ok"] for row in store_thaw_json(b, "verify"))
    assert store_thaw_json(b, "gc")["evicted"] == []

    # What the cache delivers restores: the workload continues where it was saved.
    base = img.parent
    boot = json.loads((base / "share" / "ready.jsonl").read_text().splitlines()[0])["boot"]
    beats = base / "share" / "beats.jsonl"
    before = len(beats.read_text().splitlines())
    cache = images.open_cache(b)
    [e] = cache.entries("user-root.wl-runtime")
    lease = cache.lease(e.id)
    rs = Runsc(runsc_bin, GlobalOptions(root=scratch / "root", network="none"), timeout_s=120)
    cid = "t-restore-from-cache"
    try:
        rs.restore(cid, RestoreOptions(image_path=lease.path, create=CreateOptions(bundle=base / "bundle")))
        deadline = time.monotonic() + 30
        while len(beats.read_text().splitlines()) <= before and time.monotonic() < deadline:
            time.sleep(0.1)
        new = [json.loads(x) for x in beats.read_text().splitlines()[before:]]
        assert new and all(x["boot"] == boot for x in new)
    finally:
        try:
            rs.delete(cid, force=True)
        finally:
            lease.release()


def test_second_image_fetches_only_what_differs(settings, checkpoints, node, scratch):
    push(settings, checkpoints["runtime"], "user-root.wl-a", node, cache=False)
    m = push(settings, checkpoints["kv"], "user-root.wl-b", node, cache=False)
    b = other_node(settings, scratch, "b")
    a = pull(b, "user-root.wl-a", node)
    a.lease.release()
    assert a.fill.engine == "thaw-fetch" and a.fill.fetched_raw_bytes == a.fill.written_bytes
    same_files(checkpoints["runtime"], a.lease.path)
    r = pull(b, "user-root.wl-b", node)
    r.lease.release()
    assert r.fill.engine == "thaw-fetch" and r.fill.local_chunks > 0 and r.fill.fetched_raw_bytes < m.size
    same_files(checkpoints["kv"], r.lease.path)


@pytest.mark.parametrize("direct_io", [True, False], ids=["direct", "buffered"])
def test_fill_with_and_without_o_direct(direct_io, settings, node, scratch):
    """Incompressible files of sizes that are not page multiples, a run of
    zeros and a chunk repeated within and across files: every byte lands where
    it belongs, and thaw-fetch writes whole pages with O_DIRECT only when asked."""
    img = scratch / "img"
    img.mkdir()
    rnd = os.urandom(6 << 20)
    (img / "pages.img").write_bytes(rnd[:3 << 20] + bytes(5 << 20) + rnd[:3 << 20] + rnd[3 << 20:] + b"x" * 4097)
    (img / "checkpoint.img").write_bytes(rnd[1000:1000 + (1 << 20) + 123])
    (img / "pages_meta.img").write_bytes(b"meta" * 333)
    push(settings, img, "user-root.synthetic", node, cache=False)
    b = dataclasses.replace(other_node(settings, scratch, "b"), cache_direct_io=direct_io)
    r = pull(b, "user-root.synthetic", node)
    r.lease.release()
    same_files(img, r.lease.path)
    assert r.fill.engine == "thaw-fetch" and r.fill.zero_chunks > 0
    # thaw-fetch reports what went to disk with O_DIRECT (whole pages only)
    assert (r.fill.direct_bytes > 0) == direct_io and r.fill.direct_bytes % 4096 == 0


def test_concurrent_pulls_download_once(settings, checkpoints, scratch):
    store_thaw(settings, "push", str(checkpoints["kv"]), "--key", "user-root.wl", "--no-cache")
    b = other_node(settings, scratch, "b")
    res = run_all([[str(REPO / ".venv/bin/thaw"), "pull", "user-root.wl", "--json"]] * 4, [cli_env(b)] * 4)
    assert all(rc == 0 for rc, _, _ in res), res
    outs = [json.loads(o) for _, o, _ in res]
    assert sum(not o["hit"] for o in outs) == 1
    assert len({o["path"] for o in outs}) == 1
    same_files(checkpoints["kv"], Path(outs[0]["path"]))


def test_conditional_put_has_one_winner(settings):
    store = Store(settings).for_tenant(TENANT)
    wins = []
    barrier = threading.Barrier(8)

    def put(i):
        barrier.wait()
        if store.put_manifest_if_absent("race", "f" * 64, f'{{"writer": {i}}}'.encode()):
            wins.append(i)
    ts = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert len(wins) == 1
    assert json.loads(store.get_manifest("race", "f" * 64)) == {"writer": wins[0]}


# -- faults ---------------------------------------------------------------------------

def test_store_unreachable_mid_download(name, checkpoints, node, scratch):
    own = seaweed.Seaweed(scratch / "seaweed").start()
    try:
        s = make_settings(own, name, scratch / "cache", **{"store.retries": 2, "store.timeout_s": 3})
        push(s, checkpoints["kv"], "user-root.wl-kv", node, cache=False)
        push(s, checkpoints["runtime"], "user-root.wl-rt", node, cache=False)
        b = other_node(s, scratch, "b")
        pull(b, "user-root.wl-rt", node).lease.release()              # something already cached: must survive
        killed = []

        def kill_store(_n):
            if not killed:
                killed.append(1)
                own.kill()
        with pytest.raises(StoreError) as e:
            pull(b, "user-root.wl-kv", node, progress=kill_store)
        assert killed and "127.0.0.1" in str(e.value)
        cache = images.open_cache(b)
        assert [x.key for x in cache.entries()] == ["user-root.wl-rt"]
        assert list((b.cache_dir / "tmp").iterdir()) == []
        same_files(checkpoints["runtime"], cache.entries()[0].path)
        # The store comes back (same data, new ports): the pull completes.
        own.start()
        b2 = dataclasses.replace(b, store_endpoint=own.endpoint)
        r = pull(b2, "user-root.wl-kv", node)
        r.lease.release()
        same_files(checkpoints["kv"], r.lease.path)
    finally:
        own.stop()


def test_chunk_altered_in_store(settings, checkpoints, node, scratch):
    r = push(settings, checkpoints["runtime"], "user-root.wl", node, cache=False)
    store = Store(settings).for_tenant(TENANT)
    m = images.remote_manifest(store, "user-root.wl", node)
    target = m.files[-1].chunks[len(m.files[-1].chunks) // 2]
    loc = m.locations[target.hash]
    name = store.pack_name(loc.pack)
    body = bytearray(store.client.get_object(Bucket=settings.store_bucket, Key=name)["Body"].read())
    body[loc.offset + loc.stored // 2] ^= 0x5A
    store.client.put_object(Bucket=settings.store_bucket, Key=name, Body=bytes(body))
    b = other_node(settings, scratch, "b")
    res = store_thaw(b, "pull", "user-root.wl", check=False)
    assert res.returncode == 65 and target.hash in res.stderr and "altered" in res.stderr
    assert f"offset {loc.offset}" in res.stderr
    cache = images.open_cache(b)
    assert cache.entries() == [] and list((b.cache_dir / "tmp").iterdir()) == []
    assert r.size == m.size


def test_fetch_checks_the_sha256_name_whatever_the_blake3_column_says(settings, checkpoints, node, scratch):
    """thaw-fetch checks every chunk against its SHA-256 name, the name the
    node trusts later (issue 14 item 6): a schema-2 manifest whose BLAKE3 for
    one chunk is wrong is fetched all the same (the bytes match their name;
    tests/integration/faults/test_store_faults.py has the converse, a wrong
    name with a right BLAKE3, refused), and so is the same image described by
    a manifest without BLAKE3 at all (schema 1 before tenants; schema 3 here)."""
    push(settings, checkpoints["runtime"], "user-root.wl", node, cache=False)
    store = Store(settings).for_tenant(TENANT)
    m = images.remote_manifest(store, "user-root.wl", node)
    name = store.manifest_name("user-root.wl", m.tuple_hash)
    good = json.loads(store.client.get_object(Bucket=settings.store_bucket, Key=name)["Body"].read())
    assert good["schema_version"] == 3 and good["tenant"] == TENANT
    target = good["files"][-1]["chunks"][0][0]
    bad = json.loads(json.dumps(good))
    for f in bad["files"]:
        for c in f["chunks"]:
            if c[0] == target:
                c[6] = "0" * 64
    store.client.put_object(Bucket=settings.store_bucket, Key=name, Body=json.dumps(bad).encode())
    b = other_node(settings, scratch, "b")
    r = pull(b, "user-root.wl", node)
    r.lease.release()
    assert r.fill.engine == "thaw-fetch"
    same_files(checkpoints["runtime"], r.lease.path)

    v1 = json.loads(json.dumps(good))   # no checks (schema 1 then; its tenant keeps it schema 3 here)
    del v1["chunking"]["check"]
    for f in v1["files"]:
        for c in f["chunks"]:
            c.pop()
    store.client.put_object(Bucket=settings.store_bucket, Key=name, Body=json.dumps(v1).encode())
    c = other_node(settings, scratch, "c")
    r = pull(c, "user-root.wl", node)
    r.lease.release()
    assert r.fill.engine == "thaw-fetch"
    same_files(checkpoints["runtime"], r.lease.path)


def test_chunk_altered_in_cache(settings, checkpoints, node, scratch):
    push(settings, checkpoints["runtime"], "user-root.wl", node, cache=False)
    r = pull(settings, "user-root.wl", node)
    r.lease.release()
    pages = r.lease.path / "pages.img"
    with open(pages, "r+b") as f:
        f.seek(12345)
        f.write(b"\xde\xad\xbe\xef")
    again = store_thaw_json(settings, "pull", "user-root.wl")
    assert again["hit"] is False and again["fill"]["fetched_chunks"] == 1
    assert any("corrupt" in n for n in again["notes"])
    same_files(checkpoints["runtime"], Path(again["path"]))
    # Silent corruption (mtime kept): only `thaw verify` sees it; it evicts, the next pull refetches.
    p = Path(again["path"]) / "pages.img"
    st = p.stat()
    with open(p, "r+b") as f:
        f.seek(777)
        b = f.read(1)
        f.seek(777)
        f.write(bytes([b[0] ^ 1]))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    v = store_thaw(settings, "verify", "--json", check=False)
    assert v.returncode == 65
    [row] = json.loads(v.stdout)
    assert row["ok"] is False and row["evicted"] is True and "pages.img" in row["problem"]
    last = store_thaw_json(settings, "pull", "user-root.wl")
    assert last["hit"] is False
    same_files(checkpoints["runtime"], Path(last["path"]))


@pytest.mark.parametrize("mode", ["download", "install"])
def test_kill9_then_nothing_partial_is_served_and_next_run_recovers(mode, settings, checkpoints, node, scratch):
    push(settings, checkpoints["kv"], "user-root.wl", node, cache=False)
    marker = scratch / "marker"
    over = {"store.endpoint": settings.store_endpoint, "store.bucket": settings.store_bucket,
            "store.credentials_file": str(settings.store_credentials_file), "cache.dir": str(settings.cache_dir),
            "runsc.path": str(settings.runsc_path), "store.workers": "4"}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "hang_pull.py"), json.dumps(over), "user-root.wl",
                             mode, str(marker)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "the pull never reached the hang point"
        time.sleep(0.05)
    fetchers = _children_named(proc.pid, "thaw-fetch")
    assert fetchers or mode == "install", "the download should be in thaw-fetch"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    # No orphan keeps writing into the partial entry: thaw-fetch dies with its parent (PR_SET_PDEATHSIG),
    # and a progress line into the closed pipe would end it too (SIGPIPE) unless it is stalled.
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in fetchers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() for pid in fetchers), "thaw-fetch outlived the pull"
    root = settings.cache_dir
    left = list((root / "tmp").iterdir()) if mode == "download" else list((root / "entries").iterdir())
    assert left, "the kill should have left something behind"
    cache = images.open_cache(settings)
    assert cache.entries() == []                                  # nothing servable
    assert store_thaw_json(settings, "ls", "--local")["local"] == []
    r = store_thaw_json(settings, "pull", "user-root.wl")                        # recovers
    assert r["hit"] is False and any("recovered" in n for n in r["notes"])
    assert not any(p.exists() for p in left)
    same_files(checkpoints["kv"], Path(r["path"]))
    assert all(row["ok"] for row in store_thaw_json(settings, "verify"))


@pytest.mark.parametrize("mode", ["upload", "install"])
def test_kill9_during_checkpoint_publish_leaves_nothing_served_and_is_reclaimed(mode, settings, checkpoints, node,
                                                                                scratch):
    """thawd's path: the image is written into a staged cache partial, published from there and
    renamed into entries/. Killed while uploading: no manifest in the store (it goes last), nothing
    servable, and `thaw gc` reclaims the partial (its writer is dead). Killed between the rename and
    the index row: published, nothing servable, and the next pull recovers and installs it."""
    marker = scratch / "marker"
    over = {"store.endpoint": settings.store_endpoint, "store.bucket": settings.store_bucket,
            "store.credentials_file": str(settings.store_credentials_file), "cache.dir": str(settings.cache_dir),
            "runsc.path": str(settings.runsc_path), "store.workers": "4"}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "hang_publish.py"), json.dumps(over),
                             str(checkpoints["kv"]), "user-root.wl", mode, str(marker)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "the publish never reached the hang point"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    root = settings.cache_dir
    left = list((root / "tmp").iterdir()) if mode == "upload" else list((root / "entries").iterdir())
    assert len(left) == 1 and (left[0] / "pages.img").is_file(), left
    assert images.open_cache(settings).entries() == []            # nothing servable
    assert store_thaw_json(settings, "ls", "--local")["local"] == []
    published = list(Store(settings).for_tenant(TENANT).list_manifests())
    if mode == "upload":
        assert published == []                                    # the manifest goes last
        gc = store_thaw_json(settings, "gc")
        assert gc["removed_partial_or_orphan"] == [str(left[0])] and not left[0].exists()
        res = store_thaw(settings, "pull", "user-root.wl", check=False)
        assert res.returncode != 0 and "not in the store" in res.stderr
    else:
        assert [k for k, _, _ in published] == ["user-root.wl"]
        r = store_thaw_json(settings, "pull", "user-root.wl")               # recovers, then fetches what was published
        assert r["hit"] is False and any("recovered" in n for n in r["notes"]) and not left[0].exists()
        same_files(checkpoints["kv"], Path(r["path"]))
    assert list((root / "tmp").iterdir()) == []


def _children_named(ppid: int, comm: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if name == comm and int(rest[1]) == ppid:
                out.append(int(d.name))
    return out


def test_budget_smaller_than_one_image(settings, checkpoints, node):
    out = push(settings, checkpoints["runtime"], "user-root.wl", node, cache=False)
    res = store_thaw(settings, "pull", "user-root.wl", "--budget", str(out.size - 1), check=False)
    assert res.returncode == 4 and "larger than the whole cache budget" in res.stderr
    cache = images.open_cache(settings)
    assert cache.entries() == [] and list((settings.cache_dir / "tmp").iterdir()) == []
    with pytest.raises(CacheFull):
        pull(dataclasses.replace(settings, cache_budget_bytes=out.size - 1), "user-root.wl", node)


def test_budget_evicts_lru_but_never_a_leased_entry(settings, checkpoints, node):
    a = push(settings, checkpoints["runtime"], "user-root.wl-a", node, cache=False)
    b = push(settings, checkpoints["kv"], "user-root.wl-b", node, cache=False)
    s = dataclasses.replace(settings, cache_budget_bytes=max(a.size, b.size) + 1024)
    held = pull(s, "user-root.wl-a", node).lease
    with pytest.raises(CacheFull, match="in use"):
        pull(s, "user-root.wl-b", node)
    assert [e.key for e in images.open_cache(s).entries()] == ["user-root.wl-a"]
    same_files(checkpoints["runtime"], held.path)
    held.release()
    pull(s, "user-root.wl-b", node).lease.release()
    assert [e.key for e in images.open_cache(s).entries()] == ["user-root.wl-b"]


def test_two_nodes_publish_the_same_key_at_once(settings, checkpoints, scratch):
    a, b = other_node(settings, scratch, "a"), other_node(settings, scratch, "b")
    res = run_all([[str(REPO / ".venv/bin/thaw"), "push", str(img), "--key", "user-root.wl", "--json"]
                   for img in (checkpoints["runtime"], checkpoints["kv"])], [cli_env(a), cli_env(b)])
    assert all(rc == 0 for rc, _, _ in res), res
    outs = [json.loads(o) for _, o, _ in res]
    assert sorted(o["published"] for o in outs) == [False, True]
    store = Store(settings).for_tenant(TENANT)
    [(key, th, _)] = list(store.list_manifests())
    winner = images.manifestmod.parse(store.get_manifest(key, th))
    for s in (a, b):
        cache = images.open_cache(s)
        [e] = cache.entries("user-root.wl")
        assert cache.manifest_of(e).files == winner.files
        assert cache.check_entry(e, full=True) is None
    src = checkpoints["runtime"] if outs[0]["published"] else checkpoints["kv"]
    same_files(src, images.open_cache(b).entries("user-root.wl")[0].path)


def _put_manifest(s, node, mutate) -> None:
    store = Store(s).for_tenant(TENANT)
    m = images.remote_manifest(store, "user-root.wl", node)
    d = json.loads(m.to_json())
    mutate(d)
    store.client.put_object(Bucket=s.store_bucket, Key=store.manifest_name("user-root.wl", m.tuple_hash),
                            Body=json.dumps(d).encode())


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.update(schema_version=4), "schema_version"),
    (lambda d: d["files"][0].update(name="../../escaped.img"), "files[0].name"),
    (lambda d: d["files"][1].update(size=d["files"][1]["size"] + 4096), "files[1].chunks"),
], ids=["schema-version", "path-traversal", "chunks-dont-add-up"])
def test_bad_manifest_is_refused_naming_the_field(mutate, field, settings, checkpoints, node, scratch):
    push(settings, checkpoints["runtime"], "user-root.wl", node, cache=False)
    _put_manifest(settings, node, mutate)
    b = other_node(settings, scratch, "b")
    with pytest.raises(ManifestError) as e:
        pull(b, "user-root.wl", node)
    assert e.value.field == field
    res = store_thaw(b, "pull", "user-root.wl", check=False)
    assert res.returncode == 2 and f"manifest field {field}" in res.stderr
    assert images.open_cache(b).entries() == []
    assert not (scratch / "escaped.img").exists() and not (b.cache_dir / "escaped.img").exists()


def test_tuple_mismatch_is_not_served_and_says_why(settings, checkpoints, node, scratch):
    store_thaw(settings, "push", str(checkpoints["runtime"]), "--key", "user-root.wl", "--machine-type", "h200-8x")
    b = other_node(settings, scratch, "b")
    res = store_thaw(b, "pull", "user-root.wl", "--machine-type", "a100-1x", check=False)
    assert res.returncode == 3
    assert "machine_type: image has 'h200-8x', node has 'a100-1x'" in res.stderr
    assert images.open_cache(b).entries() == []
    ls = store_thaw_json(b, "ls", "--machine-type", "a100-1x")
    assert ls["remote"][0]["match"] is False and "machine_type" in ls["remote"][0]["reasons"][0]
    # The node that pushed it (same machine type) has it cached, and it matches there.
    assert store_thaw_json(settings, "ls", "--local", "--machine-type", "h200-8x")["local"][0]["match"] is True
    with pytest.raises(TupleMismatch):
        pull(b, "user-root.wl", dataclasses.replace(node, machine_type="a100-1x"))


def test_cpu_feature_superset_restores_subset_does_not(settings, checkpoints, node, scratch):
    fewer = dataclasses.replace(node, cpu_features=node.cpu_features[1:])
    push(settings, checkpoints["runtime"], "user-root.wl", fewer, cache=False)
    b = other_node(settings, scratch, "b")
    r = pull(b, "user-root.wl", node)     # this node has every feature the image needs, and one more
    r.lease.release()
    c = other_node(settings, scratch, "c")
    with pytest.raises(TupleMismatch, match=f"lacks 1 CPU feature.*{node.cpu_features[1]}"):
        pull(c, "user-root.wl", dataclasses.replace(node, cpu_features=node.cpu_features[2:]))


def test_truncated_pack_is_a_clear_store_error(settings, checkpoints, node, scratch):
    push(settings, checkpoints["runtime"], "user-root.wl", node, cache=False)
    store = Store(settings).for_tenant(TENANT)
    m = images.remote_manifest(store, "user-root.wl", node)
    store.client.put_object(Bucket=settings.store_bucket, Key=store.pack_name(m.packs[0]), Body=b"\0" * 16)
    b = other_node(settings, scratch, "b")
    with pytest.raises(StoreError) as e:
        pull(b, "user-root.wl", node)
    assert m.packs[0] in str(e.value) and "does not match its manifest" in str(e.value)
    assert images.open_cache(b).entries() == [] and list((b.cache_dir / "tmp").iterdir()) == []
