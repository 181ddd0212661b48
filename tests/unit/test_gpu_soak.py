"""bench/gpu/soak.py's cooperative parts (issue 32 items 3 and 6): the native driver
restore of the same model in the same run (bench/gpu/native_cuda.py, faked here: the
H200 runs the real one), the parked first answers set beside it, and node.py's reading
of thawd's hook lines. tests/integration/test_gpu_node_rehearsal.py runs the real soak
on CPU."""
from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench/gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


soak = _load("soak")          # it puts bench/gpu on sys.path and imports node, soak_summary by name
node = sys.modules["node"]

NATIVE = {"model": "llama-8b", "native_restore_s": 2.602, "identical": True,
          "offload": {"cuda_restore_s": 0.874, "restore_weights_s": 0.35, "restore_s": 1.224, "identical": True}}


def _row(kind: str, t: float | None, ok: bool = True, **kw) -> dict:
    return {"kind": kind, "t": t, "ok": ok, **kw}


def test_parked_first_answers_stand_beside_the_native_restore_with_the_cooperative_target():
    rows = [_row("cache", 3.0), _row("park", 1.2, wake_cuda_s=0.3, weights_back_s=0.5),
            _row("park", 1.4, wake_cuda_s=0.4, weights_back_s=0.6), _row("park", None, ok=False)]
    pv = soak.parked_vs_native(rows, NATIVE, "pytorch-offload")
    assert pv["parked_first_answer_s"]["runs_s"] == [1.2, 1.4] and pv["parked_first_answer_s"]["n"] == 2
    assert pv["parked_wake_cuda_s"]["median_s"] == 0.35 and pv["parked_weights_back_s"]["max_s"] == 0.6
    assert pv["native_restore_s"] == 2.602
    assert pv["native_offloaded"] == {"cuda_restore_s": 0.874, "restore_weights_s": 0.35, "restore_s": 1.224}
    assert pv["target_s"] == 1.5 and pv["every_parked_within_target"] is True
    slow = soak.parked_vs_native(rows + [_row("park", 1.51)], NATIVE, "pytorch-offload")
    assert slow["every_parked_within_target"] is False
    # The target is the cooperative profile's (item 6); the transparent one has none here.
    assert "target_s" not in soak.parked_vs_native(rows, NATIVE, "pytorch")
    assert soak.parked_vs_native([], None, "pytorch-offload")["every_parked_within_target"] is False


class _Node:
    def __init__(self):
        self.env = {"PATH": "/usr/bin"}
        self.last_started = None
        self.containers = []
        self.park_template = None
        self.kept = []

    def evidence(self, cid, name):
        self.kept.append((cid, name))
        return f"evidence/{name}.tar.xz"

    def server_python(self):
        return "/opt/torch/.venv/bin/python", []

    def node_env(self):
        return dict(self.env)


def _soak(tmp_path, profile="pytorch-offload"):
    o = node.Options(mode="gpu", bin=tmp_path / "bin", work=tmp_path / "work", out=tmp_path / "out",
                     model="llama-8b", profile=profile)
    report = node.Report(o.out, {"benchmark": "gpu-soak"}, name="soak.json")
    return soak.Soak(o, _Node(), report, 10, 2, 5), report


def test_the_native_restore_runs_the_same_model_from_the_same_weights_with_the_servers_python(tmp_path, monkeypatch):
    calls = []

    def one(model, helper, work, keep_weights=False, offload_mode="", python=sys.executable, env=None):
        calls.append({"model": model, "helper": helper, "work": work, "keep": keep_weights, "mode": offload_mode,
                      "python": python, "env": env})
        return json.loads(json.dumps(NATIVE))

    monkeypatch.setitem(sys.modules, "native_cuda", types.SimpleNamespace(one=one))
    s, report = _soak(tmp_path)
    s.native()
    # node.py's weights directory is <work>/weights/<model>, as native_cuda's: made once, kept.
    assert calls == [{"model": "llama-8b", "helper": str(tmp_path / "bin/thaw-cuda-checkpoint"),
                      "work": tmp_path / "work", "keep": True, "mode": "register",
                      "python": "/opt/torch/.venv/bin/python", "env": {"PATH": "/usr/bin"}}]
    saved = json.loads((tmp_path / "out/soak.json").read_text())
    assert saved["native"]["native_restore_s"] == 2.602 and saved["native"]["wall_s"] >= 0
    assert saved["checks"][-1]["ok"] and saved["checks"][-1]["check"].startswith("native:")
    assert saved["parked_vs_native"]["native_offloaded"]["restore_s"] == 1.224


def test_a_native_restore_that_fails_is_a_failed_check_and_the_soak_goes_on(tmp_path, monkeypatch):
    def one(*a, **kw):
        raise RuntimeError("worker exited with 1")

    monkeypatch.setitem(sys.modules, "native_cuda", types.SimpleNamespace(one=one))
    s, report = _soak(tmp_path)
    s.native()
    assert report.data["native"]["error"] == "RuntimeError: worker exited with 1"
    assert not report.data["checks"][-1]["ok"]
    assert report.data["parked_vs_native"]["native_error"] == "RuntimeError: worker exited with 1"


def test_rows_carry_the_profile_and_the_hooks_time(tmp_path):
    s, report = _soak(tmp_path)
    s.row("park", {"first_answer_s": 1.1, "wake_cuda_s": 0.3, "weights_back": {"hook_s": 0.5, "copy_s": 0.36},
                   "decisions": [{"decision": "adopt"}, {"decision": "restored"}], "identical": True}, [], None)
    r = report.data["restores"][0]
    assert (r["profile"], r["t"], r["wake_cuda_s"], r["weights_back_s"], r["weights_copy_s"]) == \
        ("pytorch-offload", 1.1, 0.3, 0.5, 0.36)
    assert report.data["soak"]["profiles"] == {"llama-8b/pytorch-offload/park": {
        "count": 1, "failures": 0, "p50_s": 1.1, "p95_s": 1.1, "p99_s": 1.1}}


def test_the_profile_option_reaches_the_annotation_and_is_refused_when_unknown(tmp_path, capsys):
    base = ["--mode", "cpu", "--bin", str(tmp_path), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]
    assert node.parse_args(base).profile == "pytorch"
    o = node.parse_args(base + ["--profile", "pytorch-offload"])
    assert o.profile == "pytorch-offload" and o.cooperative
    try:
        node.parse_args(base + ["--profile", "vllm"])
        raise AssertionError("vllm accepted")
    except SystemExit as e:
        assert e.code == 2
    assert "invalid choice: 'vllm'" in capsys.readouterr().err
    # The EBADF hunt's flags reach every sandbox through thawd's runsc.flags (THAW_RUNSC_FLAGS).
    o = node.parse_args(base + ["--runsc-flags", " --strace  --strace-syscalls=openat,close "])
    assert o.runsc_flags == "--strace --strace-syscalls=openat,close"


LINE = ("post_restore hooks of thaw-parked-dac908ae-f0f42f26 (pytorch-offload): [{'hook': 'POST "
        ":8000/thaw/restore-weights', 'status': 200, 'seconds': 0.1033, 'output': '{\"restored\": true, "
        "\"seconds\": 0.35,\\n \"bytes\": 16}'}]")


def test_thawds_hook_lines_are_read_back_per_sandbox_and_phase(tmp_path, monkeypatch):
    o = node.Options(mode="cpu", bin=tmp_path, work=tmp_path / "w", out=tmp_path / "o", profile="pytorch-offload")
    n = node.Node(o, node.Report(o.out, {}))
    log = [{"msg": "pre_checkpoint hooks of c1-cold (pytorch-offload): [{'hook': 'POST :8000/thaw/pre-checkpoint', "
                   "'status': 200, 'seconds': 0.1, 'output': ''}, {'hook': 'POST :8000/thaw/offload-weights', "
                   "'status': 200, 'seconds': 0.2, 'output': ''}]"}, {"msg": LINE}]
    monkeypatch.setattr(n, "thawd_log", lambda: log)
    pre = n.hooks_of("c1-cold", "pre_checkpoint")
    assert pre["profile"] == "pytorch-offload"
    assert node.hook_paths(pre) == ["/thaw/pre-checkpoint", "/thaw/offload-weights"]
    assert n.hooks_of("c1-cold", "post_restore") is None
    assert n.hooks_of("thaw-parked-dac908ae-f0f42f26", "post_restore", after=2) is None   # only lines after
    rec: dict = {}
    n.weights_back("parked#1", rec, "thaw-parked-dac908ae-f0f42f26", 0)
    assert rec["weights_back"]["hook_s"] == 0.1033 and rec["weights_back"]["copy_s"] == 0.35
    assert n.r.data["checks"][-1]["ok"], n.r.data["checks"][-1]
    # A hook that answered 500 is not one that ran: the check fails.
    log[1] = {"msg": LINE.replace("'status': 200", "'status': 500")}
    n.weights_back("parked#2", rec, "thaw-parked-dac908ae-f0f42f26", 0)
    assert not n.r.data["checks"][-1]["ok"]


def _check(report, name, ok):
    report.data["checks"].append({"check": name, "ok": ok, "detail": ""})


def test_the_park_template_is_a_cache_row_of_its_own_and_each_adoption_owns_its_checks(tmp_path):
    s, report = _soak(tmp_path)
    tags = []

    def park_rounds(cold, n, tag=""):
        tags.append((n, tag))
        s.node.park_template = {"container": f"c6-park{tag}-seed", "first_answer_s": 21.4}
        _check(report, "park-template: the stand-in restored it", False)     # it started cold
        _check(report, "parked#1: the start adopted a parked sandbox", True)
        _check(report, "parked#2: the start adopted a parked sandbox", False)
        _check(report, "parked: thawd's stop removed every parked sandbox nobody adopted", True)
        return [{"container": f"c6-park{tag}-1", "first_answer_s": 1.0},
                {"container": f"c6-park{tag}-2", "first_answer_s": 1.1}]

    s.node.park_rounds = park_rounds
    s.o.need = lambda what, sec: None
    s.o.step_s = lambda *a: 1.0
    s.parks({}, "key")
    # Two adoptions asked (--park-per-lap 2, 10 restores wanted), named after the lap.
    assert tags == [(2, "-L1")]
    rows = report.data["restores"]
    assert [(r["kind"], r["container"], r["ok"]) for r in rows] == [
        ("cache", "c6-park-L1-seed", False), ("park", "c6-park-L1-1", True), ("park", "c6-park-L1-2", False)]
    assert rows[0]["reason"] == "park-template: the stand-in restored it" and rows[0]["t"] == 21.4
    assert rows[2]["reason"] == "parked#2: the start adopted a parked sandbox"
    # A failed restore's logs are kept when it fails, under a name of the row's own.
    assert s.node.kept == [("c6-park-L1-seed", "001-cache-c6-park-L1-seed"), ("c6-park-L1-2", "003-park-c6-park-L1-2")]
    assert rows[0]["evidence"] == "evidence/001-cache-c6-park-L1-seed.tar.xz" and rows[1]["evidence"] is None


def test_a_template_that_never_answered_is_one_failed_row_with_the_error(tmp_path):
    s, report = _soak(tmp_path)

    def park_rounds(cold, n, tag=""):
        s.node.park_template = None
        s.node.last_started = f"c6-park{tag}-seed"
        raise RuntimeError("c6-park-L1-seed: no first answer")

    s.node.park_rounds = park_rounds
    s.o.need = lambda what, sec: None
    s.o.step_s = lambda *a: 1.0
    s.parks({}, "key")
    rows = report.data["restores"]
    assert [(r["kind"], r["ok"]) for r in rows] == [("cache", False)]
    assert rows[0]["reason"] == "RuntimeError: c6-park-L1-seed: no first answer"
    assert s.node.kept == [("c6-park-L1-seed", "001-cache-c6-park-L1-seed")]


def test_decisions_are_the_latest_starts_only(tmp_path, monkeypatch):
    """A name used again (the soak's laps) must not see an earlier start's decisions
    (the GPU soak of 2026-12-05 counted 10 good adoptions as failed this way)."""
    log = tmp_path / "standin.log"
    monkeypatch.setattr(node, "STANDIN_LOG", str(log))
    n = node.Node.__new__(node.Node)
    n.standin_marks = {}

    def add(cid, decision):
        with log.open("a") as f:
            f.write(json.dumps({"id": cid, "decision": decision, "reason": ""}) + "\n")

    add("c6-park-seed", "restore"), add("c6-park-seed", "restored"), add("c6-park-seed", "released")
    n.standin_marks["c6-park-seed"] = n.standin_lines()
    add("other", "restore"), add("c6-park-seed", "restore"), add("c6-park-seed", "restored")
    assert [d["decision"] for d in n.decisions("c6-park-seed")] == ["restore", "restored"]
    assert [d["decision"] for d in n.decisions("other")] == ["restore"]


def test_evidence_keeps_the_failed_starts_runsc_logs_and_the_tails_of_the_rest(tmp_path, monkeypatch):
    import tarfile
    runsc, logs = tmp_path / "runsc", tmp_path / "logs"
    runsc.mkdir(), logs.mkdir()
    (runsc / "c3-cache-r7.boot.log").write_text("boot of r7\n")
    (runsc / "c3-cache-r70.boot.log").write_text("not this one\n")
    (logs / "thawd.log").write_bytes(b"h" * 4096 + b"the end\n")
    monkeypatch.setattr(node, "RUNSC_LOGS", str(runsc))
    monkeypatch.setattr(node, "STANDIN_LOG", str(tmp_path / "none.log"))
    n = node.Node.__new__(node.Node)
    n.o = types.SimpleNamespace(out=tmp_path / "out")
    n.logs, n.share = logs, tmp_path / "share"
    assert n.evidence("c3-cache-r7", "001-cache-c3-cache-r7") == "evidence/001-cache-c3-cache-r7.tar.xz"
    with tarfile.open(tmp_path / "out/evidence/001-cache-c3-cache-r7.tar.xz") as tar:
        assert sorted(tar.getnames()) == ["runsc/c3-cache-r7.boot.log", "thawd.log"]
    node.write_tar(tmp_path / "small.tar.xz", [(logs / "thawd.log", "thawd.log")], 600)
    with tarfile.open(tmp_path / "small.tar.xz") as tar:
        data = tar.extractfile("thawd.log").read()
    assert data.startswith(b"h" * 100) and data.endswith(b"the end\n") and b"cut by node.py" in data


def test_the_park_rounds_shrink_to_the_budget_before_they_give_up(tmp_path):
    s, report = _soak(tmp_path)
    asked = []

    def park_rounds(cold, n, tag=""):
        asked.append(n)
        s.node.park_template = {"container": "tpl", "first_answer_s": 1.5}
        return [{"container": f"c6-park{tag}-{k}", "first_answer_s": 1.0} for k in range(1, n + 1)]

    s.node.park_rounds = park_rounds
    s.o.step_s = lambda *a: 20.0 * len(a)          # thawd+cache+thawd 60 s, each adoption 20 s
    s.o.time_left = lambda: 85.0                   # one adoption fits, two do not
    s.parks({}, "key")
    assert asked == [1] and [r["kind"] for r in report.data["restores"]] == ["cache", "park"]
    s.o.time_left = lambda: 70.0
    with pytest.raises(node.OutOfTime):
        s.parks({}, "key")


def test_a_restore_that_ran_to_its_end_times_its_kind_and_a_failed_one_does_not(tmp_path):
    s, report = _soak(tmp_path)
    clock = [100.0]
    s.o.clock = lambda: clock[0]
    s.o.need = lambda what, sec: None

    def ok(k):
        clock[0] += 6.0
        return {"container": f"c3-cache-r{k}", "first_answer_s": 1.4}

    def broken(k):
        clock[0] += 0.5
        raise RuntimeError("no first answer")

    s.attempt("cache", ok)
    s.attempt("store", broken)
    assert s.o.seen == {"cache": 6.0}
    assert s.o.step_s("cache") == node.SEEN_MARGIN * 6.0 + node.SEEN_PAD_S
    assert s.o.step_s("store") == node.STEP_S["store"][0]


def test_a_park_lap_times_each_adoption_as_the_whole_laps_wall_over_its_adoptions(tmp_path):
    s, report = _soak(tmp_path)
    clock = [0.0]
    s.o.clock = lambda: clock[0]
    s.o.need = lambda what, sec: None

    def park_rounds(cold, n, tag=""):
        clock[0] += 30.0
        s.node.park_template = {"container": f"c6-park{tag}-seed", "first_answer_s": 1.4}
        return [{"container": f"c6-park{tag}-{k}", "first_answer_s": 0.9} for k in range(1, n + 1)]

    s.node.park_rounds = park_rounds
    s.parks({}, "key")
    assert s.o.seen == {"park": 15.0}
