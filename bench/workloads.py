"""Real runsc checkpoint images of Python workloads, for the store benchmarks
and the store's integration tests.

Every workload runs this machine's Python (the repo's virtualenv) in a runsc
sandbox with the host rootfs layout (runsc_hooks/spec.py), imports the same
runtime (the standard library modules a service uses, boto3/botocore with a
few clients built, click, grpc), then builds its own state ("model"), writes
a ready line and sleeps until it is checkpointed. So the images share the
runtime and differ in their model: the situation dedup is for.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from runsc_hooks import spec as specmod  # noqa: E402
from runsc_hooks.runsc import CheckpointOptions, CreateOptions, GlobalOptions, Runsc  # noqa: E402

# The workload program. argv: READY_FILE MODEL [ARG]. Models:
#   none           the runtime only
#   weights SEED MB      float32 weights from a seeded PRNG (incompressible, like real weights)
#   ngram SEED           a word-bigram table built from seeded generated text
#   kv SEED N            a dict of N JSON documents (a service's in-memory state)
#   ballast MB           MB of seeded random bytes (a large image for the fetch benchmark)
#   mixed MB             MB of memory: half random (weights), a quarter zeroed but committed
#                        buffers (staging/KV areas), a quarter low-entropy bytes (4 bits/byte)
#   finetune SEED MB [ngram|kv]   the base model /data/base.bin read into memory, plus an
#                        adapter of MB seeded weights, plus optional extra state
WORKLOAD = r'''
import sys, os, time, json, random
t0 = time.time()
import asyncio, decimal, email.parser, http.server, sqlite3, xml.etree.ElementTree, logging, argparse
import concurrent.futures, urllib.request, hashlib, zlib, csv, re, uuid, dataclasses, typing
import boto3, botocore, click, grpc
session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
clients = [session.client(s) for s in ("s3", "sts", "sqs", "dynamodb")]
ready, model = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
state = None
if model == "weights":
    rng = random.Random(int(args[0]))
    state = bytearray(rng.randbytes(int(float(args[1]) * (1 << 20))))
elif model == "ngram":
    rng = random.Random(int(args[0]))
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(20000)]
    words = [rng.choice(vocab) for _ in range(1500000)]
    state = {}
    for a, b in zip(words, words[1:]):
        d = state.setdefault(a, {})
        d[b] = d.get(b, 0) + 1
elif model == "kv":
    rng = random.Random(int(args[0]))
    state = {f"user:{i}": json.dumps({"id": i, "name": f"n{rng.random()}", "score": rng.random(),
             "tags": [rng.choice("abcdef") for _ in range(5)]}) for i in range(int(args[1]))}
elif model == "finetune":
    with open("/data/base.bin", "rb") as f:
        base = f.read()
    rng = random.Random(int(args[0]))
    adapter = rng.randbytes(int(float(args[1]) * (1 << 20)))
    extra = {}
    if "ngram" in args[2:]:
        extra = {i: [rng.random() for _ in range(8)] for i in range(60000)}
    if "kv" in args[2:]:
        extra = {f"k{i}": json.dumps({"i": i, "v": rng.random()}) for i in range(100000)}
    state = (base, adapter, extra)
elif model == "mixed":
    rng = random.Random(8)
    mb = int(args[0])
    weights = [bytearray(rng.randbytes(1 << 20)) for _ in range(mb // 2)]
    zeroed = bytearray((mb // 4) << 20)
    for i in range(0, len(zeroed), 4096):
        zeroed[i] = 0          # a write commits the page (zeros, like a cleared buffer)
    table = bytes.maketrans(bytes(range(256)), b"etaoinshrdlucmfw" * 16)
    text = [rng.randbytes(1 << 20).translate(table) for _ in range(mb // 4)]
    state = (weights, zeroed, text)
elif model == "ballast":
    rng = random.Random(7)
    mb = int(args[0])
    state = [bytearray(rng.randbytes(1 << 20)) for _ in range(mb)]
boot = os.urandom(8).hex()
with open(ready, "a") as f:
    f.write(json.dumps({"ready": True, "model": model, "boot": boot, "startup_s": time.time() - t0}) + "\n")
beats = open(os.path.join(os.path.dirname(ready), "beats.jsonl"), "a", buffering=1)
n = 0
while True:
    n += 1
    beats.write(json.dumps({"beat": n, "boot": boot}) + "\n")
    time.sleep(0.25)
'''


def remove_tree(path: Path) -> None:
    """rm -rf that first unmounts what runsc left mounted below `path`
    (`--network=none` binds a `null-netns` file into the runsc root)."""
    import os
    path = Path(path)
    if not path.exists():
        return
    prefix = str(path.resolve()).rstrip("/") + "/"
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp.startswith(prefix):
                mounts.append(mp)
    for mp in sorted(mounts, key=len, reverse=True):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(mp.encode(), 2) != 0:   # MNT_DETACH
            raise OSError(ctypes.get_errno(), f"umount {mp}: {os.strerror(ctypes.get_errno())}")
    shutil.rmtree(path)


def make_base_model(path: Path, mb: int = 128, seed: int = 99) -> Path:
    """The shared base model file (seeded random float32 bytes, like fp32 weights)."""
    import random
    if not path.is_file() or path.stat().st_size != mb << 20:
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = random.Random(seed)
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(rng.randbytes(1 << 20))
    return path


def make_checkpoint(runsc_bin: Path, workdir: Path, name: str, model_args: list[str],
                    timeout_s: float = 240.0, data_dir: Path | None = None) -> Path:
    """Run the workload with `model_args` in a fresh sandbox, wait until it is
    ready, checkpoint it; the image directory (workdir/name/image)."""
    base = workdir / name
    remove_tree(base)
    share = base / "share"
    share.mkdir(parents=True)
    (share / "workload.py").write_text(WORKLOAD)
    rootfs = specmod.prepare_host_rootfs(base / "rootfs")
    py = sys.executable
    sp = specmod.command_spec(
        [py, "/share/workload.py", "/share/ready.jsonl", *model_args],
        env={"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}, rootfs=str(rootfs),
        extra_mounts=[*specmod.host_layout([sys.prefix, sys.base_prefix, str(Path(py).resolve().parent)]),
                      specmod.bind_mount(str(share), "/share", readonly=False),
                      *([specmod.bind_mount(str(data_dir), "/data")] if data_dir else [])])
    bundle = specmod.Bundle(base / "bundle")
    bundle.write(sp)
    r = Runsc(runsc_bin, GlobalOptions(root=base / "root", network="none"), timeout_s=timeout_s)
    cid = f"thaw-wl-{name}"[:60]
    try:
        r.create(cid, CreateOptions(bundle=bundle.path))
        r.start(cid)
        deadline = time.monotonic() + timeout_s
        ready = share / "ready.jsonl"
        while not (ready.exists() and ready.read_text().strip()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"workload {name} not ready within {timeout_s} s")
            time.sleep(0.1)
        image = base / "image"
        r.checkpoint(cid, CheckpointOptions(image_path=image))
    finally:
        try:
            r.delete(cid, force=True)
        except Exception:  # noqa: BLE001 - the sandbox may be gone already
            pass
    info = json.loads(ready.read_text().splitlines()[0])
    (base / "info.json").write_text(json.dumps({"model_args": model_args, **info,
                                                "bytes": sum(p.stat().st_size for p in image.iterdir())}))
    return image


# The dedup benchmark sets. Both share one runtime (this Python, the same
# imports and boto3 clients). FINETUNE_SET: one base model (read from
# /data/base.bin), different adapters and state, as in multi-tenant serving of
# fine-tunes. RUNTIME_SET: different models generated in memory, nothing
# shared but the runtime (docs/store.md: that part does not dedup under gVisor).
FINETUNE_SET = {
    "ft-a": ["finetune", "1", "8"],
    "ft-b": ["finetune", "2", "8", "ngram"],
    "ft-c": ["finetune", "3", "16", "kv"],
    "ft-d": ["finetune", "4", "4"],
}
RUNTIME_SET = {
    "weights-a": ["weights", "1", "24"],
    "weights-b": ["weights", "2", "32"],
    "ngram": ["ngram", "3"],
    "kv": ["kv", "4", "150000"],
}
