"""The CUDA checkpoint API outside any sandbox, with thaw's own helper, on the
same models as bench/gpu/models.py: how much of the in-sandbox CUDA restore
time is the driver's, and how much nvproxy adds.

    python3 bench/gpu/native_cuda.py --helper /tmp/thaw-bin/thaw-cuda-checkpoint \
        --models gpt2-large,llama-3b,llama-8b --out $OUT/native.json

For each model: a worker process (python3, transformers) loads the fixed-seed
weights (bench/gpu/weights.py) onto the GPU, releases cached blocks
(torch.cuda.empty_cache(), as thaw's PyTorch profile does before a checkpoint)
and computes a logits digest; then the helper toggles it to checkpointed and
back (`--toggle --pid N`, timed from here), and the worker recomputes the
digest, which must be identical.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import weights  # noqa: E402  (bench/gpu/weights.py)

WORKER = r'''
import hashlib, json, os, sys, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
d = Path(sys.argv[1]); ctl = Path(sys.argv[2])
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float16, device_map="cuda").eval()
ids = torch.arange(1, 33, device="cuda").unsqueeze(0)
def digest():
    with torch.no_grad():
        return hashlib.sha256(m(ids).logits.float().cpu().numpy().tobytes()).hexdigest()
first = digest()
torch.cuda.synchronize(); torch.cuda.empty_cache()
(ctl / "ready").write_text(json.dumps({"digest": first, "allocated": torch.cuda.memory_allocated(),
                                       "reserved": torch.cuda.memory_reserved()}))
while not (ctl / "again").exists():
    time.sleep(0.01)
(ctl / "after").write_text(json.dumps({"digest": digest()}))
'''


def gpu_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0]) if out.strip() else -1


def wait(p: Path, proc: subprocess.Popen, timeout: float) -> dict:
    end = time.monotonic() + timeout
    while not p.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
        if time.monotonic() > end:
            raise TimeoutError(str(p))
        time.sleep(0.02)
    time.sleep(0.05)
    return json.loads(p.read_text())


def toggle(helper: str, pid: int) -> float:
    t0 = time.monotonic()
    p = subprocess.run([helper, "--toggle", "--pid", str(pid)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"helper exit {p.returncode}: {p.stderr.strip()}")
    return time.monotonic() - t0


def one(model: str, helper: str, work: Path) -> dict:
    wdir = work / "weights" / model
    weights.make(model, wdir, device="cuda")
    ctl = work / f"ctl-{model}"
    shutil.rmtree(ctl, ignore_errors=True)
    ctl.mkdir(parents=True)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(wdir), str(ctl)])
    try:
        ready = wait(ctl / "ready", proc, 300)
        load_s = time.monotonic() - t0
        before = gpu_used_mib()
        ck = toggle(helper, proc.pid)
        during = gpu_used_mib()
        rs = toggle(helper, proc.pid)
        (ctl / "again").write_text("")
        after = wait(ctl / "after", proc, 120)
        proc.wait(60)
        image = sum(f.stat().st_size for f in wdir.iterdir() if f.is_file())
        return {"model": model, "weights_bytes": image, "load_s": round(load_s, 3),
                "torch_allocated": ready["allocated"], "gpu_used_mib_before": before,
                "gpu_used_mib_checkpointed": during, "native_checkpoint_s": round(ck, 3),
                "native_restore_s": round(rs, 3), "identical": after["digest"] == ready["digest"]}
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(wdir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--helper", required=True)
    ap.add_argument("--models", default="gpt2-large,llama-3b,llama-8b")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-native"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    res = {"benchmark": "gpu-native-cuda-checkpoint", "date": time.strftime("%Y-%m-%d"),
           "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(), "models": []}
    for m in a.models.split(","):
        try:
            r = one(m, a.helper, a.work)
        except Exception as e:  # noqa: BLE001 - record and go on to the next model
            r = {"model": m, "error": f"{type(e).__name__}: {e}"}
        res["models"].append(r)
        print(json.dumps(r), flush=True)
        a.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
