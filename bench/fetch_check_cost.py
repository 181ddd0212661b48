"""What checking every fetched chunk against its SHA-256 name (issue 14 item 6)
costs a real pull, against checking the manifest's BLAKE3 as thaw-fetch did
before: two thaw-fetch binaries, the same 2 GiB checkpoint of random memory in
SeaweedFS on loopback, alternating, page cache full before every run
(bench/store.py _settle), client and store CPU per GB as bench/store_cpu.py
counts them. docs/store.md, "Integrity".

    flock /tmp/thaw-heavy.lock .venv/bin/python bench/fetch_check_cost.py OLD_THAW_FETCH [ROUNDS] \\
        > bench/results/fetch-check-cost-<date>.json
"""
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import store as sb  # noqa: E402
import workloads  # noqa: E402

from control import config as configmod  # noqa: E402
from control.dev import seaweed  # noqa: E402
from control.images import image as images  # noqa: E402
from control.images.cache import Cache  # noqa: E402
from control.images.store import Store  # noqa: E402
from control.node.compat import node_tuple  # noqa: E402

old = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
settings = configmod.load()
work = Path("/var/tmp/thaw-check-cost")
workloads.remove_tree(work)
work.mkdir(parents=True)
tup = node_tuple(settings)
sw = seaweed.Seaweed(work / "seaweed").start()


def wcpu():
    parts = open(f"/proc/{sw.proc.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def me():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


sides = {"sha256 (this branch)": settings.store_fetcher, "blake3 (before)": old}
out = {k: [] for k in sides}
try:
    s = dataclasses.replace(sb._settings(sw, work, "bench"), store_bucket="check-cost")
    img = workloads.make_checkpoint(settings.runsc_path, work / "wl", "ballast", ["ballast", "2048"], timeout_s=600)
    size = sum(p.stat().st_size for p in img.iterdir())
    images.push(None, Store(s), img, "k", tup, chunker=s.pack_chunker, avg_chunk=256 << 10, workers=8)
    for _ in range(rounds):
        for name, fetcher in sides.items():
            sb._settle(work, "full")
            shutil.rmtree(work / "c", ignore_errors=True)
            cache = Cache(work / "c", 64 << 30, direct_io=True)
            st = Store(dataclasses.replace(s, store_fetcher=fetcher))
            t, w0, c0 = time.monotonic(), wcpu(), me()
            res = images.pull(cache, st, "k", tup, workers=8)
            wall = time.monotonic() - t
            w1, c1 = wcpu(), me()
            res.lease.release()
            shutil.rmtree(work / "c", ignore_errors=True)
            gb = size / 1e9
            out[name].append({"wall_s": round(wall, 3), "mb_per_s": round(size / wall / 1e6),
                              "client_cpu_s_per_gb": round((c1 - c0) / gb, 3),
                              "store_cpu_s_per_gb": round((w1 - w0) / gb, 3)})
            print(name, out[name][-1], file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "fetch-check-cost", "date": time.strftime("%Y-%m-%d"),
                      "machine": f"{os.cpu_count()}-core VM, x86_64, no GPU (the development/CI machine)",
                      "store": "SeaweedFS on 127.0.0.1, same machine", "bytes": size, "old_fetcher": str(old),
                      "cpu": "process user+system seconds (os.times, children included) per GB moved",
                      "runs": out}, indent=1))
finally:
    sw.stop()
    workloads.remove_tree(work)
