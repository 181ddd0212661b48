"""Time to first answer from an empty cache: streamed vs pull-then-restore vs
warm cache (issue 18), side by side in one run.

    flock /tmp/thaw-heavy.lock .venv/bin/python bench/stream.py [--sizes 1024,4096] [--rates 200e6,1e9]
        [--reps 3] [--out bench/results/stream-DATE.json]

One SeaweedFS on loopback, and thaw-s3proxy (go/cmd/thaw-s3proxy) in front of
it throttled to each rate: a link of that many bytes/s in total over every
response, a real proxy process. One image per size: control/dev/workloads/
memory_server.py holding SIZE MiB of seeded random bytes, run in a runsc
sandbox, checkpointed, pushed. For each size and rate, `reps` rounds, each
running the three variants in turn, each through `thaw restore --from-store
KEY` (the same command and code path):

  streamed  store.stream on, empty cache: runsc restores at once through
            thaw-gofer while the image arrives
  pull      store.stream off, empty cache: the image is pulled whole first
  warm      the image already in the node cache

All with checkpoint.restore_background on (the server runs while pages load:
the best warm restore). Before each run the page cache is dropped (sync,
drop_caches=3). Time to first answer: from starting the command to the first
/ping answer (polled with 50 ms timeouts). Every answer's boot id must be the
checkpoint's; the first round of each variant also checks /sum (a SHA-256 of
all SIZE MiB recomputed from the restored memory).

The first streamed run of each image records the ranges it faulted on beside
the manifest (issue 18 item 2); every later streamed run of it fetches them
first (their "learned_ranges" > 0). So the first streamed row of a size shows
a node that never saw the image, the others the learned order.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import workloads  # noqa: E402
from control.dev import seaweed  # noqa: E402
from tests.integration.faults.s3proxy import S3Proxy  # noqa: E402

THAW = REPO / ".venv" / "bin" / "thaw"
BUILD = REPO / "build"
WORKLOAD = REPO / "control" / "dev" / "workloads" / "memory_server.py"
PORT = 8080
SUBNET = "10.214.48.0/20"
VARIANTS = ("streamed", "pull", "warm")
# The CLI's tenant (issue 13: control/lifecycle/tenant.py): `thaw push` and
# `thaw restore --from-store` take only keys that start with it.
TENANT = "user-root"


def env_for(work: Path, sw: seaweed.Seaweed, endpoint: str, cache: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_"))}
    env.update({"THAW_CONFIG": "/dev/null", "THAW_NODE_STATE_DIR": str(work / "state"),
                "THAW_NODE_LOG_DIR": str(work / "log"), "THAW_RUNSC_ROOT": str(work / "runsc-root"),
                "THAW_RUNSC_PATH": str(BUILD / "runsc"), "THAW_NETWORK_SUBNET": SUBNET,
                "THAW_CACHE_DIR": str(cache), "THAW_STORE_ENDPOINT": endpoint, "THAW_STORE_BUCKET": "streambench",
                "THAW_STORE_CREDENTIALS_FILE": str(work / "aws-credentials"),
                "THAW_CHECKPOINT_RESTORE_BACKGROUND": "1", "THAW_STORE_STREAM_DEADLINE_S": "120"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def thaw(env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    r = subprocess.run([str(THAW), *args], env=env, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"thaw {' '.join(args)} failed ({r.returncode}): {r.stderr[-3000:]}")
    return r


def get(host: str, path: str, timeout: float) -> dict:
    with urllib.request.urlopen(f"http://{host}:{PORT}{path}", timeout=timeout) as r:
        return json.loads(r.read())


def first_answer(host: str, t0: float, deadline_s: float) -> tuple[dict, float]:
    while True:
        try:
            return get(host, "/ping", 0.05), time.monotonic() - t0
        except OSError:
            if time.monotonic() - t0 > deadline_s:
                raise
            time.sleep(0.01)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def publish(env: dict, key: str, mb: int, work: Path) -> dict:
    sid = f"{key.removeprefix(TENANT + '.')}-src"
    r = thaw(env, "run", "--id", sid, "--json", "--bind", str(WORKLOAD.parent), "--bind", str(REPO / ".venv"),
             "--bind", sys.base_prefix, "--probe", f"http:{PORT}/ping", "--",
             str(REPO / ".venv" / "bin" / "python"), str(WORKLOAD), str(PORT), str(mb))
    host = json.loads(r.stdout)["address"]
    t0 = time.monotonic()
    answer, _ = first_answer(host, t0, 600)
    image = work / f"{sid}-image"
    thaw(env, "checkpoint", sid, "--out", str(image))
    size = sum(p.stat().st_size for p in image.iterdir())
    thaw(env, "push", str(image), "--key", key, "--no-cache", "--allow-node-local", "--json")  # one machine: its paths
    shutil.rmtree(image)
    return {**answer, "host": host, "image_bytes": size}


def one_run(variant: str, env: dict, key: str, sid: str, src: dict, check_sum: bool) -> dict:
    drop_caches()
    t0 = time.monotonic()
    p = subprocess.Popen([str(THAW), "restore", "--from-store", key, "--id", sid, "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        answer, t_first = first_answer(src["host"], t0, 600)
        out, err = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    t_done = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{variant} restore failed ({p.returncode}): {err[-3000:]}")
    r = json.loads(out)
    row = {"variant": variant, "first_answer_s": round(t_first, 4), "command_s": round(t_done, 4),
           "source": r.get("source"), "ready_s": r.get("ready_s"), "runsc_restore_s": r.get("runsc_restore_s"),
           "boot_ok": answer["boot"] == src["boot"]}
    if "stream" in r:
        st = r["stream"]
        row["stream"] = {k: st.get(k) for k in ("seconds", "error", "faults", "learned_ranges")}
        row["stream"].update({k: st["stats"].get(k) for k in ("fetched_bytes", "urgent_chunks", "wants", "peers",
                                                               "duplicate_bytes", "retries")})
    if check_sum:
        row["sum_ok"] = get(src["host"], "/sum", 600)["digest"] == src["digest"]
    thaw(env, "delete", sid, "--force")
    if not row["boot_ok"] or row.get("sum_ok") is False:
        raise RuntimeError(f"{variant}: the restored server does not hold the checkpoint's memory: {row}")
    return row


def summary(rows: list[dict]) -> dict:
    out = {}
    for v in VARIANTS:
        xs = [r["first_answer_s"] for r in rows if r["variant"] == v]
        if xs:
            out[v] = {"median_s": round(statistics.median(xs), 4), "min_s": min(xs), "max_s": max(xs), "n": len(xs)}
    if "streamed" in out and "warm" in out:
        out["streamed_over_warm"] = round(out["streamed"]["median_s"] / out["warm"]["median_s"], 3)
    if "streamed" in out and "pull" in out:
        out["streamed_over_pull"] = round(out["streamed"]["median_s"] / out["pull"]["median_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1024,4096", help="image sizes: MiB of server memory, comma-separated")
    ap.add_argument("--rates", default="200e6,1e9", help="store link rates in bytes/s, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-bench/stream"))
    ap.add_argument("--out", type=Path, default=REPO / "bench/results" / f"stream-{date.today().isoformat()}.json")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    rates = [int(float(x)) for x in a.rates.split(",")]
    workloads.remove_tree(a.work)
    a.work.mkdir(parents=True)
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": {
        "host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg()}, "method": __doc__, "sizes_mib": sizes, "rates_bps": rates,
        "reps": a.reps, "images": {}, "runs": [], "summary": {}}
    sw = seaweed.Seaweed(a.work / "weed").start()
    proxy = S3Proxy(BUILD / "thaw-s3proxy", sw.endpoint, a.work / "s3proxy.log").start()
    try:
        sw.credentials.write_aws_file(a.work / "aws-credentials")
        direct = env_for(a.work, sw, sw.endpoint, a.work / "cache-publish")
        for mb in sizes:
            key = f"{TENANT}.stream-{mb}"
            t0 = time.monotonic()
            result["images"][key] = src = publish(direct, key, mb, a.work)
            src["publish_s"] = round(time.monotonic() - t0, 1)
            print(f"published {key}: {src['image_bytes'] / 1e9:.2f} GB in {src['publish_s']} s", flush=True)
            warm_cache = a.work / f"cache-warm-{mb}"
            thaw(env_for(a.work, sw, sw.endpoint, warm_cache), "pull", key)
            for rate in rates:
                proxy.clear()
                proxy.add(kind="throttle", rate_bps=rate)
                rows = []
                for rep in range(a.reps):
                    for variant in VARIANTS:
                        cache = warm_cache if variant == "warm" else a.work / "cache-run"
                        if variant != "warm":
                            shutil.rmtree(cache, ignore_errors=True)
                        env = env_for(a.work, sw, proxy.endpoint, cache,
                                      THAW_STORE_STREAM=1 if variant == "streamed" else 0)
                        row = one_run(variant, env, key, f"stream-{mb}-{variant}-{rep}", src, check_sum=rep == 0)
                        row.update(size_mib=mb, rate_bps=rate, rep=rep)
                        rows.append(row)
                        result["runs"].append(row)
                        print(json.dumps(row), flush=True)
                        if variant != "warm":
                            shutil.rmtree(cache, ignore_errors=True)
                result["summary"].setdefault(str(mb), {})[str(rate)] = summary(rows)
                print(json.dumps({"size_mib": mb, "rate_bps": rate, **summary(rows)}), flush=True)
                a.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        proxy.stop()
        sw.stop()
        workloads.remove_tree(a.work)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
