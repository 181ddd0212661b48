"""The demo as a benchmark: `thaw demo --json` N times, medians and every run.

    .venv/bin/python bench/demo.py [--runs 3] [--out bench/results/demo-<date>.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

THAW = Path(sys.executable).parent / "thaw"
KEYS = ("cold_start_s", "checkpoint_s", "image_bytes", "restore_s", "speedup")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    runs = []
    for _ in range(a.runs):
        p = subprocess.run([str(THAW), "demo", "--json"], capture_output=True, text=True, timeout=900)
        r = json.loads(p.stdout)
        runs.append({k: r[k] for k in (*KEYS, "verified", "model_mb", "in_sandbox_startup_s", "runsc_restore_s")})
    result = {"benchmark": "demo", "date": time.strftime("%Y-%m-%d"),
              "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)",
              "load_average_at_end": os.getloadavg(), "runs": runs,
              "verified_all": all(r["verified"] for r in runs),
              **{f"median_{k}": statistics.median(r[k] for r in runs) for k in KEYS}}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0 if result["verified_all"] else 1


if __name__ == "__main__":
    sys.exit(main())
