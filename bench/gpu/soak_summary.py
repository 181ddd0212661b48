#!/usr/bin/env python3
"""Merge GPU soak runs (bench/gpu/soak.py's soak.json, issue 32 item 3) into one table:
per model and kind the count, failures and restore-time (first answer) p50/p95/p99, and
the cumulative totals. Runs of different builds (soak.py's build_identity: runsc, the
carried Go binaries and thaw's Python, by content) are refused: the issue's count is
cumulative on one build. The commit each run names is shown, not compared. Runs on
different GPU models (soak.json's machine.nvidia_smi: the H200 and an H100 answer at
different speeds) are refused too: their percentiles are not one distribution.

  python3 bench/gpu/soak_summary.py RUN.json [RUN.json ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


class MergeRefused(Exception):
    pass


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile, linear between the closest ranks (numpy's default)."""
    v = sorted(values)
    if not v:
        return None
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return round(v[lo] + (v[hi] - v[lo]) * (pos - lo), 3)


def per_kind(rows: list[dict]) -> dict:
    """Count, failures and p50/p95/p99 of the ok restores' times, per kind, per model and
    kind, and per model, workload profile and kind (a parked pytorch-offload ~8B restore,
    issue 32's parked-cooperative, is llama-8b/pytorch-offload/park)."""
    def table(key) -> dict:
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(key(r), []).append(r)
        out = {}
        for k, rs in sorted(groups.items()):
            t = [r["t"] for r in rs if r.get("ok") and isinstance(r.get("t"), (int, float))]
            out[k] = {"count": len(rs), "failures": sum(1 for r in rs if not r.get("ok")),
                      **{f"p{q}_s": percentile(t, q) for q in (50, 95, 99)}}
        return out
    # A row without a profile is from before soak.py's --profile, when every run was pytorch's.
    return {"restores": len(rows), "failures": sum(1 for r in rows if not r.get("ok")),
            "kinds": table(lambda r: r["kind"]),
            "models": table(lambda r: f"{r.get('model')}/{r['kind']}"),
            "profiles": table(lambda r: f"{r.get('model')}/{r.get('profile') or 'pytorch'}/{r['kind']}")}


IDENTITY = ("runsc_sha256", "bins_sha256", "product_sha256")


def gpu_of(run: dict) -> str:
    """The GPU model of a run: the name field of node.py's `nvidia-smi --query-gpu=index,name,...`
    line (machine.nvidia_smi), "cpu" for a CPU rehearsal, "unknown" without it."""
    if run.get("mode") == "cpu":
        return "cpu"
    smi = str((run.get("machine") or {}).get("nvidia_smi") or "")
    parts = [x.strip() for x in smi.splitlines()[0].split(",")] if smi else []
    return parts[1] if len(parts) > 1 else "unknown"


def merge(runs: list[dict]) -> dict:
    ids = [{k: (r.get("build") or {}).get(k) for k in IDENTITY} for r in runs]
    builds = {json.dumps(i, sort_keys=True) for i in ids}
    if len(builds) != 1 or any(not all(i.values()) for i in ids):
        raise MergeRefused(f"runs of different or unknown builds: {sorted(builds)}")
    gpus = sorted({gpu_of(r) for r in runs})
    if len(gpus) != 1:
        raise MergeRefused(f"runs on different GPU models: {gpus}")
    rows = [row for r in runs for row in r.get("restores", [])]
    return {"build": ids[0], "gpu": gpus[0],
            "commits": sorted({str((r.get("build") or {}).get("thaw_commit")) for r in runs}),
            "runs": len(runs), **per_kind(rows)}


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not paths:
        print("soak_summary.py: name at least one soak.json", file=sys.stderr)
        return 2
    try:
        runs = [json.loads(p.read_text()) for p in paths]
        print(json.dumps(merge(runs), indent=2))
    except (OSError, ValueError) as e:
        print(f"soak_summary.py: {e}", file=sys.stderr)
        return 2
    except MergeRefused as e:
        print(f"soak_summary.py: refused: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
