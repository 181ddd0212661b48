"""What checking every chunk as it is read costs a restore from the warm node cache (issue 30):
cache.verify = read (thaw-gofer serves the entry, each chunk hashed before the sentry gets
it) against cache.verify = stat (runsc reads the entry's files directly, today's path before
issue 30), side by side in one run, alternating.

    flock /tmp/thaw-heavy.lock .venv/bin/python bench/cache_verify.py [--sizes 1024] [--reps 5]
        [--page-cache dropped,full] [--out bench/results/cache-verify-DATE.json]

One SeaweedFS on loopback; per size one image: control/dev/workloads/memory_server.py holding
SIZE MiB of seeded random bytes, run in a runsc sandbox, checkpointed, pushed, pulled into one
node cache. Then `reps` rounds; each round runs both variants, in alternating order, through
`thaw restore --from-store KEY` (a cache hit: the same command and entry), with the page cache
either dropped before each run (sync, drop_caches=3: the entry on disk only, as after an
O_DIRECT pull) or full (the entry's files read once before each run). Per run:

  first_answer_s  command start to the first /ping answer (the server's own pages only)
  all_pages_s     command start to the /sum answer: SHA-256 of all SIZE MiB recomputed from the
                  restored memory, so every page of it was loaded (and right); the workload's
                  hashing is the same in both variants
  runsc_restore_s `runsc restore` alone (thaw restore --json)

Every answer's boot id must be the checkpoint's and every /sum the checkpoint's digest.
checkpoint.restore_background is on (the default). The headline is each variant's median with
its range, and read/stat of the medians.
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
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import stream as streambench  # noqa: E402
import workloads  # noqa: E402
from control.dev import seaweed  # noqa: E402

THAW = streambench.THAW
VARIANTS = ("stat", "read")
METRICS = ("first_answer_s", "all_pages_s", "runsc_restore_s")


def warm_page_cache(entry: Path) -> None:
    """Read the entry's files once: the page cache holds them for the next restore."""
    for p in sorted(entry.iterdir()):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(16 << 20):
                    pass


def one_run(variant: str, env: dict, key: str, sid: str, src: dict, page_cache: str, entry: Path) -> dict:
    if page_cache == "dropped":
        streambench.drop_caches()
    else:
        warm_page_cache(entry)
    t0 = time.monotonic()
    p = subprocess.Popen([str(THAW), "restore", "--from-store", key, "--id", sid, "--json"],
                         env=env | {"THAW_CACHE_VERIFY": variant}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, stdin=subprocess.DEVNULL)
    try:
        answer, t_first = streambench.first_answer(src["host"], t0, 600)
        summed = streambench.get(src["host"], "/sum", 600)
        t_all = time.monotonic() - t0
        out, err = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"{variant} restore failed ({p.returncode}): {err[-3000:]}")
    r = json.loads(out)
    row = {"variant": variant, "page_cache": page_cache, "first_answer_s": round(t_first, 4),
           "all_pages_s": round(t_all, 4), "runsc_restore_s": r.get("runsc_restore_s"), "source": r.get("source"),
           "boot_ok": answer["boot"] == src["boot"], "sum_ok": summed["digest"] == src["digest"]}
    streambench.thaw(env, "delete", sid, "--force")
    if row["source"] != "cache" or not row["boot_ok"] or not row["sum_ok"]:
        raise RuntimeError(f"{variant}: not a cache hit with the checkpoint's memory: {row}")
    return row


def spread(xs: list[float]) -> dict:
    return {"median_s": round(statistics.median(xs), 4), "min_s": min(xs), "max_s": max(xs), "n": len(xs),
            "runs_s": xs}


def summary(rows: list[dict]) -> dict:
    out: dict = {}
    for m in METRICS:
        per = {v: [r[m] for r in rows if r["variant"] == v and r.get(m) is not None] for v in VARIANTS}
        if all(per.values()):
            out[m] = {v: spread(xs) for v, xs in per.items()}
            out[m]["read_over_stat"] = round(out[m]["read"]["median_s"] / out[m]["stat"]["median_s"], 3)
            pairs = [b[m] / a[m] for a, b in zip([r for r in rows if r["variant"] == "stat"],
                                                 [r for r in rows if r["variant"] == "read"])]
            out[m]["paired_ratios"] = {"min": round(min(pairs), 3), "max": round(max(pairs), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1024", help="image sizes: MiB of server memory, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--page-cache", default="dropped,full", help="dropped and/or full, comma-separated")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-bench/cache-verify"))
    ap.add_argument("--out", type=Path, default=REPO / "bench/results" / f"cache-verify-{date.today().isoformat()}.json")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    states = [x for x in a.page_cache.split(",") if x]
    workloads.remove_tree(a.work)
    a.work.mkdir(parents=True)
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": {
        "host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg()}, "method": __doc__, "sizes_mib": sizes, "reps": a.reps,
        "page_cache": states, "images": {}, "runs": [], "summary": {}}
    sw = seaweed.Seaweed(a.work / "weed").start()
    try:
        sw.credentials.write_aws_file(a.work / "aws-credentials")
        for mb in sizes:
            key = f"{streambench.TENANT}.cacheverify-{mb}"
            env = streambench.env_for(a.work, sw, sw.endpoint, a.work / f"cache-{mb}")
            t0 = time.monotonic()
            result["images"][key] = src = streambench.publish(env, key, mb, a.work)
            entry = Path(json.loads(streambench.thaw(env, "pull", key, "--json").stdout)["path"])
            src["publish_s"] = round(time.monotonic() - t0, 1)
            print(f"published and cached {key}: {src['image_bytes'] / 1e9:.2f} GB", flush=True)
            for state in states:
                rows = []
                for rep in range(a.reps):
                    order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
                    for variant in order:
                        row = one_run(variant, env, key, f"cv-{mb}-{variant}-{rep}", src, state, entry)
                        row.update(size_mib=mb, rep=rep)
                        rows.append(row)
                        result["runs"].append(row)
                        print(json.dumps(row), flush=True)
                rows.sort(key=lambda r: (r["rep"], r["variant"]))
                result["summary"].setdefault(str(mb), {})[state] = summary(rows)
                print(json.dumps({"size_mib": mb, "page_cache": state, **summary(rows)}), flush=True)
                a.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        sw.stop()
        workloads.remove_tree(a.work)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
