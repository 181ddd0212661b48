"""Summarize the strace lines of runsc restore logs (bench/gpu/run-strace-restore.sh):
for each restore boot log, the window from runsc's EXEC of cuda-checkpoint to
"cuda-checkpoint on N processes took", per process and syscall kind: count,
time inside the sentry (the duration runsc's strace prints on each exit line),
the largest single calls, and the first/last call of each process.

    python3 bench/gpu/strace_summary.py DIR_WITH_RUNSC_LOGS [--json]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runsc_logs import go_duration  # noqa: E402

_T = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+)")
_X = re.compile(r"\[\s*(\d+):\s*(\d+)\] (\S+) X (\w+)\((.*)\) = (.*) \(([0-9.]+[a-zµ]+)\)\s*$")


def secs(line: str) -> float | None:
    m = _T.match(line)
    return int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]) if m else None


def kind(name: str, args: str) -> str:
    """ioctl: device and NVIDIA escape number (nr), e.g. ioctl nvidiactl 0x2a;
    mmap: the file mapped, if a device."""
    parts = [a.strip() for a in args.split(",")]
    if name == "ioctl" and len(parts) >= 2:
        dev = parts[0].split(" ", 1)[1] if " " in parts[0] else parts[0]
        dev = dev.rsplit("/", 1)[-1]
        try:
            cmd = int(parts[1], 16)
        except ValueError:
            return f"ioctl {dev} {parts[1]}"
        if dev.startswith("nvidia-uvm"):
            return f"ioctl {dev} {cmd:#x}"
        return f"ioctl {dev} nr={cmd & 0xff:#x}"
    if name == "mmap" and len(parts) >= 5 and "/dev/" in parts[4]:
        return f"mmap {parts[4].split(' ', 1)[1]}"
    return name


def windows(lines: list[str]) -> list[tuple[str, float, float, str | None]]:
    """The toggles in one boot log: (what, start, end, runsc's own duration).
    "restore": the toggle runsc starts as the restore's last step, from its EXEC to
    "cuda-checkpoint on N processes took"; "exec toggle N": a --toggle started with
    `runsc exec` (a parked sandbox's park and demand), from its EXEC to the next EXEC
    or the log's end."""
    out: list = []
    t_exec = None
    execs: list[tuple[float, bool]] = []       # every `runsc exec`: (time, is a --toggle)
    for ln in lines:
        if 'EXEC: []string{"cuda-checkpoint", "--toggle"' in ln:
            if t_exec is None and not out:
                t_exec = secs(ln)
        elif "EXEC: []string{" in ln:
            execs.append((secs(ln), '"--toggle"' in ln))
        elif t_exec is not None and "cuda-checkpoint on" in ln and "took" in ln:
            out.append(("restore", t_exec, secs(ln), ln.split("took", 1)[1].strip()))
            t_exec = None
    last = next((secs(ln) for ln in reversed(lines) if secs(ln) is not None), None)
    toggles = [t for t, is_toggle in execs if is_toggle]
    for n, t in enumerate(toggles, 1):
        end = min([e for e, _ in execs if e > t] + ([last] if last is not None else []), default=t)
        out.append((f"exec toggle {n}", t, end, None))
    return out


def summarize(path: Path) -> dict:
    """Every toggle window of one boot log (windows)."""
    lines = path.read_text(errors="replace").splitlines()
    found = windows(lines)
    if not found:
        return {"log": path.name, "error": "no cuda-checkpoint restore window"}
    return {"log": path.name, "windows": [summarize_window(lines, *w) for w in found]}


def summarize_window(lines: list[str], what: str, t_exec: float, t_done: float, took: str | None) -> dict:
    by_kind: dict = defaultdict(lambda: [0, 0.0])
    procs: dict = {}
    top: list = []
    last_exit: dict = {}          # thread -> (time of its last exit line, that call)
    gaps: list = []               # (seconds with no traced call in flight, thread, call before, call after)
    for ln in lines:
        t = secs(ln)
        if t is None or t < t_exec or t > t_done + 1e-6:
            continue
        m = _X.search(ln)
        if not m:
            continue
        pid, tid, comm, name, args, _, dur = m.groups()
        d = go_duration(dur)
        k = (f"{comm}[{pid}]", kind(name, args))
        by_kind[k][0] += 1
        by_kind[k][1] += d
        p = procs.setdefault(f"{comm}[{pid}]", {"calls": 0, "in_syscalls_s": 0.0, "first_s": t - t_exec,
                                               "last_s": t - t_exec, "threads": set()})
        p["calls"] += 1
        p["in_syscalls_s"] += d
        p["last_s"] = t - t_exec
        p["threads"].add(int(tid))
        top.append((d, round(t - t_exec, 4), f"{comm}[{pid}:{tid}]", kind(name, args)))
        who = f"{comm}[{pid}:{tid}]"
        if who in last_exit:
            t_prev, k_prev = last_exit[who]
            gaps.append((t - d - t_prev, round(t_prev - t_exec, 4), who, k_prev, kind(name, args)))
        last_exit[who] = (t, kind(name, args))
    top.sort(reverse=True)
    return {
        "window": what,
        "window_s": round(t_done - t_exec, 4),
        "runsc_says": took,
        "processes": {k: {**{x: (round(y, 4) if isinstance(y, float) else y) for x, y in v.items() if x != "threads"},
                          "threads": len(v["threads"])} for k, v in procs.items()},
        "by_kind": sorted(({"process": k[0], "kind": k[1], "calls": v[0], "seconds": round(v[1], 4)}
                           for k, v in by_kind.items()), key=lambda r: -r["seconds"]),
        "largest_calls": [{"seconds": round(d, 4), "at_s": at, "who": who, "kind": kd} for d, at, who, kd in top[:12]],
        # Longest stretches in which a thread had no traced call in flight (the
        # time between one call's exit and the next one's entry).
        "longest_gaps": [{"seconds": round(g, 4), "from_s": at, "who": who, "after": a, "before": b}
                         for g, at, who, a, b in sorted(gaps, reverse=True)[:5]],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("logdir", type=Path)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = [summarize(p) for p in sorted(a.logdir.glob("*.boot.log")) if "cold" not in p.name]
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    for s, log in ((s, log) for log in out for s in log.get("windows", [log])):
        print(f"== {log['log']} {s.get('window', '')}: window {s.get('window_s')} s (runsc: {s.get('runsc_says')})")
        for name, p in s.get("processes", {}).items():
            print(f"  {name}: {p['calls']} calls on {p['threads']} threads, {p['in_syscalls_s']} s inside them, "
                  f"first at +{p['first_s']} s, last at +{p['last_s']} s")
        for r in s.get("by_kind", [])[:15]:
            print(f"    {r['process']:24} {r['kind']:34} {r['calls']:6} calls {r['seconds']:8.4f} s")
        for r in s.get("largest_calls", [])[:8]:
            print(f"    largest: {r['seconds']} s at +{r['at_s']} s {r['who']} {r['kind']}")
        for r in s.get("longest_gaps", [])[:3]:
            print(f"    no traced call: {r['seconds']} s from +{r['from_s']} s in {r['who']}, after {r['after']}, before {r['before']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
