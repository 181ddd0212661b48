"""bench/gpu/soak_summary.py: the soak's per-kind percentiles and the merge that refuses
runs of different builds (issue 32 item 3: the count is cumulative on one build)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_gpu_soak_summary", REPO / "bench/gpu/soak_summary.py")
summary = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = summary
spec.loader.exec_module(summary)

BUILD = {"runsc_sha256": "a" * 64, "bins_sha256": "b" * 64, "product_sha256": "c" * 64, "thaw_commit": "f0dd438"}


def _run(model: str, kind: str, times: list[float], fail: int = 0, build: dict = BUILD) -> dict:
    rows = [{"kind": kind, "model": model, "t": t, "ok": True, "reason": None} for t in times]
    rows += [{"kind": kind, "model": model, "t": None, "ok": False, "reason": "cold"}] * fail
    return {"build": dict(build), "restores": rows}


def test_percentiles_interpolate_between_ranks():
    v = [float(x) for x in range(1, 101)]   # 1..100
    assert summary.percentile(v, 50) == 50.5
    assert summary.percentile(v, 95) == 95.05
    assert summary.percentile(v, 99) == 99.01
    assert summary.percentile([2.2], 99) == 2.2
    assert summary.percentile([], 50) is None
    assert summary.percentile([3.0, 1.0, 2.0], 50) == 2.0   # unsorted input


def test_per_kind_counts_failures_and_times_only_ok_restores():
    s = summary.per_kind(_run("gpt2-large", "cache", [1.0, 2.0, 3.0], fail=2)["restores"])
    assert s["restores"] == 5 and s["failures"] == 2
    assert s["kinds"]["cache"] == {"count": 5, "failures": 2, "p50_s": 2.0, "p95_s": 2.9, "p99_s": 2.98}


def test_merge_adds_runs_of_one_build_per_model_and_kind():
    m = summary.merge([_run("gpt2-large", "cache", [2.2, 2.4]), _run("llama-8b", "park", [1.4]),
                       _run("gpt2-large", "cache", [2.3])])
    assert m["runs"] == 3 and m["restores"] == 4 and m["failures"] == 0
    assert m["models"]["gpt2-large/cache"]["count"] == 3 and m["models"]["gpt2-large/cache"]["p50_s"] == 2.3
    assert m["models"]["llama-8b/park"]["count"] == 1 and m["kinds"]["park"]["p99_s"] == 1.4


@pytest.mark.parametrize("other", [{**BUILD, "runsc_sha256": "d" * 64}, {**BUILD, "bins_sha256": "d" * 64},
                                   {**BUILD, "product_sha256": "d" * 64}, {**BUILD, "product_sha256": None},
                                   {"runsc_sha256": "a" * 64, "thaw_commit": "f0dd438"}])
def test_merge_refuses_runs_of_another_or_unknown_build(other, tmp_path, capsys):
    runs = [_run("gpt2-large", "cache", [2.2]), _run("llama-8b", "park", [1.4], build=other)]
    with pytest.raises(summary.MergeRefused, match="builds"):
        summary.merge(runs)
    paths = []
    for i, r in enumerate(runs):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(r))
    assert summary.main([str(p) for p in paths]) == 1
    assert "refused" in capsys.readouterr().err


def test_merge_counts_runs_of_one_build_under_different_commits():
    """The soak's scripts may change between sessions: the commit is shown, not compared."""
    m = summary.merge([_run("gpt2-large", "cache", [2.2]),
                       _run("llama-8b", "park", [1.4], build={**BUILD, "thaw_commit": "1234567"})])
    assert m["restores"] == 2 and m["commits"] == ["1234567", "f0dd438"] and "thaw_commit" not in m["build"]


def test_rows_are_counted_per_profile_too_and_rows_before_the_option_were_pytorchs():
    old = _run("llama-8b", "park", [3.5])                       # a run from before soak.py's --profile
    coop = _run("llama-8b", "park", [1.2, 1.3])
    for r in coop["restores"]:
        r["profile"] = "pytorch-offload"
    m = summary.merge([old, coop])
    assert m["models"]["llama-8b/park"]["count"] == 3
    assert m["profiles"]["llama-8b/pytorch/park"]["count"] == 1
    assert m["profiles"]["llama-8b/pytorch-offload/park"] == {"count": 2, "failures": 0, "p50_s": 1.25,
                                                               "p95_s": 1.295, "p99_s": 1.299}


def test_reread_counts_stale_decision_failures_ok_and_templates_as_cache_rows():
    """bench/gpu/soak_reread.py on a run of the harness before 2026-12-05's fix: only a park row
    failed by the stale-decision checks alone, with this start's adopt/restored, turns ok."""
    spec2 = importlib.util.spec_from_file_location("bench_gpu_soak_reread", REPO / "bench/gpu/soak_reread.py")
    reread = importlib.util.module_from_spec(spec2)
    spec2.loader.exec_module(reread)
    stale = "parked#1: the start adopted a parked sandbox (stand-in: adopt, restored)"
    d = {"model": "gpt2-large", "cold": {"boot": "b0"}, "restores": [
        {"i": 1, "kind": "park", "container": "c6-park-1", "t": 1.0, "ok": False, "reason": stale,
         "decisions": ["adopt", "restored", "released", "adopt", "restored"]},
        {"i": 2, "kind": "park", "container": "c6-park-2", "t": 1.1, "ok": False,
         "reason": stale + "; parked#2: it answers identically", "decisions": ["adopt", "restored"]},
        {"i": 3, "kind": "park", "container": "c6-park-1", "t": 0.9, "ok": False, "reason": stale,
         "decisions": ["adopt", "restore-failed", "started-cold-after-failed-restore"]}],
        "steps": [{"step": "park_template", "first_answer_s": 1.5, "boot": "b0", "container": "c6-park-seed",
                   "decisions": [{"decision": "released"}, {"decision": "restore"}, {"decision": "restored"}]},
                  {"step": "park_template", "first_answer_s": 21.4, "boot": "b1", "container": "c6-park-seed",
                   "decisions": [{"decision": "restore-failed"}, {"decision": "started-cold-after-failed-restore"}]}]}
    r = reread.reread(d)
    assert r["fixed_rows"] == [1]
    assert [(x["i"], x["kind"]) for x in r["failed"]] == [(2, "park"), (3, "park"), (None, "cache")]
    assert r["soak"]["kinds"]["cache"]["count"] == 2 and r["soak"]["kinds"]["cache"]["failures"] == 1


def test_merge_refuses_runs_on_different_gpu_models():
    h200 = {**_run("gpt2-large", "cache", [1.5]),
            "machine": {"nvidia_smi": "0, NVIDIA H200, GPU-1, 580.159.04, 143771 MiB"}}
    h100 = {**_run("gpt2-large", "cache", [2.1]),
            "machine": {"nvidia_smi": "0, NVIDIA H100 80GB HBM3, GPU-2, 580.159.04, 81559 MiB"}}
    assert summary.merge([h200, dict(h200)])["gpu"] == "NVIDIA H200"
    with pytest.raises(summary.MergeRefused, match="different GPU models"):
        summary.merge([h200, h100])
