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
digest, which must be identical. Before the toggles the helper's fixed cost is
timed on its own (`--get-state`, twice; its --timing line splits libcuda's
load and cuInit from the driver call). With --offload MODE (models.py
--native: register) a second cycle follows with the weights out of the
driver's copy path, as the pytorch-offload profile does
(bench/gpu/offload.py): the worker offloads them, the helper toggles, the
worker copies them back (timed) and recomputes the digest.
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
d = Path(sys.argv[1]); ctl = Path(sys.argv[2]); sys.path.insert(0, sys.argv[3]); mode = sys.argv[4]
from server import TorchBackend, fixed_prompt   # bench/gpu/server.py: the sandboxed server's model and request
backend = TorchBackend(str(d), "cuda", fixed_prompt(32), 16)   # server.py's default --prompt-len, --new-tokens
m = backend.model
def request():
    t = time.perf_counter()
    out = backend.generate()
    return {"wall_s": round(time.perf_counter() - t, 6), **out["timing"]}
ids = torch.arange(1, 33, device="cuda").unsqueeze(0)
def digest():
    with torch.no_grad():
        return hashlib.sha256(m(ids).logits.float().cpu().numpy().tobytes()).hexdigest()
def wait(name):
    while not (ctl / name).exists():
        time.sleep(0.005)
first = digest()
warm = request()
torch.cuda.synchronize(); torch.cuda.empty_cache()   # as the pytorch profile's release hook
(ctl / "ready").write_text(json.dumps({"digest": first, "allocated": torch.cuda.memory_allocated(),
                                       "reserved": torch.cuda.memory_reserved(), "warm_request": warm}))
wait("again")
after = [request(), request()]      # the first request after the driver's restore, and the next
(ctl / "after").write_text(json.dumps({"digest": digest(), "requests": after}))
if mode:
    from offload import Stash   # bench/gpu/offload.py
    st = Stash(m, "cuda", sorted(d.glob("*.safetensors")))
    off = st.offload(mode)
    (ctl / "offloaded").write_text(json.dumps(off))
    wait("restore-weights")
    back = st.restore()
    (ctl / "after-offload").write_text(json.dumps({"digest": digest(), "restore": back}))
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


def helper_run(helper: str, pid: int, *args: str) -> dict:
    """The helper with --timing, timed from here: wall seconds, its output, its own steps."""
    t0 = time.monotonic()
    p = subprocess.run([helper, "--timing", *args, "--pid", str(pid)], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"helper {' '.join(args)} exit {p.returncode}: {p.stderr.strip()}")
    timing = {}
    for line in p.stderr.splitlines():      # twin: nvproxy/helper.py parse_timing (no thaw import here)
        if line.startswith("thaw-cuda-checkpoint timing:"):
            timing = {k: float(v) for k, _, v in (x.partition("=") for x in line.split(":", 1)[1].split())}
    return {"wall_s": round(wall, 4), "stdout": p.stdout.strip(), "timing": timing}


def toggle(helper: str, pid: int) -> float:
    return helper_run(helper, pid, "--toggle")["wall_s"]


def one(model: str, helper: str, work: Path, keep_weights: bool = False, offload_mode: str = "",
        python: str = sys.executable, env: dict | None = None) -> dict:
    """`python` (with torch and transformers) runs the worker, in `env` (default this process's)."""
    wdir = work / "weights" / model
    weights.make(model, wdir, device="cuda")
    ctl = work / f"ctl-{model}"
    shutil.rmtree(ctl, ignore_errors=True)
    ctl.mkdir(parents=True)
    t0 = time.monotonic()
    proc = subprocess.Popen([python, "-c", WORKER, str(wdir), str(ctl), str(HERE), offload_mode], env=env)
    try:
        ready = wait(ctl / "ready", proc, 300)
        load_s = time.monotonic() - t0
        before = gpu_used_mib()
        # The helper's fixed cost: exec, libcuda, cuInit, one driver call.
        get_state = [helper_run(helper, proc.pid, "--get-state") for _ in range(2)]
        ck = helper_run(helper, proc.pid, "--toggle")
        during = gpu_used_mib()
        rs = helper_run(helper, proc.pid, "--toggle")
        (ctl / "again").write_text("")
        after = wait(ctl / "after", proc, 120)
        image = sum(f.stat().st_size for f in wdir.iterdir() if f.is_file())
        out = {"model": model, "weights_bytes": image, "load_s": round(load_s, 3),
               "torch_allocated": ready["allocated"], "gpu_used_mib_before": before,
               "gpu_used_mib_checkpointed": during, "native_checkpoint_s": round(ck["wall_s"], 3),
               "native_restore_s": round(rs["wall_s"], 3), "identical": after["digest"] == ready["digest"],
               # The same request as the sandboxed server's (server.py), warm and after the restore.
               "warm_request": ready.get("warm_request"), "requests_after_restore": after.get("requests"),
               "get_state_s": [g["wall_s"] for g in get_state],
               "helper_timing": {"get_state": [g["timing"] for g in get_state], "checkpoint": ck["timing"],
                                 "restore": rs["timing"]}}
        if offload_mode:
            off: dict = {"mode": offload_mode}
            try:
                off["offload"] = wait(ctl / "offloaded", proc, 300)
                off["gpu_used_mib_offloaded"] = gpu_used_mib()
                c = helper_run(helper, proc.pid, "--toggle")
                off["gpu_used_mib_checkpointed"] = gpu_used_mib()
                r = helper_run(helper, proc.pid, "--toggle")
                (ctl / "restore-weights").write_text("")
                back = wait(ctl / "after-offload", proc, 300)
                off.update(cuda_checkpoint_s=c["wall_s"], cuda_restore_s=r["wall_s"],
                           restore_weights_s=back["restore"]["seconds"], restore_weights=back["restore"],
                           restore_s=round(r["wall_s"] + back["restore"]["seconds"], 4),
                           identical=back["digest"] == ready["digest"],
                           helper_timing={"checkpoint": c["timing"], "restore": r["timing"]})
            except Exception as e:  # noqa: BLE001 - the plain cycle's numbers stand
                off["error"] = f"{type(e).__name__}: {e}"
            out["offload"] = off
        proc.wait(60)
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
        if not keep_weights:
            shutil.rmtree(wdir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--helper", required=True)
    ap.add_argument("--models", default="gpt2-large,llama-3b,llama-8b")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-native"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--offload", default="", choices=("", "register", "alloc", "staged", "drop"),
                    help="a second cycle with the weights offloaded this way (bench/gpu/offload.py)")
    a = ap.parse_args()
    res = {"benchmark": "gpu-native-cuda-checkpoint", "date": time.strftime("%Y-%m-%d"),
           "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(), "models": []}
    for m in a.models.split(","):
        try:
            r = one(m, a.helper, a.work, offload_mode=a.offload)
        except Exception as e:  # noqa: BLE001 - record and go on to the next model
            r = {"model": m, "error": f"{type(e).__name__}: {e}"}
        res["models"].append(r)
        print(json.dumps(r), flush=True)
        a.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
