"""run -> checkpoint -> restore against real runsc (systrap) and real netns."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from control.dev import demo
from control.errors import AlreadyExists, ImageError, NotFound, RunscError
from control.lifecycle.image_meta import IMAGE_META
from control.lifecycle.sandbox import Sandboxes

from tests.integration.conftest import THAW, leftovers, settings_for, thaw_env

MODEL_MB = 8  # a small demo model: the tests check behaviour, not speed


def start_server(sb: Sandboxes, sid: str) -> tuple[str, dict]:
    sb.run(sid, demo.demo_spec(sb.settings, sid, MODEL_MB))
    host = sb.address(sid)
    answer, _ = demo.first_answer(host, 180)
    return host, answer


def test_restored_process_continues_from_saved_state(base, name):
    sb = Sandboxes(settings_for(base))
    cold, warm = f"{name}-a", f"{name}-b"
    host, first = start_server(sb, cold)
    for _ in range(3):
        demo.http_json(host, "POST", "/infer", demo.PROMPT)
    before = demo.http_json(host, "GET", "/state")
    assert before["requests"] == 4

    res = sb.checkpoint(cold, base / "image")
    assert res.image_bytes > 1 << 20
    assert sorted(p.name for p in (base / "image").iterdir()) == sorted(
        ["checkpoint.img", "pages.img", "pages_meta.img", IMAGE_META])
    # The checkpointed sandbox is gone: restore happens under a fresh id after the original is removed.
    assert leftovers(sb.settings, [cold]) == {}

    rs = sb.restore(base / "image", warm)
    assert rs.sandbox_ip == host  # the same in-sandbox address as at checkpoint
    answer, _ = demo.first_answer(host, 60)
    after = demo.http_json(host, "GET", "/state")
    assert after["boot_id"] == before["boot_id"]          # not a fresh start
    assert answer["request"] == 5 and after["requests"] == 5  # the counter continues
    assert after["model_digest"] == before["model_digest"]
    assert (answer["text"], answer["score"]) == (first["text"], first["score"])
    assert [r["id"] for r in sb.ps() if r["state"] == "running"] == [warm]

    sb.delete(warm, force=True)
    assert leftovers(sb.settings, [cold, warm]) == {}


@pytest.fixture
def image(base, name):
    """A real checkpoint image of the demo server (its sandbox already removed)."""
    sb = Sandboxes(settings_for(base))
    start_server(sb, f"{name}-src")
    sb.checkpoint(f"{name}-src", base / "image")
    return base / "image"


def test_restore_from_truncated_image_fails_cleanly(base, name, image):
    sb = Sandboxes(settings_for(base))
    bad = base / "truncated"
    shutil.copytree(image, bad)
    with open(bad / "pages.img", "r+b") as f:
        f.truncate((bad / "pages.img").stat().st_size // 2)
    with pytest.raises(ImageError, match="pages.img is .* bytes"):
        sb.restore(bad, f"{name}-t1")
    assert leftovers(sb.settings, [f"{name}-t1"]) == {}

    # Past thaw's own size check (sizes rewritten): runsc itself must fail, and
    # the failed restore must leave no container, netns, bundle or record.
    meta = json.loads((bad / IMAGE_META).read_text())
    meta["files"]["pages.img"] = (bad / "pages.img").stat().st_size
    (bad / IMAGE_META).write_text(json.dumps(meta))
    with pytest.raises(RunscError) as e:
        sb.restore(bad, f"{name}-t2")
    assert "restore" in str(e.value) and e.value.runsc_message
    assert leftovers(sb.settings, [f"{name}-t2"]) == {}

    # The intact image still restores after those failures.
    sb.restore(image, f"{name}-ok")
    sb.delete(f"{name}-ok", force=True)


def test_restore_from_missing_or_foreign_image(base, name):
    sb = Sandboxes(settings_for(base))
    with pytest.raises(ImageError, match="no such directory"):
        sb.restore(base / "nope", f"{name}-x")
    (base / "foreign").mkdir()
    (base / "foreign" / "checkpoint.img").write_bytes(b"x")
    with pytest.raises(ImageError, match="thaw.json is missing"):
        sb.restore(base / "foreign", f"{name}-x")
    assert leftovers(sb.settings, [f"{name}-x"]) == {}


def test_checkpoint_of_missing_container_leaves_nothing(base, name):
    sb = Sandboxes(settings_for(base))
    with pytest.raises(NotFound):
        sb.checkpoint(f"{name}-ghost", base / "img")
    assert not list(base.glob("*img*"))


def test_checkpoint_refuses_existing_directory_and_keeps_sandbox(base, name):
    sb = Sandboxes(settings_for(base))
    sid = f"{name}-s"
    host, _ = start_server(sb, sid)
    (base / "taken").mkdir()
    with pytest.raises(AlreadyExists):
        sb.checkpoint(sid, base / "taken")
    demo.http_json(host, "GET", "/health")  # still serving
    sb.delete(sid, force=True)
    assert leftovers(sb.settings, [sid]) == {}


def thaw(base: Path, *args: str, user: str | None = None) -> subprocess.CompletedProcess:
    argv = [str(THAW), *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, env=thaw_env(base), capture_output=True, text=True, timeout=300)


def test_cli_errors_are_clear(base, name):
    p = thaw(base, "checkpoint", f"{name}-nope", "--out", str(base / "x"))
    assert p.returncode == 2 and f"sandbox '{name}-nope' not found" in p.stderr
    env_runsc = thaw(base, "--runsc", "/nonexistent/runsc", "ps")
    assert env_runsc.returncode == 69 and "runsc not found at /nonexistent/runsc" in env_runsc.stderr
    nonroot = thaw(base, "ps", user="65534")
    assert nonroot.returncode == 69 and "needs root" in nonroot.stderr
    (base / "img").mkdir()
    (base / "img" / "thaw.json").write_text("{}")
    p = thaw(base, "restore", str(base / "img"), "--id", f"{name}-r")
    assert p.returncode == 2 and "unknown version" in p.stderr
    p = thaw(base, "restore", str(base / "img"), "--id", "bad/id")
    assert p.returncode == 2 and "invalid" in p.stderr


def test_cli_run_checkpoint_restore_ps_json(base, name):
    sid, rid = f"{name}-c", f"{name}-r"
    p = thaw(base, "run", "--id", sid, "--json", "--bind", str(demo.WORKLOAD.parent), "--bind",
             str(THAW.parent.parent), "--bind", sys.base_prefix, "--env", f"THAW_DEMO_MODEL_MB={MODEL_MB}", "--",
             str(THAW.parent / "python"), str(demo.WORKLOAD))
    assert p.returncode == 0, p.stderr
    host = json.loads(p.stdout)["address"]
    demo.first_answer(host, 180)
    (base / "taken").mkdir()
    p = thaw(base, "checkpoint", sid, "--out", str(base / "taken"))
    assert p.returncode == 2 and "already exists" in p.stderr
    p = thaw(base, "checkpoint", sid, "--out", str(base / "img"), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["image_bytes"] > 0
    p = thaw(base, "restore", str(base / "img"), "--id", rid, "--json")
    assert p.returncode == 0, p.stderr
    assert demo.http_json(host, "GET", "/state")["requests"] == 1
    rows = json.loads(thaw(base, "ps", "--json").stdout)
    assert [(r["id"], r["state"], r["runsc_status"]) for r in rows] == [(rid, "running", "running")]
    assert thaw(base, "delete", rid).returncode == 2  # running: needs --force
    assert thaw(base, "delete", rid, "--force").returncode == 0
    assert json.loads(thaw(base, "ps", "--json").stdout) == []


def test_demo_json_verifies_restored_state(base):
    p = thaw(base, "demo", "--json", "--model-mb", "16")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["verified"] is True and all(r["checks"].values())
    for k in ("cold_start_s", "checkpoint_s", "image_bytes", "restore_s", "speedup"):
        assert r[k] > 0, k
    assert not list((base / "state" / "demo").glob("image-*"))  # image removed without --keep
    assert json.loads(thaw(base, "ps", "--json").stdout) == []
