"""Where a GPU restore's time goes, from what bench/gpu/models.py already
recorded: the result JSON (restore_s, runsc_restore_s per variant) and the
runsc debug logs (tar.xz) of the same run. Prints, per model and variant, the
restore's phases on one clock (the host's, as runsc logs it) and the log lines
each number comes from.

    python3 bench/gpu/restore_breakdown.py bench/results/gpu-2026-11-29.json \
        bench/results/gpu-runsc-logs-2026-11-29-a.tar.xz bench/results/gpu-runsc-logs-2026-11-29-b.tar.xz [--json]

t0 (the driver's clock start, just before it spawns `runsc restore`) is placed
at the restore CLI's exit line minus the runsc_restore_s the driver measured;
the first correct answer at t0 + restore_s.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path

_T = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+)")
_ROW = re.compile(r"^\[(\d\d):(\d\d):(\d\d\.\d+)\]")


def secs(line: str) -> float | None:
    m = _T.match(line) or _ROW.match(line)
    return int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]) if m else None


def first(lines: list[str], needle: str) -> tuple[float, str] | None:
    for ln in lines:
        if needle in ln:
            t = secs(ln)
            if t is not None:
                return t, ln.strip()
    return None


def logs_from(tars: list[Path]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for t in tars:
        with tarfile.open(t) as tf:
            for m in tf.getmembers():
                if m.isfile() and m.name.endswith(".log"):
                    out[Path(m.name).name] = tf.extractfile(m).read().decode(errors="replace").splitlines()
    return out


def one(model: str, variant: str, rec: dict, logs: dict[str, list[str]]) -> dict | None:
    cid = next((n[:-len(".boot.log")] for n in logs if n.startswith(f"tb-{model}-{variant}-")
                and n.endswith(".boot.log") and n[len(f"tb-{model}-{variant}-"):-len(".boot.log")].isdigit()), None)
    if cid is None:
        return None
    boot, cli = logs[f"{cid}.boot.log"], logs.get(f"{cid}.restore.log", [])
    ev = {
        "cli_start": first(cli, "cli.go:275"),
        "cli_exit": first(cli, "Exiting with status"),
        "kernel_loaded": first(boot, "kernel loaded:"),
        "load_started": first(boot, "async loading"),
        "load_done": first(boot, "Async page loading completed"),
        "exec_helper": first(boot, 'EXEC: []string{"cuda-checkpoint", "--toggle"'),
        "helper_rseq": first(boot, "Unsupported syscall rseq"),
        "helper_first_nvproxy": first(boot, "nvproxy: freeing object with unknown handle"),
        "cuda_done": first(boot, "cuda-checkpoint on"),
    }
    missing = [k for k in ("cli_exit", "kernel_loaded", "load_done", "exec_helper", "cuda_done") if ev[k] is None]
    if missing:
        return {"cid": cid, "error": f"missing {missing}"}
    t0 = ev["cli_exit"][0] - rec["runsc_restore_s"]
    answer = t0 + rec["restore_s"]
    load_start = ev["load_started"][0] if ev["load_started"] else t0
    overlap = max(0.0, min(ev["load_done"][0], ev["cuda_done"][0]) - max(load_start, ev["exec_helper"][0]))
    at = {k: (round(v[0] - t0, 3) if v else None) for k, v in ev.items()}
    phases = [
        ("t0 -> kernel loaded (runsc start, sandbox, state file)", ev["kernel_loaded"][0] - t0),
        ("kernel loaded -> cuda-checkpoint helper exec'd", ev["exec_helper"][0] - ev["kernel_loaded"][0]),
        ("CUDA restore toggle (exec -> 'cuda-checkpoint on 1 processes took')", ev["cuda_done"][0] - ev["exec_helper"][0]),
        ("CUDA done -> first correct answer (request)", answer - ev["cuda_done"][0]),
    ]
    return {
        "cid": cid,
        "restore_s": rec["restore_s"],
        "runsc_restore_s": rec["runsc_restore_s"],
        "phases": [{"phase": p, "seconds": round(s, 3)} for p, s in phases],
        "at_s_after_t0": {**at, "first_answer": round(answer - t0, 3)},
        "page_loading_s": round(ev["load_done"][0] - load_start, 3),
        "cuda_restore_overlapping_page_loading_s": round(overlap, 3),
        "cuda_restore_after_pages_loaded_s": round(ev["cuda_done"][0] - max(ev["load_done"][0], ev["exec_helper"][0]), 3),
        "helper_exec_to_rseq_ms": round((ev["helper_rseq"][0] - ev["exec_helper"][0]) * 1e3, 1) if ev["helper_rseq"] else None,
        "helper_exec_to_first_nvproxy_line_ms": round((ev["helper_first_nvproxy"][0] - ev["exec_helper"][0]) * 1e3, 1)
        if ev["helper_first_nvproxy"] else None,
        "lines": {k: v[1][:200] for k, v in ev.items() if v},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("tars", type=Path, nargs="+")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = json.loads(a.results.read_text())
    logs = logs_from(a.tars)
    out: dict = {}
    for model, m in res["models"].items():
        for variant, rec in m.get("variants", {}).items():
            r = one(model, variant, rec, logs)
            if r:
                out.setdefault(model, {})[variant] = r
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    for model, vs in out.items():
        for variant, r in vs.items():
            if "error" in r:
                print(f"{model} {variant}: {r['error']}")
                continue
            print(f"== {model} {variant}: restore {r['restore_s']} s (runsc restore returns {r['runsc_restore_s']} s)")
            for p in r["phases"]:
                print(f"   {p['seconds']:7.3f} s  {p['phase']}")
            print(f"   page loading {r['page_loading_s']} s; CUDA restore overlapping it {r['cuda_restore_overlapping_page_loading_s']} s,"
                  f" after it {r['cuda_restore_after_pages_loaded_s']} s; helper exec->rseq {r['helper_exec_to_rseq_ms']} ms,"
                  f" exec->first nvproxy line {r['helper_exec_to_first_nvproxy_line_ms']} ms")
            print(f"   at (s after t0): {r['at_s_after_t0']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
