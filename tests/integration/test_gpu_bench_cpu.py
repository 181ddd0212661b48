"""The GPU benchmark driver end to end on CPU: real runsc, a real checkpoint and
restore per variant, the server's fake backend (no torch, no GPU). On the H200
the same driver runs with --device cuda (bench/gpu/run-models.sh)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]


def _models():
    spec = importlib.util.spec_from_file_location("bench_gpu_models_it", REPO / "bench/gpu/models.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


models = _models()


@pytest.fixture
def work(tmp_path):
    yield tmp_path / "work"
    # runsc --network=none keeps a netns bind-mounted in its root directory.
    nsfile = tmp_path / "work" / "runsc-root" / "null-netns"
    if nsfile.exists():
        subprocess.run(["umount", str(nsfile)], check=False)


@pytest.mark.parametrize("channel, variants", [("file", list(models.VARIANTS) + ["thaw@copy"]), ("http", ["thaw"])])
def test_restore_variants_answer_identically(runsc_bin, work, tmp_path, channel, variants):
    if channel == "http":
        require(importlib.util.find_spec("pyroute2") is not None, "pyroute2 (make setup installs it)")
    # "thaw@copy": the same image restored by another runsc binary (here a copy of the same build).
    copy = tmp_path / "runsc-copy"
    copy.write_bytes(Path(runsc_bin).read_bytes())
    copy.chmod(0o755)
    opts = models.Options(runsc=runsc_bin, out=tmp_path / "out", work=work, models=["tiny"], variants=variants,
                          device="cpu", backend="fake", channel=channel, python=sys.executable,
                          restore_runsc={"copy": copy})
    result = models.run(opts)
    r = result["models"]["tiny"]
    assert r["errors"] == [], r["errors"]
    assert set(r["variants"]) == set(variants)
    for name, v in r["variants"].items():
        assert v.get("error") is None, (name, v)
        assert v["identical"] and v["same_process"], (name, v)
        assert 0 < v["runsc_restore_s"] <= v["restore_s"]
        events = [e for row in v["timeline"] for e in row["events"]]
        assert "specs validated" in events and "kernel loaded" in events, (name, events)
    for kind, img in r["images"].items():
        assert set(img["image_files"]) == {"checkpoint.img", "pages_meta.img", "pages.img"}
        assert img["image_bytes"] > 0 and img["cold_start_s"] > 0
    assert r["identical"] is True and r["restore_s"] == r["variants"]["thaw"]["restore_s"]
    if "thaw@copy" in variants:
        assert r["variants"]["thaw@copy"]["about"].endswith("restored by runsc copy")
    assert (tmp_path / "out" / "models.json").is_file()
    assert not (work / "tiny").exists() and not (work / "weights" / "tiny").exists()   # cleaned up


def test_a_server_that_dies_at_start_fails_the_cold_start_fast(runsc_bin, work, tmp_path):
    opts = models.Options(runsc=runsc_bin, out=tmp_path / "out", work=work, models=["tiny"], device="cpu",
                          backend="fake", python=sys.executable)
    b = models.ModelBench(opts, "tiny", None)
    b.make_weights()
    b.setup()
    for p in b.weights_dir.iterdir():
        p.unlink()
    b.weights_dir.rmdir()        # the server's FakeBackend cannot read /model now
    b.weights_dir.mkdir()
    (b.weights_dir / "model.bin").mkdir()
    with pytest.raises(RuntimeError, match=r"cold start: gave up waiting for generate: server: IsADirectoryError"):
        b.make_image("release", first=False)
    assert "IsADirectoryError" in b.server_log_tail()
    assert b.runsc.list() == []          # the failed sandbox was deleted
