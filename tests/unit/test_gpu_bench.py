"""bench/gpu: the driver's parsing and summaries, the spool channel against the
real server loop (fake backend), and the weight maker's fake format."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from .benchmods import load_bench_gpu

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


models = load_bench_gpu("models")
server = load_bench_gpu("server")
weights = load_bench_gpu("weights")


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
        "gpt2-large": 1.0, "llama-3b": 2.0, "llama-8b": 4.0}
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


def spool_server(tmp_path, spool, new_tokens: int):
    """bench/gpu/server.py's spool loop on a thread, its fake backend over tiny fake
    weights in tmp_path/w; the channel to it."""
    weights.make("tiny", tmp_path / "w", fmt="fake")
    ch = models.FileChannel(spool)
    ch.reset()
    srv = server.Server(server.FakeBackend(str(tmp_path / "w"), [1, 2, 3], new_tokens))
    threading.Thread(target=server.serve_spool, args=(srv, str(spool)), daemon=True).start()
    return ch


def test_file_channel_against_the_server_loop(tmp_path):
    w = weights.make("tiny", tmp_path / "w", fmt="fake")
    assert w["bytes"] > 0 and (tmp_path / "w" / ".complete").is_file()
    assert weights.make("tiny", tmp_path / "w", fmt="fake")["reused"] is True
    spool = tmp_path / "spool"
    ch = spool_server(tmp_path, spool, 8)
    a = ch.request("generate", 10)
    b = ch.request("generate", 10)
    assert len(a["tokens"]) == 8 and models.same_answer(a, b) and a["boot"] == server.BOOT
    assert ch.request("pre-checkpoint", 10)["released_bytes"] == 0
    assert "unknown op" in ch.request("reboot", 10)["error"]
    assert sorted(p.name for p in spool.iterdir() if p.name != "nonce") == sorted(
        p.name for p in spool.iterdir() if p.suffix == ".resp")   # requests were consumed
    # Each answer carries the nonce its request wrote into the spool, read back by the server.
    assert a["spool_nonce"] == a["spool_nonce_sent"] != b["spool_nonce_sent"] == b["spool_nonce"]
    assert a["spool_nonce_sent"].startswith("spool:")


def test_the_nonce_names_the_spool_the_answering_server_sees(tmp_path):
    """A server that sees another directory cannot report this spool's nonce: what
    bench/gpu/node.py's park rounds check to tell which sandbox answered."""
    mine = tmp_path / "mine"
    ch = spool_server(tmp_path, mine, 4)
    a = ch.request("health", 10)
    assert a["spool_nonce"] == a["spool_nonce_sent"] and a["spool_nonce"].startswith("mine:")
    # A request written straight into a spool without a nonce file: the server says so.
    (mine / "nonce").unlink()
    (mine / "x.req").write_text(json.dumps({"op": "health"}))
    deadline = time.monotonic() + 10
    while not (mine / "x.resp").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert json.loads((mine / "x.resp").read_text())["spool_nonce"].startswith("unreadable:")


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
        # The pytorch profile's hook, through control/lifecycle/profiles.py:
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

    from nvproxy import cdi, restore_spec
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
    restore_spec.for_restore(b.spec, b.spec, reg, b.devices)


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


# -- issue 17: the restore-speed levers --------------------------------------------------------

def test_the_default_variants_stay_issue_6s():
    assert models.DEFAULT_VARIANTS == ("thaw", "thaw-cold-cache", "no-background", "no-release", "baseline")
    assert set(models.DEFAULT_VARIANTS) < set(models.VARIANTS)


def test_every_lever_variant_restores_an_image_the_chain_makes():
    v = models.VARIANTS
    assert all(x.image in models.IMAGES for x in v.values())
    assert models.CHAIN == ("release", "offload", "offload-staged", "offload-alloc", "drop")
    assert (v["cooperative"].image, v["cooperative"].target) == ("offload", "cooperative")
    assert (v["cooperative-alloc"].image, v["cooperative-reload"].image) == ("offload-alloc", "drop")
    assert v["parked"].park and v["parked"].image == "release" and v["parked"].target == "transparent"
    assert v["parked-cooperative"].park and v["parked-cooperative"].image == "offload"
    assert v["thaw-thp"].thp and v["cooperative-thp"].thp and not v["thaw"].thp
    assert v["parked-cooperative-thp"].park and v["parked-cooperative-thp"].thp
    assert v["parked-staged"].park and v["parked-staged"].image == "offload-staged"
    # The levers restore with --background, as thaw does; no-background-thp is the setting off, under THP.
    nb = v["no-background-thp"]
    assert (nb.image, nb.background, nb.thp, nb.drop_cache) == ("release", False, True, False)
    # thaw-thp-cold-cache is thaw-thp with the page cache dropped (the image on the disk only).
    cc = v["thaw-thp-cold-cache"]
    assert (cc.image, cc.background, cc.thp, cc.drop_cache) == ("release", True, True, True)
    assert all(x.background and not x.drop_cache for n, x in v.items()
               if n not in models.DEFAULT_VARIANTS and n not in ("no-background-thp", "thaw-thp-cold-cache"))
    modes = {k: dict(models.IMAGES[k].pre).get("offload-weights", {}).get("mode") for k in models.IMAGES}
    assert modes == {"norelease": None, "release": None, "offload": "register", "offload-staged": "staged",
                     "offload-alloc": "alloc", "drop": "drop"}
    assert {k for k, i in models.IMAGES.items() if i.post == "restore-weights"} == {
        "offload", "offload-staged", "offload-alloc", "drop"}
    assert v["cooperative-staged"].image == "offload-staged"


def test_the_bench_images_are_the_profiles_hooks():
    """The ops a bench image runs are the routes of the profile a user would pick (server.py's HTTP routes)."""
    from control.lifecycle import profiles
    routes = {"pre-checkpoint": "/thaw/pre-checkpoint", "offload-weights": "/thaw/offload-weights",
              "restore-weights": "/thaw/restore-weights"}
    src = (REPO / "bench/gpu/server.py").read_text()
    for op, path in routes.items():
        assert f'("POST", "{path}"): "{op}"' in src
    assert [h.path for h in profiles.get("pytorch").pre_checkpoint] == [routes[op] for op, _ in models.IMAGES["release"].pre]
    off = profiles.get("pytorch-offload")
    assert [h.path for h in off.pre_checkpoint] == [routes[op] for op, _ in models.IMAGES["offload"].pre]
    assert [h.path for h in off.post_restore] == [routes[models.IMAGES["offload"].post]]


def test_targets_of_issue_17():
    assert {m: c["coop_target_s"] for m, c in models.MODELS.items() if c["coop_target_s"]} == {
        "gpt2-large": 0.7, "llama-3b": 1.2, "llama-8b": 2.5}


def test_thp_settings_are_read_and_written_as_sysfs_has_them(tmp_path):
    (tmp_path / "shmem_enabled").write_text("always within_size advise [never] deny force\n")
    (tmp_path / "defrag").write_text("always defer defer+madvise [madvise] never\n")
    before = models.thp_read(tmp_path)
    assert before == {"shmem_enabled": "never", "defrag": "madvise"}
    models.thp_write(tmp_path, models.THP_FOR_HUGE_PAGES)
    assert models.thp_read(tmp_path) == {"shmem_enabled": "advise", "defrag": "defer"}
    models.thp_write(tmp_path, before)
    assert models.thp_read(tmp_path) == before


def test_host_thp_puts_the_old_values_back_and_survives_a_read_only_host(tmp_path):
    (tmp_path / "shmem_enabled").write_text("always within_size advise [never] deny force\n")
    (tmp_path / "defrag").write_text("always defer defer+madvise [madvise] never\n")
    b = models.ModelBench(models.Options(runsc=tmp_path / "r", out=tmp_path, models=["tiny"], device="cpu",
                                         thp_dir=tmp_path), "tiny", None)
    with b.host_thp("a test") as t:
        assert t == {"shmem_enabled": "advise", "defrag": "defer"}
    assert models.thp_read(tmp_path) == {"shmem_enabled": "never", "defrag": "madvise"}
    b.o.thp_dir = tmp_path / "absent"
    with b.host_thp("a test") as t:
        assert t is None
    assert "host THP not set for a test" in b.result["errors"][0]


def test_huge_pages_line():
    log = ('I1130 12:00:00.1 loader.go:1124] Disabling application huge pages: host shmem_enabled is "never"\n'
           'I1130 12:00:01.1 loader.go:1135] Enabling application huge pages: host shmem_enabled is "advise", '
           'host defrag is "defer"\n')
    assert models.huge_pages_line(log).startswith("Enabling application huge pages: host shmem_enabled is \"advise\"")
    assert models.huge_pages_line("nothing") is None


def test_sandbox_host_memory_finds_the_memory_file():
    import os
    fd = os.memfd_create("runsc-memory")
    try:
        os.write(fd, b"x" * (2 << 20))
        m = models.sandbox_host_memory(os.getpid())
    finally:
        os.close(fd)
    assert m["memfd_bytes"] >= 2 << 20 and m["processes"] >= 1 and m["rss_kb"] > 0


def test_sandbox_host_memory_counts_a_memory_file_once_however_many_fds_hold_it():
    import os
    fd = os.memfd_create("runsc-memory")
    dups = [os.dup(fd) for _ in range(5)]
    try:
        os.write(fd, b"x" * (2 << 20))
        m = models.sandbox_host_memory(os.getpid())
    finally:
        for f in (fd, *dups):
            os.close(f)
    assert m["memfds"] == 1 and 2 << 20 <= m["memfd_bytes"] < 4 << 20


def test_a_variants_record_is_its_median_run_with_the_spread():
    runs = [{"restore_s": 3.0, "identical": True}, {"restore_s": 2.4, "identical": True},
            {"restore_s": 2.3, "identical": True}]
    m = models.median_run(runs)
    assert (m["restore_s"], m["restore_s_min"], m["restore_s_max"], m["identical"]) == (2.4, 2.3, 3.0, True)
    m = models.median_run([*runs[:2], {"restore_s": None, "identical": False, "error": "boom"}])
    assert m["restore_s"] == 2.4 and m["identical"] is False and len(m["runs"]) == 3
    assert models.median_run([runs[0]]) is runs[0]


def test_helper_steps_read_the_helpers_timing_file(tmp_path):
    f = tmp_path / models.HELPER_TIMING
    assert models.helper_steps(f, 100.0) == []
    f.write_text("thaw-cuda-checkpoint timing: mode=toggle pid=1 rc=0 started=100.250000 dlopen=0.01 "
                 "cuInit=0.1 get-state=0.001 restore=0.5 unlock=0.002 total=0.62\n"
                 "garbage\n")
    [t] = models.helper_steps(f, 100.0)
    assert t["mode"] == "toggle" and t["started_s"] == 0.25 and t["restore"] == 0.5 and t["rc"] == 0
    r = result_with({"thaw": {"restore_s": 2.0, "identical": True, "helper_steps": [t]}}, target=1.0)
    assert models.levers(r)["thaw"]["helper"] == {"started_s": 0.25, "dlopen": 0.01, "cuInit": 0.1, "restore": 0.5,
                                                 "total": 0.62}


def test_levers_compare_each_variant_with_its_own_target():
    r = result_with({
        "thaw": {"restore_s": 2.0, "identical": True, "cuda_restore": [{"processes": 1, "seconds": 1.1}],
                 "server_s": 1.5, "request_timing": {"cuda_wait_s": 1.2, "steps_s": 0.3, "each_step_s": [0.2, 0.1]}},
        "cooperative": {"restore_s": 0.6, "identical": True, "post_restore": {"wall_s": 0.05, "copy_s": 0.01}},
        "parked": {"restore_s": 0.9, "identical": True, "demand_toggle": {"wall_s": 0.55},
                   "park": {"parked_s": 6.0, "host_memory": {"memfd_bytes": 5 << 30}}},
        "cooperative-reload": {"restore_s": 0.5, "identical": False},
        "thaw@readers8": {"restore_s": None, "identical": False, "error": "RunscError: boom"},
    }, target=1.0)
    r["coop_target_s"] = 0.7
    r["native"] = {"native_restore_s": 0.57, "native_checkpoint_s": 1.2, "identical": True, "get_state_s": [0.2, 0.1],
                   "offload": {"cuda_restore_s": 0.2, "restore_weights_s": 0.05, "restore_s": 0.25, "identical": True},
                   "warm_request": {"wall_s": 0.1}, "requests_after_restore": [{"wall_s": 0.3}, {"wall_s": 0.1}]}
    lv = models.levers(r)
    assert lv["thaw"] == {"restore_s": 2.0, "identical": True, "target": "transparent", "target_s": 1.0,
                          "met_target": False, "vs_thaw_s": 0.0, "image_bytes": 10, "cuda_restore_s": 1.1,
                          "request_s": 0.3}   # the request's own time: its server time less its wait for the unlock
    assert (lv["cooperative"]["target_s"], lv["cooperative"]["met_target"], lv["cooperative"]["post_restore_s"],
            lv["cooperative"]["weights_copy_s"], lv["cooperative"]["request_s"]) == (0.7, True, 0.05, 0.01, None)
    assert lv["parked"]["met_target"] is True and lv["parked"]["cuda_restore_s"] == 0.55
    assert lv["parked"]["parked_host_memfd_bytes"] == 5 << 30 and lv["parked"]["vs_thaw_s"] == -1.1
    assert lv["cooperative-reload"]["met_target"] is False          # fast but wrong is not a met target
    assert lv["thaw@readers8"]["met_target"] is None and lv["thaw@readers8"]["error"] == "RunscError: boom"
    assert lv["native"]["cuda_restore_s"] == 0.57 and lv["native"]["cooperative"]["restore_s"] == 0.25
    assert lv["native"]["warm_request_s"] == 0.1 and lv["native"]["requests_after_restore_s"] == [0.3, 0.1]
    assert models.summarize(r)["levers"] == lv
    table = models.lever_table({"models": {"gpt2-large": r}})
    assert "cooperative" in table and "native (no sandbox): CUDA restore 0.570 s" in table
    assert "after the restore ['0.300', '0.100']" in table


def test_parse_args_for_the_speed_run():
    o = models.parse_args(["--runsc", "/r", "--out", "/o", "--variants", "thaw,cooperative",
                           "--model-variants", "llama-8b=thaw,parked", "--native", "--thp-dir", "/t"])
    assert o.model_variants == {"llama-8b": ["thaw", "parked"]} and o.native and o.thp_dir == Path("/t")
    o = models.Options(runsc=Path("/r"), out=Path("/o"), models=["tiny"], device="cpu",
                       model_variants={"tiny": ["thaw", "warp"]})
    with pytest.raises(SystemExit, match="unknown variant"):
        o.validate()
    o.model_variants = {"gpt5": ["thaw"]}
    with pytest.raises(SystemExit, match="unknown model"):
        o.validate()


class ChainBench(models.ModelBench):
    """make_chain's bookkeeping without runsc: cold starts and images are recorded, not made."""

    def __init__(self, tmp_path, fail_leave_running=False, differ_after=None, fail_hook=None, fail_last=False,
                 resume_fails=False):
        super().__init__(models.Options(runsc=tmp_path / "r", out=tmp_path, models=["tiny"], device="cpu"),
                         "tiny", None)
        self.log: list = []
        self.fail_leave_running, self.differ_after = fail_leave_running, differ_after
        self.fail_hook, self.fail_last, self.resume_fails = fail_hook, fail_last, resume_fails

    def cold_start(self, cold_cache):
        self.log.append("cold")
        return f"c{len(self.log)}", {"tokens": [1], "digest": "a", "boot": "b"}, 1.0

    def events(self):
        return []

    def take_image(self, cid, kind, info, leave_running):
        if kind == self.fail_hook:
            self.log.append(("hook failed", kind))
            raise models.HookFailed("RuntimeError: server offload-weights: cudaHostRegister failed")
        if (leave_running and self.fail_leave_running) or (not leave_running and self.fail_last):
            raise RuntimeError("checkpoint failed")
        self.log.append((kind, cid, leave_running))
        info.update(checkpoint_s=1.0, path=f"/img/{kind}")
        if leave_running and self.resume_fails:
            info["checkpoint_error"] = "RunscError: cuda-checkpoint --toggle failed"
        self.result["images"][kind] = info
        return info

    def call(self, op, timeout_s=300, **args):
        self.log.append(op)
        return {"tokens": [1], "digest": "x" if op == "generate" and self.differ_after else "a"}

    def delete(self, cid):
        self.log.append(("delete", cid))


def test_the_chain_takes_every_image_from_one_process(tmp_path):
    b = ChainBench(tmp_path)
    made = b.make_chain(["release", "offload", "drop"], first=False)
    assert b.log == ["cold", "generate",
                     ("release", "c1", True), "generate", ("offload", "c1", True), "restore-weights",
                     "generate", ("drop", "c1", False), ("delete", "c1")]
    assert made["drop"]["taken_after"] == ["release", "offload"] and b.result["errors"] == []
    assert made["release"]["after_leave_running"]["identical"] is True


def test_a_failed_leave_running_checkpoint_leaves_its_image_out_and_the_process_goes_on(tmp_path):
    b = ChainBench(tmp_path, fail_leave_running=True)
    made = b.make_chain(["release", "offload", "drop"], first=False)
    # offload's weights had left: back first, then the same answer, then the last image from the same process.
    assert b.log == ["cold", "generate",
                     "generate", "restore-weights", "generate", ("drop", "c1", False), ("delete", "c1")]
    assert set(made) == {"drop"} and "image release not made: RuntimeError" in b.result["errors"][0]


def test_a_whole_image_whose_resume_failed_is_kept_and_the_rest_get_cold_starts(tmp_path):
    b = ChainBench(tmp_path, resume_fails=True)
    made = b.make_chain(["release", "offload", "drop"], first=False)
    assert b.log == ["cold", "generate", ("release", "c1", True), ("delete", "c1"), "cold", "generate",
                     ("offload", "c5", False),
                     ("delete", "c5"), "cold", "generate", ("drop", "c9", False), ("delete", "c9")]
    assert set(made) == {"release", "offload", "drop"} and "--leave-running failed" in b.result["errors"][0]


def test_a_failed_hook_leaves_its_image_out_and_the_process_goes_on(tmp_path):
    b = ChainBench(tmp_path, fail_hook="offload")
    made = b.make_chain(["release", "offload", "drop"], first=False)
    assert b.log == ["cold", "generate",
                     ("release", "c1", True), "generate", ("hook failed", "offload"), "restore-weights",
                     "generate", ("drop", "c1", False), ("delete", "c1")]
    assert set(made) == {"release", "drop"} and "image offload not made" in b.result["errors"][0]


def test_a_failed_last_checkpoint_keeps_the_images_made_before_it(tmp_path):
    b = ChainBench(tmp_path, fail_last=True)
    made = b.make_chain(["release", "offload"], first=False)
    assert set(made) == {"release"} and "image offload not made: RuntimeError" in b.result["errors"][0]
    with pytest.raises(RuntimeError, match="no norelease image"):
        ChainBench(tmp_path, fail_last=True).make_image("norelease", first=False)


def test_image_complete(tmp_path):
    assert not models.image_complete(tmp_path / "none")
    for name, size in (("checkpoint.img", 10), ("pages_meta.img", 1), ("pages.img", 0)):
        (tmp_path / name).write_bytes(b"x" * size)
    assert models.image_complete(tmp_path)
    (tmp_path / "checkpoint.img").write_bytes(b"")
    assert not models.image_complete(tmp_path)


def test_a_process_that_answers_differently_after_leave_running_ends_the_chain(tmp_path):
    b = ChainBench(tmp_path, differ_after=True)
    made = b.make_chain(["release", "offload"], first=False)
    assert b.log[:5] == ["cold", "generate", ("release", "c1", True), "generate", ("delete", "c1")]
    assert b.log[5:] == ["cold", "generate", ("offload", "c6", False), ("delete", "c6")]
    assert made["release"]["after_leave_running"]["identical"] is False
    assert "did not answer as before" in b.result["errors"][0]


def test_server_weights_round_trip_over_the_spool(tmp_path):
    ch = spool_server(tmp_path, tmp_path / "spool", 8)
    first = ch.request("generate", 10)
    for mode in ("register", "alloc", "staged", "drop"):
        assert ch.request("offload-weights", 10, mode=mode)["mode"] == mode
        assert ch.request("health", 10)["weights"] == ("dropped" if mode == "drop" else "host")
        assert "restore-weights first" in ch.request("generate", 10)["error"]
        assert "already off the device" in ch.request("offload-weights", 10, mode=mode)["error"]
        back = ch.request("restore-weights", 10)
        assert back["restored"] and back["mode"] == mode
        assert models.same_answer(ch.request("generate", 10), first)
    assert "unknown offload mode" in ch.request("offload-weights", 10, mode="swap")["error"]
    assert ch.request("restore-weights", 10)["restored"] is False
    assert models.same_answer(ch.request("generate", 10), first)        # the server went on after every error


def test_server_weights_round_trip_through_the_profile_hooks(tmp_path):
    weights.make("tiny", tmp_path / "w", fmt="fake")
    srv = server.Server(server.FakeBackend(str(tmp_path / "w"), [1, 2, 3], 4))
    httpd = server.serve_http(srv, 0)
    try:
        ch = models.HttpChannel("127.0.0.1", httpd.server_address[1])
        first = ch.request("generate", 5)
        assert ch.request("offload-weights", 5, mode="drop")["mode"] == "drop"     # ?mode=drop on the hook's path
        assert ch.request("health", 5)["weights"] == "dropped"
        assert ch.request("restore-weights", 5)["restored"] is True
        assert ch.request("offload-weights", 5)["mode"] == "register"               # the profile's own hook
        from control.errors import HookError
        with pytest.raises(HookError, match="HTTP 500"):
            ch.request("offload-weights", 5)                                       # already off: an error answer
        ch.request("restore-weights", 5)
        assert models.same_answer(ch.request("generate", 5), first)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_fake_helper_toggles_like_the_real_one(tmp_path):
    import subprocess
    from nvproxy import helper
    exe = tmp_path / "cuda-checkpoint"
    exe.write_text(models.FAKE_HELPER.replace("/tmp/.thaw-fake-cuda-state", str(tmp_path / "state")))
    exe.chmod(0o755)

    def run(*a):
        p = subprocess.run([str(exe), helper.TIMING_FLAG, *a, "--pid", "1"], capture_output=True, text=True)
        return p.returncode, p.stdout.strip(), helper.parse_timing(p.stderr)

    assert run("--get-state")[:2] == (0, "running")
    assert run("--toggle")[0] == 0 and run("--get-state")[1] == "checkpointed"
    assert run("--toggle")[0] == 0 and run("--get-state")[1] == "running"
    assert run("--get-state")[2]["total"] == 0.0
    assert run()[0] == 2


def test_mirror_populate_times_every_variant(tmp_path):
    """bench/gpu/mirror_populate.py mirrors a memfd the way nvproxy's rmAllocOSDescriptor
    does and times the fault-in; small here, it must still report all three variants and
    write the same JSON to --out."""
    import subprocess
    out = tmp_path / "test_mirror_populate.json"
    p = subprocess.run([sys.executable, str(REPO / "bench/gpu/mirror_populate.py"), "--gib", "0.125",
                        "--repeat", "1", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    printed, written = json.loads(p.stdout), json.loads(out.read_text())
    assert printed == written
    assert printed["bytes"] == 128 << 20
    assert set(printed["variants"]) == {"aligned-one-mapping", "misaligned-4k", "aligned-64m-blocks"}
    for v in printed["variants"].values():
        assert v["median_s"] > 0 and len(v["runs_s"]) == 1
