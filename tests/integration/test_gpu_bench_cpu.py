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


@pytest.fixture
def thp_dir(tmp_path):
    """A stand-in for /sys/kernel/mm/transparent_hugepage with the H200 VM's values (the *-thp
    variants write it; the host's own setting is machine-wide and other tests share the machine)."""
    d = tmp_path / "thp"
    d.mkdir()
    (d / "shmem_enabled").write_text("always within_size advise [never] deny force\n")
    (d / "defrag").write_text("always defer defer+madvise [madvise] never\n")
    return d


@pytest.mark.parametrize("channel, variants", [
    ("file", list(models.VARIANTS) + ["thaw@copy", "cooperative@copy"]),
    ("http", ["thaw", "cooperative", "cooperative-reload", "parked-cooperative"]),
])
def test_restore_variants_answer_identically(runsc_bin, work, tmp_path, thp_dir, channel, variants):
    if channel == "http":
        require(importlib.util.find_spec("pyroute2") is not None, "pyroute2 (make setup installs it)")
    # "thaw@copy": the same image restored by another runsc binary (here a copy of the same build).
    copy = tmp_path / "runsc-copy"
    copy.write_bytes(Path(runsc_bin).read_bytes())
    copy.chmod(0o755)
    opts = models.Options(runsc=runsc_bin, out=tmp_path / "out", work=work, models=["tiny"], variants=variants,
                          device="cpu", backend="fake", channel=channel, python=sys.executable,
                          restore_runsc={"copy": copy}, thp_dir=thp_dir,
                          # the *-verified variants read the image through thaw-gofer (issue 30)
                          gofer=REPO / "build" / "thaw-gofer", chunker=REPO / "build" / "thaw-chunk")
    result = models.run(opts)
    r = result["models"]["tiny"]
    assert r["errors"] == [], r["errors"]
    assert set(r["variants"]) == set(variants)
    for name, v in r["variants"].items():
        var = models.VARIANTS[models.split_variant(name)[0]]
        assert v.get("error") is None, (name, v)
        assert v["identical"] and v["same_process"], (name, v)
        events = [e for row in v["timeline"] for e in row["events"]]
        assert "specs validated" in events and "kernel loaded" in events, (name, events)
        post = models.IMAGES[var.image].post
        if post:    # the pytorch-offload profile's post-restore hook brought the weights back
            assert v["post_restore"]["restored"] is True, (name, v["post_restore"])
            assert v["post_restore"]["mode"] == dict(models.IMAGES[var.image].pre)["offload-weights"]["mode"]
        else:
            assert "post_restore" not in v
        if var.park:
            # Restored ahead of demand, CUDA state parked by the helper through runsc exec, then demanded.
            park = v["park"]
            assert [g["stdout"] for g in park["get_state"]] == ["running", "running"], park
            assert park["parked_state"] == "checkpointed" and "total" in park["park_toggle"]["timing"]
            assert park["host_memory"]["memfd_bytes"] > 0 and park["host_memory"]["processes"] >= 1
            assert v["demand_toggle"]["args"] == ["--toggle"] and v["first_request_s"] == v["restore_s"]
            assert park["restore_done_s"] <= park["parked_s"]
        else:
            assert 0 < v["runsc_restore_s"] <= v["restore_s"]
        assert v.get("host_thp") == (models.THP_FOR_HUGE_PAGES if var.thp else None), name
    # The *-thp variants put the host's THP settings back (cold start and checkpoints too).
    assert models.thp_read(thp_dir) == {"shmem_enabled": "never", "defrag": "madvise"}
    thp = any(models.VARIANTS[models.split_variant(v)[0]].thp for v in variants)
    assert r["host_thp_at_checkpoint"] == (models.THP_FOR_HUGE_PAGES if thp else None)
    for kind, img in r["images"].items():
        assert set(img["image_files"]) == {"checkpoint.img", "pages_meta.img", "pages.img"}
        assert img["image_bytes"] > 0 and img["cold_start_s"] > 0
    # Every image but norelease came from one process: leave-running checkpoints, then the last.
    chain = [k for k in models.CHAIN if k in r["images"]]
    assert [r["images"][k]["leave_running"] for k in chain] == [True] * (len(chain) - 1) + [False]
    assert [r["images"][k]["taken_after"] for k in chain] == [chain[:i] for i in range(len(chain))]
    assert {r["images"][k]["boot"] for k in chain} == {r["images"][chain[0]]["boot"]}
    assert all(r["images"][k]["after_leave_running"]["identical"] for k in chain[:-1])
    assert r["identical"] is True and r["restore_s"] == r["variants"]["thaw"]["restore_s"]
    assert set(r["levers"]) == set(variants)
    if "thaw@copy" in variants:
        assert r["variants"]["thaw@copy"]["about"].endswith("restored by runsc copy")
    assert (tmp_path / "out" / "models.json").is_file()
    assert not (work / "tiny").exists() and not (work / "weights" / "tiny").exists()   # cleaned up


def test_an_offload_image_restored_without_its_post_restore_hook_does_not_answer(runsc_bin, work, tmp_path,
                                                                                 monkeypatch):
    """What makes `cooperative` a real test of the profile: without the hook the weights stay off the device."""
    monkeypatch.setitem(models.IMAGES, "offload", models.ImageKind(pre=models.IMAGES["offload"].pre, post=None))
    opts = models.Options(runsc=runsc_bin, out=tmp_path / "out", work=work, models=["tiny"],
                          variants=["cooperative"], device="cpu", backend="fake", python=sys.executable)
    r = models.run(opts)["models"]["tiny"]
    v = r["variants"]["cooperative"]
    assert v["identical"] is False and "restore-weights first" in v["error"]


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
