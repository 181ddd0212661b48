"""CPU per GB of one fetch, by side: thaw-fetch (the one fetch engine), boto3
download_file, and the store (SeaweedFS's process) under each, on a 2 GiB
checkpoint of random memory, page cache full before every run (bench/store.py
_settle), 3 rounds. Answers "where does the fetch's CPU go" (docs/store.md).

    .venv/bin/python bench/store_cpu.py [ballast|mixed] > bench/results/store-cpu-<date>.json

ballast (default): random memory; mixed: bench/workloads.py's mixed image.
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
from boto3.s3.transfer import TransferConfig  # noqa: E402

from control import config as configmod  # noqa: E402
from control.images import image as images
from control.dev import seaweed  # noqa: E402
from control.images.cache import Cache  # noqa: E402
from control.node.compat import node_tuple  # noqa: E402
from control.images.store import Store  # noqa: E402

settings = configmod.load()
work = Path("/var/tmp/thaw-cpu"); workloads.remove_tree(work); work.mkdir(parents=True)
tup = node_tuple(settings)
sw = seaweed.Seaweed(work / "seaweed").start()
def wcpu():
    parts = open(f"/proc/{sw.proc.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
def me():
    t = os.times(); return t.user + t.system, t.children_user + t.children_system
out = {"thaw-fetch": [], "boto3": []}
try:
    base = sb._settings(sw, work, "bench")
    kind = sys.argv[1] if len(sys.argv) > 1 else "ballast"
    img = workloads.make_checkpoint(settings.runsc_path, work / "wl", kind, [kind, "2048"], timeout_s=600)
    size = sum(p.stat().st_size for p in img.iterdir())
    s = dataclasses.replace(base, store_bucket="cpu-bucket")
    st = Store(s)
    images.push(None, st, img, "k", tup, chunker=s.pack_chunker, avg_chunk=256 << 10, workers=8)
    client = sb._boto3_client(sw)
    for f in sorted(img.iterdir()):
        client.upload_file(str(f), "cpu-bucket", f"plain/{f.name}")
    for rep in range(3):
        for name in out:
            sb._settle(work, "full")
            w0, (s0, c0) = wcpu(), me()
            t = time.monotonic()
            if name == "boto3":
                d = work / "b"; shutil.rmtree(d, ignore_errors=True); d.mkdir()
                for f in sorted(img.iterdir()):
                    client.download_file("cpu-bucket", f"plain/{f.name}", str(d / f.name), Config=TransferConfig())
                for f in sorted(img.iterdir()):
                    fd = os.open(d / f.name, os.O_RDONLY); os.fsync(fd); os.close(fd)
            else:
                shutil.rmtree(work / "c", ignore_errors=True)
                cache = Cache(work / "c", 64 << 30, direct_io=True)
                t = time.monotonic(); w0, (s0, c0) = wcpu(), me()
                res = images.pull(cache, st, "k", tup, workers=8)
                res.lease.release()
            wall = time.monotonic() - t
            w1, (s1, c1) = wcpu(), me()
            shutil.rmtree(work / "c", ignore_errors=True)
            gb = size / 1e9
            out[name].append({"wall_s": round(wall, 3), "store_cpu_s_per_gb": round((w1 - w0) / gb, 3),
                              "client_cpu_s_per_gb": round((s1 - s0 + c1 - c0) / gb, 3)})
            print(name, out[name][-1], file=sys.stderr, flush=True)
            if name == "boto3":
                shutil.rmtree(work / "b")
    print(json.dumps({"benchmark": "store-cpu", "date": time.strftime("%Y-%m-%d"),
                      "machine": "2-core VM, 24 GiB, x86_64, no GPU (the development/CI machine)",
                      "store": "SeaweedFS on 127.0.0.1, same machine", "image": kind, "bytes": size,
                      "cpu": "process user+system seconds (os.times, children included) per GB moved",
                      "runs": out}, indent=1))
finally:
    sw.stop(); workloads.remove_tree(work)
