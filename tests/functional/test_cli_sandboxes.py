"""thaw's CLI sandboxes against a fake runsc (tests/functional/fake_runsc.py), the
real thaw-monitor and CUDA helper binaries, and a fake node with GPUs (NVML
facts and a CDI registry from tests/unit/test_gpus.py): GPU injection at run,
the helper at checkpoint, re-injection at restore with its refusals before
runsc runs, cold fallback with the re-injected GPUs, the workload's log and
exit status, a failed checkpoint that keeps the workload, and a push that
refuses a node-local image. The same paths with real runsc (no GPU) are in
tests/integration/test_cli_lifecycle.py."""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from control import config
from control.errors import CheckpointFailed, ImageError, PreconditionError, exit_code
from control.lifecycle import logs as logsmod
from control.lifecycle.image_meta import IMAGE_META
from control.lifecycle.sandbox import Sandboxes, runsc_id
from nvproxy import cdi, helper
from runsc_hooks import spec as specmod

from tests.conftest import BUILD
from tests.unit.test_cdi import DRIVER
from tests.unit.test_gpus import H200, devices

FAKE = Path(__file__).with_name("fake_runsc.py")


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node: a bin dir with the fake runsc beside the real thaw-monitor and
    CUDA helper, and settings confined to tmp_path."""
    for b in ("thaw-monitor", "thaw-cuda-checkpoint"):
        assert os.access(BUILD / b, os.X_OK), f"{BUILD / b} not built: run `make setup`"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    runsc = bindir / "runsc"
    runsc.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    runsc.chmod(0o755)
    for b in ("thaw-monitor", "thaw-cuda-checkpoint"):
        shutil.copy2(BUILD / b, bindir / b)
    env = {"THAW_RUNSC_PATH": str(runsc), "THAW_RUNSC_ROOT": str(tmp_path / "root"),
           "THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_NODE_LOG_DIR": str(tmp_path / "log"),
           "THAW_NODE_LOG_MAX_BYTES": "64k", "THAW_CONFIG": "/dev/null"}
    monkeypatch.setattr(os, "geteuid", lambda: 0)   # runsc refuses --rootless; the fake does not care
    yield env
    sb = Sandboxes(config.load(environ=env))
    for rec in sb.list_records():
        sb.delete(rec.id, force=True)


def sandboxes(env: dict, n_gpus: int = 2, tmp: Path | None = None) -> Sandboxes:
    sb = Sandboxes(config.load(environ=env))
    sb.devices = lambda: devices(tmp or Path(env["THAW_NODE_STATE_DIR"]).parent, n=n_gpus)
    return sb


def argvs(env: dict) -> list[list[str]]:
    p = Path(env["THAW_RUNSC_ROOT"]) / "fake" / "argv.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def calls(env: dict, cmd: str, cid: str) -> list[list[str]]:
    return [a for a in argvs(env) if cmd in a and a[-1] == cid]


def server_spec(tmp_path: Path, sid: str, **kw) -> dict:
    return specmod.command_spec(["/bin/sleep", "infinity"], rootfs=str(tmp_path / "rootfs" / sid), **kw)


def bundle_spec(sb: Sandboxes, sid: str) -> dict:
    return specmod.Bundle(sb.bundles_dir / sid).load()


def wait_for(cond, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def log_text(sb: Sandboxes, sid: str) -> str:
    return logsmod.SandboxLogs.of(sb.settings, sid).tail()[0].decode()


def test_gpu_sandbox_run_checkpoint_restore_onto_another_gpu(node, tmp_path):
    sb = sandboxes(node)
    (tmp_path / "rootfs" / "web").mkdir(parents=True)
    rec = sb.run("web", server_spec(tmp_path, "web"), network=False, gpus=("nvidia.com/gpu=0",))
    assert rec.gpus == ["nvidia.com/gpu=0"] and rec.nvproxy
    sp = bundle_spec(sb, "web")
    assert cdi.gpu_nodes(sp) == ["/dev/nvidia0"]
    assert [m["source"] for m in sp["mounts"] if m["destination"] == helper.HELPER_DIR] == \
        [str(sb.settings.state_dir / "cuda-helper")]
    [create] = calls(node, "create", "web+")
    assert "--nvproxy=true" in create and any(a.startswith("--log=") for a in create)
    wait_for(lambda: "web+: on stderr" in log_text(sb, "web"), what="the workload's output in its log")

    img = tmp_path / "img"
    sb.checkpoint("web", img, leave_running=True)
    [ck] = calls(node, "checkpoint", "web+")
    assert f"--cuda-checkpoint-path={helper.HELPER_PATH}" in ck and "--leave-running" in ck
    meta = json.loads((img / IMAGE_META).read_text())
    assert meta["nvproxy"] is True
    assert meta["gpu"] == {"count": 1, "product": H200, "driver_version": DRIVER, "indexes": [0],
                           "devices": ["nvidia.com/gpu=0"]}

    # Onto GPU 1, the one the user assigns now.
    r2 = sb.restore(img, "web-2", gpus=["nvidia.com/gpu=1"])
    assert r2.id == "web-2" and sb.get("web-2").gpus == ["nvidia.com/gpu=1"]
    assert cdi.gpu_nodes(bundle_spec(sb, "web-2")) == ["/dev/nvidia1"]
    [rs] = calls(node, "restore", "web-2+")
    assert "--nvproxy=true" in rs and f"--image-path={img}" in rs
    wait_for(lambda: "web-2+: hello" in log_text(sb, "web-2"), what="the restored workload's output")
    # Without --gpus: the indexes it was saved on.
    sb.restore(img, "web-3")
    assert cdi.gpu_nodes(bundle_spec(sb, "web-3")) == ["/dev/nvidia0"]

    # Refused before runsc runs, nothing left behind.
    with pytest.raises(ImageError, match=r"needs 1 GPU\(s\) .*--gpus 0,1 assigns 2"):
        sb.restore(img, "web-4", gpus=["nvidia.com/gpu=0", "nvidia.com/gpu=1"])
    no_gpu = sandboxes(node, n_gpus=0)
    with pytest.raises(PreconditionError, match="this node has no NVIDIA GPU"):
        no_gpu.restore(img, "web-5")
    assert not calls(node, "restore", "web-4+") and not calls(node, "restore", "web-5+")
    assert sb.get("web-4") is None and not (sb.bundles_dir / "web-4").exists()
    assert not logsmod.SandboxLogs.of(sb.settings, "web-4").dir.exists()

    # --cold-fallback: the restore is refused, the cold start gets the GPUs asked for.
    res = sb.warm_start(img, "web-6", gpus=["nvidia.com/gpu=0", "nvidia.com/gpu=1"])
    assert res.mode == "cold" and "ImageError" in res.fallback_reason
    assert cdi.gpu_nodes(bundle_spec(sb, "web-6")) == ["/dev/nvidia0", "/dev/nvidia1"]
    assert calls(node, "create", "web-6+") and not calls(node, "restore", "web-6+")

    rows = {r["id"]: r for r in sb.ps()}
    assert {k: (r["state"], r["gpus"]) for k, r in rows.items()} == {
        "web": ("running", ["nvidia.com/gpu=0"]), "web-2": ("running", ["nvidia.com/gpu=1"]),
        "web-3": ("running", ["nvidia.com/gpu=0"]),
        "web-6": ("running", ["nvidia.com/gpu=0", "nvidia.com/gpu=1"])}


def test_bundle_cdi_annotations_are_injected(node, tmp_path):
    sb = sandboxes(node)
    (tmp_path / "rootfs" / "b").mkdir(parents=True)
    sp = server_spec(tmp_path, "b", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    rec = sb.run("b", sp, network=False)
    assert rec.gpus == ["nvidia.com/gpu=1"] and cdi.gpu_nodes(bundle_spec(sb, "b")) == ["/dev/nvidia1"]
    assert any(m["destination"] == helper.HELPER_DIR for m in bundle_spec(sb, "b")["mounts"])


def test_a_crashed_workload_is_stopped_with_its_exit_status(node, tmp_path):
    sb = sandboxes(node)
    (tmp_path / "rootfs" / "c").mkdir(parents=True)
    rec = sb.run("c", server_spec(tmp_path, "c"), network=False)
    files = logsmod.SandboxLogs.of(sb.settings, "c")
    assert logsmod.monitor_alive(rec.monitor)
    runner = CliRunner()
    follower: dict = {}

    def follow():
        follower["r"] = runner.invoke(_main(), ["logs", "c", "--follow"], env=node)
    t = threading.Thread(target=follow)
    t.start()
    time.sleep(0.5)
    (Path(node["THAW_RUNSC_ROOT"]) / "fake" / "c+.crash").write_text("3")
    t.join(20)
    assert not t.is_alive(), "thaw logs --follow did not end when the workload exited"
    assert "c+: hello" in follower["r"].stdout and "exiting 3" in follower["r"].stdout
    assert "the workload exited: exit status 3" in follower["r"].stderr

    ex = wait_for(files.exit, what="exit.json")
    assert (ex.status, ex.error) == (3, "")
    [row] = sb.ps()
    assert (row["state"], row["exit_status"], row["exit"]) == ("stopped", 3, "exit status 3")
    r = runner.invoke(_main(), ["health", "c"], env=node)
    assert r.exit_code == 1
    assert r.stdout.strip() == "c: NOT READY: the workload exited (exit status 3); `thaw logs c` has its output"
    r = runner.invoke(_main(), ["logs", "c", "--tail", "1"], env=node)
    assert r.exit_code == 0 and r.stdout == "fake workload c+: exiting 3\n"

    sb.delete("c")
    assert not files.dir.exists() and not logsmod.monitor_alive(rec.monitor)


def test_delete_kills_and_records_the_signal(node, tmp_path):
    sb = sandboxes(node)
    (tmp_path / "rootfs" / "k").mkdir(parents=True)
    rec = sb.run("k", server_spec(tmp_path, "k"), network=False)
    sb.runsc("none").kill(runsc_id("k"), 9, all_processes=True)
    ex = wait_for(logsmod.SandboxLogs.of(sb.settings, "k").exit, what="exit.json")
    assert ex.status == 137 and ex.describe() == "exit status 137 (killed by SIGKILL)"
    sb.delete("k", force=True)
    assert not logsmod.monitor_alive(rec.monitor)


def test_a_failed_checkpoint_keeps_the_workload_and_says_so_in_one_line(node, tmp_path, monkeypatch):
    sb = sandboxes(node)
    (tmp_path / "rootfs" / "f").mkdir(parents=True)
    sb.run("f", server_spec(tmp_path, "f"), network=False)
    monkeypatch.setenv("FAKE_RUNSC_CHECKPOINT_FAIL", "writing pages.img: write /x: no space left on device")
    out = tmp_path / "images"
    out.mkdir()
    with pytest.raises(CheckpointFailed) as ei:
        sb.checkpoint("f", out / "img")
    e = ei.value
    assert exit_code(e) == 4 and e.workload == "running" and "\n" not in str(e)   # no room
    assert f"no space left on the file system of {out}: " in str(e)
    assert "runsc checkpoint failed (exit 128): writing pages.img: write /x: no space left on device" in str(e)
    assert list(out.iterdir()) == []
    [row] = sb.ps()
    assert row["state"] == "running" and sb.get("f").owner is None
    r = CliRunner().invoke(_main(), ["checkpoint", "f", "--out", str(out / "img2")],
                           env={**node, "FAKE_RUNSC_CHECKPOINT_FAIL": "the driver said no"})
    assert r.exit_code == 73
    [line] = [x for x in r.stderr.splitlines() if not x.startswith("  checkpoint f -> ")]   # past the progress
    assert line == ("thaw: error: checkpoint of f failed: runsc checkpoint failed (exit 128): the driver said no"
                    " (the workload is still running; no image was kept)")


def test_a_failed_gpu_checkpoint_toggles_cuda_back(node, tmp_path, monkeypatch):
    """runsc leaves CUDA processes checkpointed after a failed save (SaveWithOpts
    returns before PostResume): the engine toggles them back with the helper."""
    sb = sandboxes(node)
    (tmp_path / "rootfs" / "g").mkdir(parents=True)
    sb.run("g", server_spec(tmp_path, "g"), network=False, gpus=("nvidia.com/gpu=0",))
    monkeypatch.setenv("FAKE_RUNSC_CHECKPOINT_FAIL", "no space left on device")
    monkeypatch.setenv("FAKE_CUDA_STATES", json.dumps({"7": "checkpointed"}))
    with pytest.raises(CheckpointFailed) as ei:
        sb.checkpoint("g", tmp_path / "img")
    assert "CUDA state of pid(s) 7 restored" in str(ei.value) and ei.value.workload == "running"
    execs = [a[a.index("exec") + 2:] for a in argvs(node) if "exec" in a]
    assert [helper.HELPER_PATH, "--toggle", "--pid", "7"] in execs
    assert [helper.HELPER_PATH, "--get-state", "--pid", "1"] in execs          # asked, not a CUDA process
    assert [helper.HELPER_PATH, "--toggle", "--pid", "1"] not in execs


def test_push_refuses_an_image_that_needs_this_node(node, tmp_path):
    img = tmp_path / "img"
    img.mkdir()
    (img / "checkpoint.img").write_bytes(b"x")
    sp = specmod.command_spec(["/srv/app/run"], rootfs="/srv/bundle/rootfs",
                              extra_mounts=[specmod.bind_mount("/srv/models", "/models")])
    meta = {"version": 1, "spec": sp, "network": "none", "files": {"checkpoint.img": 1},
            "rootfs": {"layout": "path", "path": "/srv/bundle/rootfs"}}
    (img / IMAGE_META).write_text(json.dumps(meta))
    r = CliRunner().invoke(_main(), ["push", str(img), "--key", "k"], env=node)
    assert r.exit_code == 2
    assert "depends on this node: root filesystem /srv/bundle/rootfs; bind mount /srv/models -> /models" \
        in r.stderr


def _main():
    from control.cli.main import main
    return main


def test_the_tuple_travels_with_the_image_and_restore_checks_it_before_runsc(node, tmp_path):
    """Issue 30: `thaw checkpoint` records the compatibility tuple in thaw.json; `thaw restore
    DIR` refuses an image this node cannot restore (exit 3, naming the field) before runsc
    runs, or with --cold-fallback starts it cold; an image of an older thaw is judged by the
    runsc version and platform it recorded."""
    sb = sandboxes(node)
    (tmp_path / "rootfs" / "t").mkdir(parents=True)
    sb.run("t", server_spec(tmp_path, "t"), network=False)
    img = tmp_path / "images" / "img"
    img.parent.mkdir()
    sb.checkpoint("t", img)
    meta = json.loads((img / IMAGE_META).read_text())
    assert meta["tuple"]["runsc_version"] == "fake-1" and meta["tuple"]["cpu_features"] == ["fpu", "sse", "sse2"]

    before = len(argvs(node))
    r = CliRunner().invoke(_main(), ["restore", str(img), "--id", "u"], env={**node, "FAKE_CPU_FEATURES": "fpu,sse"})
    assert r.exit_code == 3, r.output
    [line] = [x for x in r.stderr.splitlines() if x.startswith("thaw: error: ")]
    assert "cpu_features: node lacks 1 CPU feature(s) the image was saved with: sse2" in line, line
    assert not [a for a in argvs(node)[before:] if "restore" in a], "runsc restore ran"
    assert sb.get("u") is None

    r = CliRunner().invoke(_main(), ["restore", str(img), "--id", "u", "--cold-fallback", "--json"],
                           env={**node, "FAKE_CPU_FEATURES": "fpu,sse"})
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["mode"] == "cold" and out["fallback_reason"].startswith("TupleMismatch: ") and "sse2" in \
        out["fallback_reason"], out
    sb.delete("u", force=True)

    r = CliRunner().invoke(_main(), ["restore", str(img), "--id", "u", "--json"],   # a superset restores
                           env={**node, "FAKE_CPU_FEATURES": "fpu,sse,sse2,avx"})
    assert r.exit_code == 0 and json.loads(r.stdout)["mode"] == "restored", r.output
    sb.delete("u", force=True)

    del meta["tuple"]   # an image of a thaw before issue 30, saved by another runsc
    meta["runsc_version"] = "thaw-gvisor-000000000000"
    (img / IMAGE_META).write_text(json.dumps(meta))
    r = CliRunner().invoke(_main(), ["restore", str(img), "--id", "u"], env=node)
    assert r.exit_code == 3 and "runsc_version: image has 'thaw-gvisor-000000000000', node has 'fake-1'" in r.stderr


def test_a_checkpoint_deadline_scales_with_the_footprint_and_a_timeout_names_it(node, tmp_path, monkeypatch):
    """A sandbox holding 2 GiB gets runsc.timeout_s + 2 x runsc.timeout_per_gib_s for its
    save (issue 32: a JAX server's 108 GB checkpoint ran past a fixed 120 s); a save that
    outlasts it fails in one line naming both settings and the size, the workload serving on."""
    env = {**node, "THAW_RUNSC_TIMEOUT_S": "1", "THAW_RUNSC_TIMEOUT_PER_GIB_S": "2"}
    sb = sandboxes(env)
    (tmp_path / "rootfs" / "big").mkdir(parents=True)
    sb.run("big", server_spec(tmp_path, "big"), network=False)
    monkeypatch.setenv("FAKE_RUNSC_MEMORY", str(2 << 30))
    out = tmp_path / "images"
    out.mkdir()
    # 1 + 2 x 2 = 5 s: a 2.5 s save fits, where the fixed 1 s would have killed it.
    monkeypatch.setenv("FAKE_RUNSC_CHECKPOINT_SLEEP", "2.5")
    saved = sb.checkpoint("big", out / "ok", leave_running=True)
    assert saved.image_bytes > 0
    monkeypatch.setenv("FAKE_RUNSC_CHECKPOINT_SLEEP", "8")
    with pytest.raises(CheckpointFailed) as ei:
        sb.checkpoint("big", out / "late")
    e = ei.value
    assert "\n" not in str(e) and e.workload == "running"
    assert "no answer within 5 s (runsc.timeout_s + runsc.timeout_per_gib_s x 2.0 GiB)" in str(e)
    assert not (out / "late").exists()
    [row] = sb.ps()
    assert row["state"] == "running"
