"""CPU check of the pytorch-offload routes with real torch and transformers
(no GPU): what the H200 run would otherwise be the first to execute.

    PYTHON_WITH_TORCH bench/gpu/offload_check.py [--out check.json]

1. bench/gpu/offload.py's Stash on the tiny models in fp16: each mode
   (register, alloc, staged, drop) moves every parameter off its storage and back,
   and the logits are bit-identical afterwards; drop refuses files that cannot
   give a parameter back, before it drops anything.
2. bench/gpu/server.py's TorchBackend behind Server.handle (the spool and HTTP
   routes' handler): generate fails while the weights are off the device,
   answers identically after restore-weights; a failed offload leaves the
   server serving.
3. torch.compile's worker processes (started as a GPU compile starts them:
   inductor's warm pool and first job; on CPU inductor compiles C++ on
   threads): with more than one compile thread the server process has
   compile-worker children and the pre-checkpoint release ends them; with the
   profiles' TORCHINDUCTOR_COMPILE_THREADS=1 none are started.

On a machine with CUDA the same checks run with --device cuda (pinned arenas).
Exit 0 when every check passed. Not part of CI: CI has no torch.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))     # the repo: control.lifecycle.profiles

RESULTS: list[dict] = []


def check(name: str, ok: bool, **facts) -> None:
    RESULTS.append({"check": name, "ok": bool(ok), **facts})
    print(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(facts, default=str) if facts else ''}", flush=True)


def logits_digest(model, device: str) -> str:
    import torch
    ids = torch.arange(1, 17, device=device).unsqueeze(0)
    with torch.inference_mode():
        return hashlib.sha256(model(ids).logits.float().cpu().numpy().tobytes()).hexdigest()


def stash_cycles(work: Path, device: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    import weights
    from offload import OffloadError, Stash
    for model in ("tiny", "tiny-llama"):
        d = work / model
        weights.make(model, d, device="cpu")
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float16).to(device).eval()
        files = sorted(d.glob("*.safetensors"))
        st = Stash(m, device, files)
        before = logits_digest(m, device)
        names = [n for n, _ in m.named_parameters()]
        for mode in ("register", "alloc", "staged", "drop"):
            ptrs = {n: p.data_ptr() for n, p in m.named_parameters()}
            off = st.offload(mode)
            where = {n: (p.device.type, p.numel()) for n, p in m.named_parameters()}
            if mode == "drop":
                moved = all(numel == 0 for _, numel in where.values()) and st.arena is None
            else:
                lo = st.arena.data_ptr()
                hi = lo + st.arena.numel()
                moved = all(t == "cpu" for t, _ in where.values()) and all(
                    lo <= p.data_ptr() < hi for _, p in m.named_parameters())
            again_refused = False
            try:
                st.offload(mode)
            except OffloadError:
                again_refused = True
            back = st.restore()
            after = logits_digest(m, device)
            # Back on the device in storage of their own (not views of the host arena).
            own = all(p.device.type == device and p.data_ptr() != ptrs.get(n, 0) or mode == "drop"
                      for n, p in m.named_parameters()) if device != "cpu" else all(
                not (st.arena is not None and st.arena.data_ptr() <= p.data_ptr() < st.arena.data_ptr()
                     + st.arena.numel()) for p in m.parameters())
            check(f"stash {model} {mode}", moved and again_refused and after == before and own
                  and [n for n, _ in m.named_parameters()] == names,
                  tensors=off["tensors"], bytes=off["bytes"], restored=back.get("bytes"),
                  seconds=back.get("seconds"))
        # A ring of small slots: tensors split over several slots, many waves.
        import offload
        saved = offload.RING_SLOT
        offload.RING_SLOT = 4096 + 512
        try:
            small = Stash(m, device, files)
            for mode in ("staged", "drop"):
                small.offload(mode)
                back = small.restore()
                check(f"stash {model} {mode} through a ring of {offload.RING_SLOT}-byte slots",
                      logits_digest(m, device) == before and back["bytes"] == off["bytes"])
        finally:
            offload.RING_SLOT = saved
        # A second offload of the same mode reuses the arena (no new pinning).
        st.offload("register")
        arena = st.arena
        st.restore()
        info = st.offload("register")
        check(f"stash {model} register twice reuses the arena", st.arena is arena and "pin_s" not in info)
        st.restore()
        # drop refuses files that cannot give every parameter back, and drops nothing.
        bad = work / f"{model}-bad"
        bad.mkdir(exist_ok=True)
        from safetensors.torch import save_file
        save_file({"not.a.parameter": torch.zeros(2, dtype=torch.float16)}, str(bad / "model.safetensors"))
        st2 = Stash(m, device, [bad / "model.safetensors"])
        try:
            st2.offload("drop")
            refused = False
        except OffloadError as e:
            refused = "cannot be reloaded" in str(e)
        check(f"stash {model} drop refuses foreign files", refused and st2.mode is None
              and logits_digest(m, device) == before)


def server_routes(work: Path, device: str) -> None:
    import server
    import weights
    d = work / "srv-tiny"
    weights.make("tiny", d, device="cpu")
    srv = server.Server(server.TorchBackend(str(d), device, [1, 2, 3, 4], 6))
    first = srv.handle("generate")
    off = srv.handle("offload-weights", {"mode": "register"})
    blocked = srv.handle("generate")
    health = srv.handle("health")
    back = srv.handle("restore-weights")
    again = srv.handle("generate")
    check("server offload/restore round trip", "error" not in off and "error" in blocked
          and "restore-weights" in blocked["error"] and health.get("weights") == "host"
          and back.get("restored") and again["digest"] == first["digest"] and again["tokens"] == first["tokens"],
          offload=off, restore=back)
    # fp32 on CPU against fp16 files: drop must refuse, and the server keeps serving.
    if device == "cpu":
        refused = srv.handle("offload-weights", {"mode": "drop"})
        still = srv.handle("generate")
        check("server drop refused, still serving", "error" in refused and still.get("digest") == first["digest"],
              error=refused.get("error", "")[:200])
    unknown = srv.handle("offload-weights", {"mode": "swap"})
    check("server unknown mode is an error", "unknown offload mode" in unknown.get("error", ""))


COMPILE_PROBE = r'''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import server
@torch.compile
def f(x):
    return torch.sin(x) * 2 + torch.cos(x)
f(torch.randn(64))
# On CPU inductor compiles C++ on threads; the worker processes are for GPU
# (Triton) kernels. Start them the way a GPU compile does (torch/_inductor/
# async_compile.py: maybe_warm_pool at compile start, then a ready job).
from torch._inductor.async_compile import AsyncCompile
AsyncCompile.warm_pool()
if AsyncCompile.use_process_pool() is not False:
    AsyncCompile.wait_pool_ready()
time.sleep(1.0)
before = sorted(server._children())
ended = server.end_compile_workers()
after = sorted(server._children())
print(json.dumps({"before": len(before), "ended": ended, "after": len(after),
                  "threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")}))
'''


def compile_workers(work: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache")
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "2"    # inductor's default is min(32, cpus); this machine may have 1
    r = subprocess.run([sys.executable, "-c", COMPILE_PROBE, str(HERE)], env=env, capture_output=True,
                       text=True, timeout=600)
    d = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"stderr": r.stderr[-800:]}
    check("compile workers exist by default and the release ends them",
          d.get("before", 0) > 0 and d.get("ended") == d.get("before") and d.get("after") == 0, **d)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache-1")
    from control.lifecycle import profiles   # the profiles' environment, as a spec gets it
    env.update(profiles.get("pytorch-offload").env)
    r = subprocess.run([sys.executable, "-c", COMPILE_PROBE, str(HERE)], env=env, capture_output=True,
                       text=True, timeout=600)
    d = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"stderr": r.stderr[-800:]}
    check("with the pytorch profiles' environment no compile workers start",
          d.get("before") == 0 and d.get("threads") == "1", **d)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="offload-check-") as tmp:
        work = Path(tmp)
        stash_cycles(work, a.device)
        server_routes(work, a.device)
        compile_workers(work)
    import torch
    import transformers
    out = {"check": "offload", "date": time.strftime("%Y-%m-%d"), "device": a.device, "torch": torch.__version__,
           "transformers": transformers.__version__, "seconds": round(time.time() - t0, 1), "results": RESULTS,
           "passed": sum(r["ok"] for r in RESULTS), "failed": sum(not r["ok"] for r in RESULTS)}
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))
    print(f"{out['passed']} passed, {out['failed']} failed")
    return 0 if out["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
