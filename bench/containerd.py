"""containerd benchmark: `ctr run` to first answer, cold vs restored, and the
stand-in's overhead on pass-through calls, side by side in one run.

    .venv/bin/python bench/containerd.py [--repeat 3] [--weights-mb 256] [--warmup-rounds 6] [--out FILE]

Runs a complete loopback thaw node (control/dev/testbed.py: SeaweedFS, thawd, a
private containerd with gVisor's shim and thaw's stand-in). The workload is a
busybox shell whose warm-up (random "weights" in memory, hashed several
times) stands in for a model server's start-up;
"first answer" is the first `ctr task exec ... cat /tmp/state` that succeeds.
Cold runs are the same image without the opt-in annotation (plain runsc
through the stand-in); restored runs are opted in and find the image thawd
published after the first cold start.
"""
from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import emit  # noqa: E402
from control.dev.testbed import ANNOTATIONS, BUILD, IMAGE, Stack  # noqa: E402


def first_answer(s: Stack, cid: str, annotations: dict | None, env: dict) -> tuple[float, float, str]:
    """(seconds in `ctr run`, seconds to first answer, boot id)."""
    t0 = time.monotonic()
    s.ctrd.run(IMAGE, cid, annotations, env=env)
    t_run = time.monotonic() - t0
    boot, _ = s.state(cid, timeout_s=300)
    return t_run, time.monotonic() - t0, boot


def passthrough_overhead(s: Stack, cid: str, n: int) -> dict:
    root = str(s.ctrd.runsc_root / "thaw")
    env = {"THAW_REAL_RUNSC": str(BUILD / "runsc"), "PATH": "/usr/bin:/bin"}
    times: dict[str, list[float]] = {"runsc": [], "stand-in": []}
    for i in range(n):
        for label, exe in (("runsc", BUILD / "runsc"), ("stand-in", BUILD / "thaw-runsc")):
            t0 = time.perf_counter()
            subprocess.run([str(exe), f"--root={root}", "state", cid], env=env, capture_output=True, check=True)
            times[label].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"calls_each": n, "command": "state", "runsc_median_ms": round(med["runsc"] * 1e3, 2),
            "standin_median_ms": round(med["stand-in"] * 1e3, 2),
            "added_ms": round((med["stand-in"] - med["runsc"]) * 1e3, 2),
            "ratio": round(med["stand-in"] / med["runsc"], 3)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weights-mb", type=int, default=256, help="in-memory 'weights' the workload makes at start")
    ap.add_argument("--warmup-rounds", type=int, default=6, help="hash passes over the weights at start")
    ap.add_argument("--calls", type=int, default=100, help="pass-through calls per binary")
    ap.add_argument("--no-background", action="store_true",
                    help="thawd with checkpoint.restore_background off (every page loaded before the workload runs)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--base", type=Path, default=Path("/var/tmp/thaw-bench-containerd"))
    a = ap.parse_args()
    shutil.rmtree(a.base, ignore_errors=True)
    s = Stack(a.base, "bench-containerd",
              {"THAW_CHECKPOINT_RESTORE_BACKGROUND": "0"} if a.no_background else None)
    env = {"WEIGHTS_MB": str(a.weights_mb), "WARMUP_ROUNDS": str(a.warmup_rounds)}
    result: dict = {"benchmark": "containerd", "date": time.strftime("%Y-%m-%d"), "restore_background": not a.no_background,
                    "machine": f"{platform.node()} ({platform.machine()}, {__import__('os').cpu_count()} cores)",
                    "workload": f"busybox sh: {a.weights_mb} MB of random 'weights' in sandbox memory, hashed "
                                f"{a.warmup_rounds} times at start; a counter in memory",
                    "repeat": a.repeat}
    try:
        s.start()
        # The first opted-in cold start publishes the image (thawd auto-checkpoint).
        _, seed_s, boot = first_answer(s, "seed", ANNOTATIONS, env)
        s.wait_published(300)
        s.ctrd.remove("seed")
        cold, warm = [], []
        for i in range(a.repeat):
            t_run, t, b = first_answer(s, f"cold{i}", None, env)
            assert b != boot
            cold.append({"ctr_run_s": round(t_run, 3), "first_answer_s": round(t, 3)})
            s.ctrd.remove(f"cold{i}")
            t_run, t, b = first_answer(s, f"warm{i}", ANNOTATIONS, env)
            assert b == boot, "restored runs carry the seed's memory"
            warm.append({"ctr_run_s": round(t_run, 3), "first_answer_s": round(t, 3)})
            if i < a.repeat - 1:
                s.ctrd.remove(f"warm{i}")
        result["passthrough"] = passthrough_overhead(s, f"warm{a.repeat - 1}", a.calls)
        cm = statistics.median(x["first_answer_s"] for x in cold)
        wm = statistics.median(x["first_answer_s"] for x in warm)
        result.update(seed_cold_start_s=round(seed_s, 3), cold=cold, restored=warm,
                      cold_first_answer_median_s=cm, restored_first_answer_median_s=wm,
                      speedup=round(cm / wm, 2), counters=s.stats()["counters"])
    finally:
        s.stop()
        shutil.rmtree(a.base, ignore_errors=True)
    return emit(result, a.out)


if __name__ == "__main__":
    sys.exit(main())
