"""GPU smoke on the H200 machine: nvproxy runs CUDA in a runsc sandbox, and
`runsc checkpoint --cuda-checkpoint-path` + `runsc restore` bring the GPU state
back. Writes one JSON result (and the runsc logs on failure) under --out.

Run by bench/gpu/run-smoke.sh on the device machine; see bench/gpu/README.md and docs/gvisor-notes.md "GPU (H200 smoke, 2026-11-29)".
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from runsc_hooks import spec as specmod  # noqa: E402
from runsc_hooks.runsc import (CheckpointOptions, CreateOptions, GlobalOptions,  # noqa: E402
                               RestoreOptions, Runsc)

HELPER_DEST = "/thaw/bin/cuda-checkpoint"  # twin: nvproxy/helper.py HELPER_PATH


def nvidia_devices() -> list[dict]:
    devs = []
    for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"):
        st = os.stat(p)
        devs.append({"path": p, "type": "c", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
                     "fileMode": 0o666, "uid": 0, "gid": 0})
    return devs


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def wait_for(path: Path, pred, timeout: float) -> dict | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for ev in reversed(read_events(path)):
            if pred(ev):
                return ev
        time.sleep(0.02)
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runsc", required=True)
    ap.add_argument("--helper", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/thaw-gpu-smoke")
    shutil.rmtree(work, ignore_errors=True)
    (work / "share").mkdir(parents=True)
    (work / "bin").mkdir()
    specmod.prepare_host_rootfs(work / "rootfs")
    shutil.copy(args.helper, work / "bin" / "cuda-checkpoint")
    os.chmod(work / "bin" / "cuda-checkpoint", 0o755)
    shutil.copy(REPO / "bench/gpu/smoke_workload.py", work / "share" / "workload.py")
    logdir = out / "runsc-logs"
    logdir.mkdir(exist_ok=True)
    result: dict = {"ok": False, "steps": []}

    def step(name: str, **kv) -> None:
        result["steps"].append({"step": name, **kv})
        print(f"[smoke] {name} {json.dumps(kv)}", flush=True)

    env = {k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME") if k in os.environ}
    env["PYTHONUNBUFFERED"] = "1"
    sp = specmod.command_spec(
        [args.python, "/share/workload.py", "/share/events.jsonl"], env=env, rootfs=str(work / "rootfs"),
        extra_mounts=[
            *specmod.host_layout([sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(args.python))]),
            specmod.bind_mount(str(work / "share"), "/share", readonly=False),
            specmod.bind_mount(str(work / "bin"), "/thaw/bin"),
        ])
    sp["linux"]["devices"] = nvidia_devices()
    bundle = specmod.Bundle(work / "bundle")
    bundle.write(sp)
    g = GlobalOptions(root=work / "root", network="none", nvproxy=True,
                      debug_log=logdir / "%ID%.%COMMAND%.log")
    r = Runsc(Path(args.runsc), g, timeout_s=300)
    result["runsc_version"] = r.version()
    result["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.used",
                                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    events = work / "share" / "events.jsonl"
    try:
        t0 = time.monotonic()
        r.create("smoke1", CreateOptions(bundle=bundle.path))
        r.start("smoke1")
        ready = wait_for(events, lambda e: e.get("event") == "ready", 240)
        if not ready:
            raise RuntimeError("workload never became ready")
        cold = time.monotonic() - t0
        step("cold-start", seconds=round(cold, 3), device=ready.get("device"), gpu_mem=ready.get("gpu_mem"),
             in_sandbox_startup_s=round(ready["startup_s"], 3))
        first = wait_for(events, lambda e: e.get("event") == "step" and e.get("step", 0) >= 3, 60)
        step("running", equal=first and first.get("equal"))
        result["gpu_mem_before_ckpt"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()

        img = work / "image"
        t1 = time.monotonic()
        r.checkpoint("smoke1", CheckpointOptions(image_path=img, cuda_checkpoint_path=HELPER_DEST))
        ck = time.monotonic() - t1
        size = sum(f.stat().st_size for f in img.iterdir())
        last = [e for e in read_events(events) if e.get("event") == "step"][-1]
        step("checkpoint", seconds=round(ck, 3), image_bytes=size, files=sorted(p.name for p in img.iterdir()),
             last_step=last["step"])
        try:
            r.wait("smoke1", timeout_s=30)
        except Exception as e:  # noqa: BLE001 - record, the delete below still runs
            step("wait-after-checkpoint", error=str(e))
        r.delete("smoke1", force=True)
        result["gpu_mem_after_ckpt"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()

        # Drop cached pages of the image so the restore reads the disk.
        subprocess.run(["sync"])
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        t2 = time.monotonic()
        r.restore("smoke2", RestoreOptions(image_path=img, create=CreateOptions(bundle=bundle.path), detach=True))
        rs = time.monotonic() - t2
        after = wait_for(events, lambda e: e.get("event") == "step" and e["step"] > last["step"], 120)
        answered = time.monotonic() - t2
        step("restore", runsc_restore_s=round(rs, 3), to_first_step_s=round(answered, 3),
             step=after and after["step"], equal=after and after["equal"],
             same_boot=after and after["boot"] == ready["boot"])
        more = wait_for(events, lambda e: e.get("event") == "step" and e["step"] > last["step"] + 5, 60)
        result["gpu_mem_after_restore"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
        result.update(cold_start_s=round(cold, 3), checkpoint_s=round(ck, 3), image_bytes=size,
                      restore_s=round(answered, 3), runsc_restore_s=round(rs, 3),
                      continued=bool(after and after["step"] == last["step"] + 1),
                      gpu_state_equal=bool(more and more["equal"] and after["equal"]),
                      same_process=bool(after and after["boot"] == ready["boot"]))
        result["ok"] = bool(result["gpu_state_equal"] and result["same_process"])
    except Exception as e:  # noqa: BLE001 - the smoke records every failure as evidence
        result["error"] = f"{type(e).__name__}: {e}"
        step("error", error=result["error"])
    finally:
        for cid in ("smoke1", "smoke2"):
            try:
                r.delete(cid, force=True)
            except Exception:  # noqa: BLE001
                pass
        result["events_tail"] = read_events(events)[-5:]
        (out / "smoke.json").write_text(json.dumps(result, indent=2))
        print(json.dumps({k: v for k, v in result.items() if k not in ("steps", "events_tail")}, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
