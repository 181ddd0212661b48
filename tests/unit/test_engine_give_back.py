"""Engine.checkpoint gives a workload that serves on what its pre-checkpoint hooks took:
the profile's post-restore hooks run on it after the save (pytorch-offload's weights
back on the GPU, vLLM awake), and after a failed save; not on one that is stopped.
A fake runsc (a test of the engine alone); the workload is a real HTTP server on loopback."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from control import config
from control.errors import CheckpointFailed, RunscError
from control.lifecycle.engine import Engine, Handle
from tests.unit.test_profiles import Workload


class _Runsc:
    """checkpoint writes checkpoint.img (or fails with exit 128); state says running."""

    def __init__(self, fail: bool = False):
        self.fail, self.calls = fail, []

    def memory_usage(self, cid):
        return 1 << 20

    def checkpoint(self, cid, opts, timeout_s=None, timeout_key=None):
        self.calls.append(("checkpoint", opts.leave_running))
        if self.fail:
            raise RunscError(["runsc", "checkpoint", cid], 128, "", "checkpoint failed: injected", "checkpoint")
        opts.image_path.mkdir()
        (opts.image_path / "checkpoint.img").write_bytes(b"x" * 64)

    def state(self, cid):
        return type("State", (), {"status": "running"})()

    def kill(self, cid, sig, all_processes=False):
        self.calls.append(("kill", int(sig)))


def _handle(tmp_path: Path, r: _Runsc, profile: str, port: int) -> Handle:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "process": {"args": ["/app/server"], "env": []}, "root": {"path": "rootfs"},
        "annotations": {"thaw.dev/profile": profile, "thaw.dev/profile-port": str(port)}}))
    return Handle("t-give-back", r, bundle, address="127.0.0.1")


def _settings():
    return config.load(environ={})


@pytest.mark.parametrize("profile,pre,back", [
    ("pytorch-offload", ["/thaw/pre-checkpoint", "/thaw/offload-weights"], ["/thaw/restore-weights"]),
    ("vllm", ["/sleep?level=1"], ["/wake_up"]),
    ("pytorch", ["/thaw/pre-checkpoint"], []),
])
def test_a_workload_left_running_gets_back_what_its_pre_checkpoint_hooks_took(tmp_path, profile, pre, back):
    with Workload() as w:
        saved = Engine(_settings()).checkpoint(_handle(tmp_path, _Runsc(), profile, w.port), tmp_path / "img")
    assert [p for _, p in w.requests] == pre + back
    assert [h["hook"].split("/", 1)[1] for h in saved.hooks] == [p.lstrip("/") for p in pre]


@pytest.mark.parametrize("kw", [{"stop_after": True}, {"stays": False}])
def test_a_workload_stopped_after_its_save_gets_nothing_back(tmp_path, kw):
    # stays=False: the CLI's `thaw checkpoint` without --leave-running deletes the sandbox itself.
    with Workload() as w:
        Engine(_settings()).checkpoint(_handle(tmp_path, _Runsc(), "pytorch-offload", w.port), tmp_path / "img", **kw)
    assert [p for _, p in w.requests] == ["/thaw/pre-checkpoint", "/thaw/offload-weights"]


def test_a_failed_save_gives_the_weights_back_and_still_fails(tmp_path):
    with Workload() as w:
        with pytest.raises(CheckpointFailed, match="injected"):
            Engine(_settings()).checkpoint(_handle(tmp_path, _Runsc(fail=True), "pytorch-offload", w.port),
                                           tmp_path / "img")
    assert [p for _, p in w.requests] == ["/thaw/pre-checkpoint", "/thaw/offload-weights", "/thaw/restore-weights"]
    assert not (tmp_path / "img").exists()


def test_a_give_back_that_fails_is_logged_and_the_image_stands(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="control.lifecycle.engine")
    with Workload({"/thaw/restore-weights": (500, '{"error": "out of memory"}')}) as w:
        saved = Engine(_settings()).checkpoint(_handle(tmp_path, _Runsc(), "pytorch-offload", w.port),
                                               tmp_path / "img")
    assert saved.files == {"checkpoint.img": 64}
    assert [p for _, p in w.requests][-1] == "/thaw/restore-weights"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("t-give-back: it was checkpointed and serves on, but its post-restore hooks failed" in m
               and "HTTP 500" in m for m in warned), warned


def test_a_bundle_gone_at_give_back_is_logged_not_raised(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="control.lifecycle.engine")
    h = Handle("t-give-back", _Runsc(), tmp_path / "no-bundle")
    assert Engine(_settings()).give_back(h, "it serves on") == []
    assert any("t-give-back: it serves on, but its post-restore hooks failed" in r.getMessage()
               for r in caplog.records)
