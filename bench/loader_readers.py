"""The background page loader's readers on a CPU image: thaw's runsc against a
build with fewer readers, side by side in one run (issue 17's loader lever,
docs/gpu.md "Measured (H200, 2026-12-01)"; upstream gVisor PR #14568).

    flock /tmp/thaw-heavy.lock .venv/bin/python bench/loader_readers.py \\
        --alt build/runsc-readers8 [--no-background] [--mb 2048] [--reps 5] [--out bench/results/loader-readers-DATE.json]

One image: control/dev/workloads/memory_server.py holding MB MiB of seeded
random bytes, run with `thaw run`, checkpointed with `thaw checkpoint`. Then
`reps` rounds, each restoring the same image once with build/runsc and once
with --alt (order alternating between rounds), each through `thaw restore
IMAGE` with checkpoint.restore_background on (`runsc restore --background`, the
server runs while pages load; thaw's default since 2026-12-01), and with
--no-background a third time with build/runsc and that setting off (every page
loaded before the server runs), in two page cache states: "hot" (the image's files read just before) and "cold" (page
cache dropped). Per restore: the command's time to the first /ping answer, and
to the answer of /sum (every byte read back from the restored memory and
hashed: the whole memory file loaded). Every answer's boot id and the digest
must be the checkpoint's. On the H200 the GPU restores are measured by
bench/gpu/run-speed.sh; this says what the same change does where no GPU is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from probe_sandbox import read_once  # noqa: E402
from report import spread  # noqa: E402
from stream import PORT, THAW, WORKLOAD, drop_caches, first_answer, get, thaw  # noqa: E402

BUILD = REPO / "build"
SUBNET = "10.214.64.0/20"


def env_for(work: Path, runsc: Path, background: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_"))}
    env.update({"THAW_CONFIG": "/dev/null", "THAW_NODE_STATE_DIR": str(work / "state"),
                "THAW_NODE_LOG_DIR": str(work / "log"), "THAW_RUNSC_ROOT": str(work / "runsc-root"),
                "THAW_RUNSC_PATH": str(runsc), "THAW_NETWORK_SUBNET": SUBNET,
                "THAW_CACHE_DIR": str(work / "cache"),
                "THAW_CHECKPOINT_RESTORE_BACKGROUND": "1" if background else "0"})
    return env


def page_cache(image: Path, state: str) -> None:
    drop_caches()
    if state == "hot":
        read_once(image)


def one(env: dict, image: Path, sid: str, src: dict, state: str, label: str) -> dict:
    page_cache(image, state)
    t0 = time.monotonic()
    p = subprocess.Popen([str(THAW), "restore", str(image), "--id", sid, "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        _, t_first = first_answer(src["host"], t0, 300)
        answer = get(src["host"], "/sum", 600)
        t_sum = time.monotonic() - t0
        out, err = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"{label} restore failed ({p.returncode}): {err[-3000:]}")
    r = json.loads(out)
    thaw(env, "delete", sid, "--force")
    if answer["boot"] != src["boot"] or answer["digest"] != src["digest"]:
        raise RuntimeError(f"{label}: the restored memory is not the checkpoint's: {answer} vs {src}")
    return {"runsc": label, "cache": state, "first_answer_s": round(t_first, 4), "all_memory_s": round(t_sum, 4),
            "runsc_restore_s": r.get("runsc_restore_s")}


def clean(work: Path) -> None:
    """runsc --network=none leaves a network namespace bind-mounted in its root
    directory (runsc-root/null-netns): unmount what is under `work`, then remove it."""
    for line in reversed(Path("/proc/mounts").read_text().splitlines()):
        where = line.split()[1]
        if where.startswith(str(work) + "/"):
            subprocess.run(["umount", where], check=False)
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alt", type=Path, required=True, help="the other runsc (bench/gpu/build-runsc-variant.sh)")
    ap.add_argument("--no-background", action="store_true",
                    help="a third arm: thaw's runsc with checkpoint.restore_background off")
    ap.add_argument("--mb", type=int, default=2048, help="MiB of server memory")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-bench/loader"))
    ap.add_argument("--out", type=Path, default=REPO / "bench/results" / f"loader-readers-{date.today().isoformat()}.json")
    a = ap.parse_args()
    clean(a.work)
    a.work.mkdir(parents=True)
    runscs = {"thaw": BUILD / "runsc", a.alt.name: a.alt.resolve()}
    arms = {label: (path, True) for label, path in runscs.items()}   # label -> (runsc, --background)
    if a.no_background:
        arms["thaw-no-background"] = (runscs["thaw"], False)
    env = env_for(a.work, runscs["thaw"])
    sid = "loader-src"
    r = thaw(env, "run", "--id", sid, "--json", "--bind", str(WORKLOAD.parent), "--bind", str(REPO / ".venv"),
             "--bind", sys.base_prefix, "--probe", f"http:{PORT}/ping", "--",
             str(REPO / ".venv" / "bin" / "python"), str(WORKLOAD), str(PORT), str(a.mb))
    host = json.loads(r.stdout)["address"]
    first_answer(host, time.monotonic(), 600)
    src = {**get(host, "/sum", 600), "host": host}
    image = a.work / "image"
    thaw(env, "checkpoint", sid, "--out", str(image))     # the sandbox ends with its checkpoint
    image_bytes = sum(p.stat().st_size for p in image.iterdir())
    rows = []
    try:
        for k in range(a.reps):
            for state in ("hot", "cold"):
                order = list(arms) if k % 2 == 0 else list(reversed(arms))
                for label in order:
                    row = one(env_for(a.work, *arms[label]), image, f"loader-{k}", src, state, label)
                    row["round"] = k
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for s in [f"loader-{k}" for k in range(a.reps)]:
            subprocess.run([str(THAW), "delete", s, "--force"], env=env, capture_output=True)
        clean(a.work)
    summary = {}
    for state in ("hot", "cold"):
        for metric in ("first_answer_s", "all_memory_s"):
            per = {lab: spread([r[metric] for r in rows if r["runsc"] == lab and r["cache"] == state], 4)
                   for lab in arms}
            summary[f"{state}.{metric}"] = {**per, **{f"{lab}_over_thaw": round(per[lab]["median_s"] / per["thaw"]["median_s"], 3)
                                                      for lab in arms if lab != "thaw"}}
    out = {"benchmark": "loader-readers", "date": date.today().isoformat(), "mb": a.mb, "reps": a.reps,
           "image_bytes": image_bytes, "runsc": {k: str(v) for k, v in runscs.items()},
           "arms": {k: {"runsc": str(p), "background": bg} for k, (p, bg) in arms.items()},
           "machine": {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
                       "loadavg_end": os.getloadavg()},
           "summary": summary, "rows": rows}
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
