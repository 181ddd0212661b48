"""A full file system, for real: a small tmpfs mounted where thaw writes.

- `thaw checkpoint` into it: one line naming the full file system (not a Go
  stack frame from runsc), exit 4, no partial image, the workload still runs
  and a checkpoint elsewhere works;
- `thaw pull` into a cache on it (thaw-fetch's writes fail): one line, exit 4,
  no half cache entry;
- `thaw restore --from-store` streaming into a cache on it (store.stream, the
  default): thaw-gofer's writes fail mid-stream; one line, exit 4 (NoSpace,
  as a pull), no sandbox left, no half cache entry.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BUILD
from tests.integration.conftest import THAW, copy_image, leftovers, settings_for, store_thaw, thaw_env
from tests.integration.faults.results import write_results


@pytest.fixture
def small_fs(name) -> Path:
    """A 24 MiB tmpfs, named after the test; unmounted after."""
    mnt = Path(f"/tmp/thaw-it-small/{name}")
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", f"thaw-{name}"[:60], str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    mnt.rmdir()


def _one_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("thaw: error: "), p.stderr
    assert "Traceback" not in p.stderr and ".go:" not in p.stderr, p.stderr
    return lines[0]


def _thaw(base: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(THAW), *args], env={**thaw_env(base), "THAW_CONFIG": "/dev/null"},
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_checkpoint_into_a_full_file_system(base: Path, name: str, small_fs: Path):
    sid = f"{name}-w"
    # ~48 MiB of sandbox memory (its /tmp is a tmpfs inside the sandbox): twice the small file system.
    run = _thaw(base, "run", "--id", sid, "--no-network", "--", "/bin/sh", "-c",
                "dd if=/dev/urandom of=/tmp/fill bs=1M count=48 2>/dev/null; touch /tmp/ready; exec sleep 3600")
    assert run.returncode == 0, run.stderr
    ready = subprocess.run([str(THAW), "health", sid, "--probe", "file:/tmp/ready", "--timeout", "60"],
                           env={**thaw_env(base), "THAW_CONFIG": "/dev/null"}, capture_output=True, text=True)
    assert ready.returncode == 0, ready.stderr
    t0 = time.monotonic()
    p = _thaw(base, "checkpoint", sid, "--out", str(small_fs / "image"))
    secs = time.monotonic() - t0
    line = _one_line(p)
    assert p.returncode == 4, p.stderr
    assert "no space left" in line and str(small_fs) in line and "still running" in line, line
    assert list(small_fs.iterdir()) == [], "nothing of the image is kept"
    ps = _thaw(base, "ps", "--json")
    assert [r["state"] for r in json.loads(ps.stdout) if r["id"] == sid] == ["running"], ps.stdout
    ok = _thaw(base, "checkpoint", sid, "--out", str(base / "image"), "--leave-running")   # room elsewhere: it works
    assert ok.returncode == 0, ok.stderr
    assert _thaw(base, "delete", sid, "--force").returncode == 0
    assert leftovers(settings_for(base), [sid]) == {}
    write_results("checkpoint-enospc", {"exit": p.returncode, "line": line, "seconds": round(secs, 3),
                                        "left_in_full_fs": 0, "workload_after": "running"})


def test_pull_into_a_full_cache(settings, checkpoints, scratch, small_fs):
    key = "user-root.full-thaw-fetch"   # the CLI's tenant (issue 13): keys carry it
    store_thaw(settings, "push", str(copy_image(checkpoints["kv"], scratch / "kv")), "--key", key, "--no-cache")
    cache = small_fs / "cache"
    env = {"THAW_CACHE_DIR": str(cache), "THAW_STORE_FETCHER": str(BUILD / "thaw-fetch")}
    p = store_thaw(settings, "pull", key, check=False, **env)
    line = _one_line(p)
    assert p.returncode == 4, p.stderr
    assert "no space left" in line and str(cache) in line, line
    ls = store_thaw(settings, "ls", "--local", "--json", **env)
    assert json.loads(ls.stdout)["local"] == [], "no half cache entry"
    partial = [q for q in (cache / "entries").iterdir()] + [q for q in (cache / "tmp").iterdir()]
    assert partial == [], partial
    write_results("pull-enospc-thaw-fetch", {"exit": p.returncode, "line": line, "cache_entries_after": 0})


def test_streamed_restore_into_a_full_cache(base: Path, name: str, settings, scratch, small_fs: Path):
    from tests.integration import streamed
    key = f"user-root.{name}"   # the CLI's tenant (issue 13)
    streamed.publish(streamed.env_for(base, settings), key, f"{name}-src", 64, scratch)   # a ~70 MB image
    cache = small_fs / "cache"
    env = streamed.env_for(base, dataclasses.replace(settings, cache_dir=cache))   # store.stream: the default
    p = streamed.run(env, "restore", "--from-store", key, "--id", f"{name}-r")
    line = _one_line(p)
    assert p.returncode == 4, p.stderr
    assert "no space left" in line and str(cache) in line, line
    ls = streamed.run(env, "ls", "--local", "--json")
    assert ls.returncode == 0 and json.loads(ls.stdout)["local"] == [], "no half cache entry"
    assert streamed.cache_state(cache, key) == {"ready": [], "partials": [], "streams": []}
    assert list((cache / "entries").iterdir()) == [] and list((cache / "tmp").iterdir()) == []
    ps = streamed.run(env, "ps", "--json")
    assert f"{name}-r" not in [r["id"] for r in json.loads(ps.stdout)], ps.stdout
    write_results("stream-enospc", {"exit": p.returncode, "line": line, "cache_entries_after": 0})
