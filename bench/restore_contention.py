"""Does runsc's background page loading slow down the restored sandbox's own
processes? (CPU only; the question behind docs/gpu.md "Where the restore time
goes": the in-sandbox CUDA restore runs 2x slower when it overlaps page loading.)

    python3 bench/restore_contention.py --runsc build/runsc --mib 6144 --out /tmp/rc.json

A static probe (bench/restore_probe.c) fills --mib of memory in a runsc
sandbox, then reports every 20 ms how much user-space arithmetic it got done
in 10 ms, how many getppid() round trips through the sentry in the other 10 ms
and the slowest of them, and (every 100 ms) how
long a posix_spawn+wait of a no-op exec took. The sandbox is checkpointed, the
image read once into the page cache, and restored twice: with --background
(pages load while the probe runs) and without (the probe runs only after all
pages are loaded). The slots while pages still loaded are compared with the
slots after, using the sentry's own log lines ("Async page loading completed
in ...") for the boundary.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from probe_sandbox import make, read_once, sh  # noqa: E402

_TS = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+)")


def log_time(line: str) -> float | None:
    """Epoch seconds of a glog line (local time, this year)."""
    m = _TS.match(line)
    if not m:
        return None
    mo, d, h, mi, s = m.groups()
    sec = float(s)
    t = dt.datetime(dt.date.today().year, int(mo), int(d), int(h), int(mi), int(sec), int(round((sec % 1) * 1e6)) % 1000000)
    return t.timestamp()


def find_line(text: str, needle: str) -> tuple[float, str] | None:
    for line in text.splitlines():
        if needle in line:
            return log_time(line), line.strip()
    return None


def slots(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) == 5:
            out.append({"t": int(f[0]) / 1e9, "units": int(f[1]), "calls": int(f[2]),
                        "max_syscall_ms": int(f[3]) / 1e6, "spawn_ms": int(f[4]) / 1e6})
    return out


def summarize(ss: list[dict]) -> dict:
    if not ss:
        return {"slots": 0}
    spawns = [s["spawn_ms"] for s in ss if s["spawn_ms"] > 0]
    return {
        "slots": len(ss),
        "units_per_slot_median": statistics.median(s["units"] for s in ss),
        "syscalls_per_slot_median": statistics.median(s["calls"] for s in ss),
        "max_syscall_ms_median": round(statistics.median(s["max_syscall_ms"] for s in ss), 3),
        "max_syscall_ms_max": round(max(s["max_syscall_ms"] for s in ss), 3),
        "spawn_ms_median": round(statistics.median(spawns), 3) if spawns else None,
        "spawn_ms_max": round(max(spawns), 3) if spawns else None,
        "spawns": len(spawns),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runsc", required=True)
    ap.add_argument("--mib", type=int, default=6144)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-rc"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--after-s", type=float, default=3.0, help="seconds of slots kept after loading ends")
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    runsc = str(Path(a.runsc).resolve())

    box = make(a.work, runsc, HERE / "restore_probe.c", ["/share/probe.log", str(a.mib)])
    share, logs, img, bundle, g = box.share, box.logs, box.image, box.bundle, box.runsc

    res: dict = {"benchmark": "restore-contention", "date": time.strftime("%Y-%m-%d"), "mib": a.mib,
                 "cpus": os.cpu_count(), "runsc": sh(runsc, "--version").splitlines()[0], "runs": {}}
    sh(*g, "run", "--bundle", str(bundle), "--detach", "rc-cold")
    end = time.time() + 300
    while not (share / "probe.log.ready").exists():
        if time.time() > end:
            raise TimeoutError("probe never got ready")
        time.sleep(0.1)
    time.sleep(2.0)
    t0 = time.time()
    sh(*g, "checkpoint", f"--image-path={img}", "rc-cold", timeout=600)
    res["checkpoint_s"] = round(time.time() - t0, 3)
    res["image_bytes"] = sum(p.stat().st_size for p in img.iterdir())
    before = [s for s in slots(share / "probe.log") if s["t"] < t0]
    res["before_checkpoint"] = summarize(before[-50:])
    sh(*g, "delete", "--force", "rc-cold")

    for name, background in (("background", True), ("no-background", False)):
        (share / "probe.log").write_text("")       # the restored probe holds it open: keep the file
        read_once(img)                              # warm page cache, as on the H200 ("thaw" variant)
        cid = f"rc-{name}"
        t_restore = time.time()
        sh(*g, "restore", f"--image-path={img}", "--bundle", str(bundle), "--detach",
           *(["--background"] if background else []), cid, timeout=600)
        runsc_restore_s = time.time() - t_restore
        boot = logs / f"{cid}.boot.log"
        done = None
        end = time.time() + 300
        while done is None and time.time() < end:
            done = find_line(boot.read_text(errors="replace") if boot.exists() else "", "Async page loading completed")
            time.sleep(0.2)
        time.sleep(a.after_s + 0.5)
        sh(*g, "kill", cid, "KILL")
        time.sleep(0.3)
        sh(*g, "delete", "--force", cid)
        text = boot.read_text(errors="replace")
        start = find_line(text, "Timer for Restore: Starting")
        started = find_line(text, "async loading")
        if done is None or start is None:
            raise RuntimeError(f"{name}: restore lines missing in {boot}")
        # Lines the probe buffered before the checkpoint are flushed after the
        # restore: keep only slots that ended after the restore started.
        ss = [s for s in slots(share / "probe.log") if s["t"] > start[0]]
        t_done = done[0]
        during = [s for s in ss if s["t"] < t_done]
        after = [s for s in ss if t_done + 0.5 <= s["t"] <= t_done + 0.5 + a.after_s]
        res["runs"][name] = {
            "runsc_restore_s": round(runsc_restore_s, 3),
            "log": {"restore_start": start[1], "loading": started[1] if started else None, "loading_done": done[1]},
            "first_slot_after_restore_start_s": round(ss[0]["t"] - start[0], 3) if ss else None,
            "loading_done_after_restore_start_s": round(t_done - start[0], 3),
            "while_loading": summarize(during),
            "after_loading": summarize(after),
        }
        print(json.dumps({name: res["runs"][name]}, indent=1), flush=True)
    a.out.write_text(json.dumps(res, indent=2))
    shutil.copytree(logs, a.out.parent / (a.out.stem + "-logs"), dirs_exist_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
