"""bench/gpu: the driver's parsing and summaries, the spool channel against the
real server loop (fake backend), and the weight maker's fake format."""
from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_gpu_{name}", REPO / "bench/gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


models = _load("models")
server = _load("server")
weights = _load("weights")


@pytest.mark.parametrize("text, seconds", [("1.5s", 1.5), ("850.2ms", 0.8502), ("1m2.5s", 62.5),
                                           ("12µs", 12e-6), ("3us", 3e-6), ("7ns", 7e-9), ("1h0m0s", 3600.0)])
def test_go_duration(text, seconds):
    assert models.go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1.5", "fast", "1.5s extra"])
def test_go_duration_rejects(text):
    with pytest.raises(ValueError):
        models.go_duration(text)


def test_cuda_toggle_lines():
    text = (DATA / "restore-timing.log").read_text()
    assert models.cuda_toggles(text) == [{"processes": 2, "seconds": 1.2346}]


def test_restore_timeline_from_a_real_runsc_log():
    # tests/unit/data/restore-timing.log: the Restore table of a runsc restore on this machine.
    [rows] = models.timelines((DATA / "restore-timing.log").read_text())
    assert rows[0] == {"at_s": 0.0, "since_prev_s": 0.0, "events": ["start Restore"]}
    assert rows[1]["events"] == ["cm.Restore RPC"] and rows[1]["since_prev_s"] == pytest.approx(0.047079)
    names = [e for r in rows for e in r["events"]]
    for phase in ("specs validated", "start async page loading", "Kernel loaded", "Network stack restored",
                  "kernel loaded", "Starting sandbox", "kernel notified"):
        assert phase in names
    assert rows[-1]["at_s"] == pytest.approx(0.088704)
    assert models.timelines("no tables here") == []


def result_with(variants: dict, target: float | None = 1.0) -> dict:
    img = {"cold_start_s": 20.0, "checkpoint_s": 2.0, "image_bytes": 10, "answer": {"tokens": [1], "digest": "a"}}
    return {"target_s": target, "images": {"norelease": dict(img, image_bytes=30), "release": dict(img, cold_start_s=15.0)},
            "variants": variants}


def test_summary_when_the_target_is_met():
    s = models.summarize(result_with({"thaw": {"restore_s": 0.8, "identical": True},
                                      "baseline": {"restore_s": 1.9, "identical": True}}))
    assert (s["cold_start_s"], s["cold_start_warm_s"], s["checkpoint_s"], s["image_bytes"]) == (20.0, 15.0, 2.0, 10)
    assert s["restore_s"] == 0.8 and s["identical"] and s["met_target"] is True
    assert s["slower_than_thaw_s"] == {"baseline": 1.1}
    assert s["cold_answers_equal"] is True
    assert "where_time_goes" not in s


def test_summary_says_where_the_time_goes_when_the_target_is_missed():
    thaw = {"restore_s": 3.0, "runsc_restore_s": 2.2, "first_request_s": 0.8, "server_s": 0.05, "identical": True,
            "restore_done_s": 4.0, "cuda_restore": [{"processes": 1, "seconds": 1.5}],
            "timeline": [{"at_s": 0, "since_prev_s": 0, "events": ["start Restore"]},
                         {"at_s": 1.7, "since_prev_s": 1.7, "events": ["kernel loaded"]},
                         {"at_s": 1.8, "since_prev_s": 0.1, "events": ["Starting sandbox"]}]}
    s = models.summarize(result_with({"thaw": thaw, "no-release": {"restore_s": 5.0, "identical": False}}))
    assert s["met_target"] is False and s["identical"] is False
    w = s["where_time_goes"]
    assert w["cuda_restore_s"] == 1.5 and w["runsc_restore_s"] == 2.2 and w["first_request_s"] == 0.8
    assert w["largest_restore_phases"][0] == {"after": "kernel loaded", "seconds": 1.7}


def test_summary_of_a_failed_run_still_names_the_miss():
    s = models.summarize({"target_s": 2.0, "images": {}, "variants": {}})
    assert s["restore_s"] is None and s["identical"] is False and "where_time_goes" in s


def test_headline_has_the_five_fields():
    r = {"models": {"gpt2-large": {"cold_start_s": 9.0, "checkpoint_s": 2.0, "image_bytes": 5, "restore_s": 0.9,
                                   "identical": True, "target_s": 1.0, "met_target": True, "images": {}}}}
    assert models.headline(r) == {"gpt2-large": {"cold_start_s": 9.0, "checkpoint_s": 2.0, "image_bytes": 5,
                                                 "restore_s": 0.9, "identical": True, "target_s": 1.0,
                                                 "met_target": True}}


def test_every_optimization_has_a_variant_without_it():
    v = models.VARIANTS
    thaw = v["thaw"]
    assert (thaw.image, thaw.background, thaw.drop_cache) == ("release", True, False)
    assert v["no-release"].image == "norelease" and v["no-release"].background
    assert not v["no-background"].background and v["no-background"].image == "release"
    assert v["thaw-cold-cache"].drop_cache
    assert (v["baseline"].image, v["baseline"].background) == ("norelease", False)


def test_targets_and_shapes_agree():
    assert {m: c["target_s"] for m, c in models.MODELS.items() if c["target_s"]} == {
        "gpt2-large": 1.0, "llama-3b": 2.0, "llama-8b": 4.5}
    assert set(models.MODELS) == set(weights.SHAPES)


@pytest.mark.parametrize("kw, message", [
    ({"models": ["gpt5"]}, "unknown model"),
    ({"variants": ["warp"]}, "unknown variant"),
    ({"device": "cuda", "helper": None}, "needs --helper"),
])
def test_options_validate(tmp_path, kw, message):
    o = models.Options(runsc=tmp_path / "runsc", out=tmp_path, **{"models": ["tiny"], "device": "cpu", **kw})
    with pytest.raises(SystemExit, match=message):
        o.validate()


def test_parse_args():
    o = models.parse_args(["--runsc", "/r", "--out", "/o", "--models", "tiny,llama-8b", "--variants", "thaw",
                           "--device", "cpu", "--no-cdi", "--budget-s", "500", "--channel", "http"])
    assert (o.models, o.variants, o.device, o.cdi, o.budget_s, o.channel) == (
        ["tiny", "llama-8b"], ["thaw"], "cpu", False, 500.0, "http")
    assert o.time_left() <= 500


def test_file_channel_against_the_server_loop(tmp_path):
    w = weights.make("tiny", tmp_path / "w", fmt="fake")
    assert w["bytes"] > 0 and (tmp_path / "w" / ".complete").is_file()
    assert weights.make("tiny", tmp_path / "w", fmt="fake")["reused"] is True
    spool = tmp_path / "spool"
    ch = models.FileChannel(spool)
    ch.reset()
    srv = server.Server(server.FakeBackend(str(tmp_path / "w"), [1, 2, 3], 8))
    threading.Thread(target=server.serve_spool, args=(srv, str(spool)), daemon=True).start()
    a = ch.request("generate", 10)
    b = ch.request("generate", 10)
    assert len(a["tokens"]) == 8 and models.same_answer(a, b) and a["boot"] == server.BOOT
    assert ch.request("pre-checkpoint", 10)["released_bytes"] == 0
    assert "unknown op" in ch.request("reboot", 10)["error"]
    assert sorted(p.name for p in spool.iterdir()) == sorted(
        p.name for p in spool.iterdir() if p.suffix == ".resp")   # requests were consumed


def test_file_channel_times_out(tmp_path):
    ch = models.FileChannel(tmp_path / "spool")
    ch.reset()
    with pytest.raises(models.ChannelTimeout, match="no answer to generate within 0.05 s"):
        ch.request("generate", 0.05)


def test_http_server_routes(tmp_path):
    weights.make("tiny", tmp_path / "w", fmt="fake")
    srv = server.Server(server.FakeBackend(str(tmp_path / "w"), [1, 2, 3], 4))
    httpd = server.serve_http(srv, 0)
    try:
        ch = models.HttpChannel("127.0.0.1", httpd.server_address[1])
        assert ch.request("health", 5)["ok"] is True
        assert ch.request("gpu", 5)["gpu"] == "fake"     # the route the gpu: probe asks
        assert len(ch.request("generate", 5)["tokens"]) == 4
        # The pytorch profile's hook, through control/profiles.py:
        assert ch.request("pre-checkpoint", 5)["released_bytes"] == 0
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_same_answer():
    assert models.same_answer({"tokens": [1], "digest": "x"}, {"tokens": [1], "digest": "x", "boot": "b"})
    assert not models.same_answer({"tokens": [1], "digest": "x"}, {"tokens": [1], "digest": "y"})
    assert not models.same_answer(None, {"tokens": [1], "digest": "x"})


def test_weights_config_shapes():
    c = weights.config_for("llama-8b")
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_key_value_heads"], c["intermediate_size"]) == (
        4096, 32, 8, 14336)
    assert weights.config_for("gpt2-large")["n_embd"] == 1280
    with pytest.raises(SystemExit):
        weights.config_for("gpt5")
    assert json.loads(json.dumps(c)) == c


def test_cuda_sandbox_spec_has_gpus_from_cdi_and_the_helper(tmp_path, monkeypatch):
    """The CUDA-only set-up path, which otherwise first runs on the GPU machine."""
    import os
    import stat as statmod

    from nvproxy import cdi
    from nvproxy.gpu import Gpu, NodeGpus

    node = NodeGpus("580.159.04", "13.0", (Gpu(0, "NVIDIA H200", "GPU-abc", 4, 150 << 30, "0000:01:00.0"),))
    lib = tmp_path / "nvidia" / "lib64"
    lib.mkdir(parents=True)
    for name in ("libcuda", "libnvidia-ml"):
        (lib / f"{name}.so.580.159.04").write_bytes(b"\x7fELF")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.580.159.04")
    reg = cdi.Registry([cdi.parse(cdi.generate(node, lib_dirs=[lib], bin_dirs=[], exists=lambda p: True))])

    def fake_stat(path):
        fields = list(os.stat("/"))
        fields[0] = statmod.S_IFCHR | 0o666
        minor = {"/dev/nvidiactl": 255, "/dev/nvidia-uvm": 0}.get(path, 4)
        return os.stat_result(fields, {"st_rdev": os.makedev(195 if path != "/dev/nvidia-uvm" else 510, minor)})

    monkeypatch.setattr(cdi, "node_registry", lambda n: reg)
    real_inject = cdi.inject
    monkeypatch.setattr(cdi, "inject", lambda spec, reg, devs, stat=None: real_inject(spec, reg, devs, fake_stat))
    helper_bin = tmp_path / "thaw-cuda-checkpoint"
    helper_bin.write_bytes(b"#!/bin/sh\n")
    opts = models.Options(runsc=tmp_path / "runsc", out=tmp_path / "out", work=tmp_path / "work",
                          models=["gpt2-large"], helper=helper_bin, python=sys.executable)
    b = models.ModelBench(opts, "gpt2-large", node)
    b.setup()
    spec = json.loads((tmp_path / "work" / "gpt2-large" / "bundle" / "config.json").read_text())
    assert cdi.gpu_nodes(spec) == ["/dev/nvidia4"]
    assert {d["path"] for d in spec["linux"]["devices"]} == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia4"}
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert mounts["/thaw/bin"]["source"] == str(tmp_path / "work" / "gpt2-large" / "helper")
    assert mounts[str(lib / "libcuda.so.1")]["source"] == str(lib / "libcuda.so.580.159.04")
    assert mounts["/model"]["source"] == str(tmp_path / "work" / "weights" / "gpt2-large")
    assert mounts["/share"]["options"] == ["rbind", "rw"]
    env = dict(e.split("=", 1) for e in spec["process"]["env"])
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(lib) and env["HF_HUB_OFFLINE"] == "1"
    assert spec["process"]["args"][1:3] == ["/bench/server.py", "--model-dir"]
    assert b.runsc.options.nvproxy and b.runsc.options.network == "none"
    assert b.devices == ["nvidia.com/gpu=GPU-abc"]
    # The spec a restore gets on this node passes the restore checks.
    cdi.for_restore(b.spec, b.spec, reg, b.devices)


def test_waiting_stops_when_the_server_is_dead(tmp_path):
    ch = models.FileChannel(tmp_path / "spool")
    ch.reset()
    calls = []

    def abort():
        calls.append(1)
        return "sandbox stopped" if len(calls) > 1 else None

    t0 = time.monotonic()
    with pytest.raises(models.ChannelTimeout, match="gave up waiting for generate: sandbox stopped"):
        ch.request("generate", 30, abort=abort)
    assert time.monotonic() - t0 < 5 and len(calls) == 2     # asked about once a second, not at every poll


def test_progress_is_saved_with_its_summary(tmp_path, monkeypatch):
    """models.json is rewritten as results come in, summary fields included."""
    class FakeBench:
        def __init__(self, opts, model, node, progress):
            self.progress, self.model = progress, model

        def run(self):
            r = result_with({"thaw": {"restore_s": 0.5, "identical": True}})
            r["model"] = self.model
            self.progress(dict(r, variants={}))
            saved = json.loads((tmp_path / "out" / "models.json").read_text())
            assert saved["models"][self.model]["restore_s"] is None      # partial: no variant yet
            assert saved["models"][self.model]["cold_start_s"] == 20.0
            return {**r, **models.summarize(r)}

    class FakeRunsc:
        def __init__(self, *a, **k):
            pass

        def version(self):
            return "test"

    monkeypatch.setattr(models, "ModelBench", FakeBench)
    monkeypatch.setattr(models, "Runsc", FakeRunsc)
    opts = models.Options(runsc=tmp_path / "runsc", out=tmp_path / "out", work=tmp_path / "w", models=["tiny"],
                          device="cpu")
    models.run(opts)
    saved = json.loads((tmp_path / "out" / "models.json").read_text())
    assert saved["models"]["tiny"]["restore_s"] == 0.5
    assert not list((tmp_path / "out").glob("*.partial"))
