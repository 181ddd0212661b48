"""GPU smoke workload: holds GPU state and proves it survives checkpoint/restore.

Runs inside a runsc sandbox with nvproxy. Builds a fixed-seed matrix A on the
GPU, computes B = A @ A once (the "warm state"), then every 100 ms recomputes
A @ A, compares it bit for bit with B, and appends a JSON line to the log:
{"event": "step", "step": N, "equal": true, "pid": ..., "boot": ...}.
`boot` is a random id chosen at start: a restored process keeps it, a fresh
start would not.
"""
import json
import os
import sys
import time

t0 = time.time()
log_path = sys.argv[1]
log = open(log_path, "a", buffering=1)


def emit(**kv):
    kv["t"] = time.time()
    log.write(json.dumps(kv) + "\n")


import torch  # noqa: E402  (timed: part of the cold start)

boot = os.urandom(8).hex()
torch.manual_seed(1234)
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float32)
b = a @ a
torch.cuda.synchronize()
digest = float(b.double().sum().item())
emit(event="ready", boot=boot, pid=os.getpid(), digest=digest, device=torch.cuda.get_device_name(0),
     gpu_mem=torch.cuda.memory_allocated(), startup_s=time.time() - t0)
step = 0
while True:
    step += 1
    c = a @ a
    torch.cuda.synchronize()
    emit(event="step", step=step, equal=bool(torch.equal(b, c)), boot=boot, pid=os.getpid())
    time.sleep(0.1)
