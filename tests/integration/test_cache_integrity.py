"""A changed byte in the node cache never reaches a restored sandbox (issue 30).

Real runsc, real thaw-gofer, SeaweedFS: a runsc checkpoint of a server holding
64 MB of seeded random bytes is published, pulled into a node cache, and then
8 bytes of a cached file are flipped with the file's mtime put back (what the
issue reproduced: `thaw restore --from-store` exited 0 with the server's memory
wrong). The cheap check now sees that write (its ctime). Bit rot, or a write
below the file system, leaves no such trace: `rot` flips the bytes and then
re-records the entry's inode data in the cache index, so only hashing can tell.
A restore from that entry reads it through thaw-gofer, every chunk checked as
it is read: it must fail with one line (exit 65) or, with --cold-fallback,
start cold with reason `corrupt`; the entry must not stay ready, and the next
restore must fetch it again and hand back exactly the checkpoint's memory."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from tests.conftest import BUILD, require
from tests.integration.conftest import leftovers

from . import streamed

MB = 64


@pytest.fixture
def published(base, name, settings, scratch):
    require((BUILD / "thaw-gofer").is_file(), f"thaw-gofer built at {BUILD / 'thaw-gofer'} (ci/build-go.sh)")
    key = f"user-root.{name}"
    env = streamed.env_for(base, settings)
    before = streamed.publish(env, key, f"{name}-src", MB, scratch)
    r = streamed.run(env, "pull", key, "--json")
    assert r.returncode == 0, r.stderr
    return key, env, before, Path(json.loads(r.stdout)["path"])


def flip(path: Path, offset: int, n: int = 8) -> None:
    """Flip n bytes of `path` at `offset` and put its mtime back."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        data = bytearray(f.read(n))
        f.seek(offset)
        f.write(bytes(b ^ 0xff for b in data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def rot(cache_dir: Path, path: Path, offset: int) -> None:
    """flip, and the entry's snapshot re-recorded: a change no stat() can see (bit rot)."""
    flip(path, offset)
    eid = path.parent.name
    db = sqlite3.connect(cache_dir / "index.sqlite")
    try:
        snap = json.loads(db.execute("SELECT snapshot FROM entries WHERE id = ?", (eid,)).fetchone()[0])
        st = path.stat()
        snap[path.name] = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_nlink]
        db.execute("UPDATE entries SET snapshot = ? WHERE id = ?", (json.dumps(snap), eid))
        db.commit()
    finally:
        db.close()


def states(cache_dir: Path, key: str) -> list[str]:
    db = sqlite3.connect(cache_dir / "index.sqlite")
    try:
        return [r[0] for r in db.execute("SELECT state FROM entries WHERE key = ?", (key,))]
    finally:
        db.close()


def test_a_flipped_byte_in_cached_pages_fails_the_restore_and_the_entry_is_fetched_again(
        base, name, settings, published):
    key, env, before, entry = published
    pages = entry / "pages.img"
    rot(settings.cache_dir, pages, pages.stat().st_size // 2)
    r = streamed.run(env, "restore", "--from-store", key, "--id", f"{name}-r")
    assert r.returncode == 65, (r.returncode, r.stderr)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("thaw: error: ")]
    assert len(errors) == 1, r.stderr
    line = errors[0]
    assert len(line) < 1000 and "goroutine" not in r.stderr, r.stderr
    assert "pages.img" in line and "corrupt" in line, line
    assert "ready" not in states(settings.cache_dir, key), states(settings.cache_dir, key)
    assert leftovers(settings, [f"{name}-r"]) == {}
    assert not list((settings.cache_dir / "views").glob("*")), "a view outlived its restore"

    # The next restore fetches the image again and restores exactly the checkpoint's memory.
    r = streamed.run(env, "restore", "--from-store", key, "--id", f"{name}-s", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["source"] in ("stream", "pull"), r.stdout
    host = before["host"]
    assert streamed.get(host, "/ping")["boot"] == before["boot"]
    assert streamed.get(host, "/sum", 120)["digest"] == before["digest"]
    assert streamed.run(env, "delete", f"{name}-s", "--force").returncode == 0
    # ... and the entry it installed restores from the cache, checked, with the same memory.
    r = streamed.run(env, "restore", "--from-store", key, "--id", f"{name}-t", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["source"] == "cache", r.stderr
    assert streamed.get(host, "/sum", 120)["digest"] == before["digest"]
    assert streamed.run(env, "delete", f"{name}-t", "--force").returncode == 0


def test_a_flipped_byte_in_cached_checkpoint_img_starts_cold_with_reason_corrupt(
        base, name, settings, published):
    key, env, before, entry = published
    state = entry / "checkpoint.img"
    rot(settings.cache_dir, state, min(4096, state.stat().st_size // 3))
    r = streamed.run(env, "restore", "--from-store", key, "--id", f"{name}-r", "--cold-fallback", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["mode"] == "cold" and out["fallback_reason"].startswith("corrupt: "), out
    assert "checkpoint.img" in out["fallback_reason"] and len(out["fallback_reason"]) < 1000, out
    assert streamed.first_answer(before["host"], 120)[0]["boot"] != before["boot"]   # cold: a new process
    assert "ready" not in states(settings.cache_dir, key)
    assert streamed.run(env, "delete", f"{name}-r", "--force").returncode == 0


def test_pull_does_not_call_an_altered_entry_ready(base, name, settings, published):
    """`thaw pull` of a ready entry: the cheap check sees a write with its mtime put back (its
    ctime), and the pull fetches only what is damaged; an entry that rotted without a trace
    is re-hashed once its last full check is older than cache.scrub_interval_s."""
    key, env, before, entry = published
    flip(entry / "pages.img", 1 << 20)
    r = streamed.run(env, "pull", key, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["hit"] is False and any("corrupt" in n for n in out["notes"]), out
    assert out["fill"]["fetched_chunks"] <= 2, out["fill"]
    assert states(settings.cache_dir, key) == ["ready"]

    fresh = Path(out["path"])
    rot(settings.cache_dir, fresh / "pages.img", 3 << 20)
    r = streamed.run(env, "pull", key, "--json")   # checked at install, within the interval: trusted
    assert r.returncode == 0 and json.loads(r.stdout)["hit"] is True, r.stderr
    time.sleep(1.5)   # the entry's last full check (its install) is now older than the interval below
    r = streamed.run(env | {"THAW_CACHE_SCRUB_INTERVAL_S": "1"}, "pull", key, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["hit"] is False and out["fill"]["fetched_chunks"] <= 2, out
    assert states(settings.cache_dir, key) == ["ready"]


def test_restore_of_a_pulled_entry_directory_is_checked_too(base, name, settings, published):
    """`thaw pull` then `thaw restore DIR` (the entry the pull printed): read through thaw-gofer
    as a cache hit is; an intact one restores, an altered one is exit 65 and marked corrupt."""
    key, env, before, entry = published
    r = streamed.run(env, "restore", str(entry), "--id", f"{name}-a", "--json")
    assert r.returncode == 0, r.stderr
    assert streamed.get(before["host"], "/sum", 120)["digest"] == before["digest"]
    assert streamed.run(env, "delete", f"{name}-a", "--force").returncode == 0
    pages = entry / "pages.img"
    rot(settings.cache_dir, pages, pages.stat().st_size // 3)
    r = streamed.run(env, "restore", str(entry), "--id", f"{name}-b")
    assert r.returncode == 65, (r.returncode, r.stderr)
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("thaw: error: ")]
    assert "pages.img" in line and str(entry) in line and "marked corrupt" in line, line
    assert states(settings.cache_dir, key) == ["corrupt"]
    assert leftovers(settings, [f"{name}-b"]) == {}
