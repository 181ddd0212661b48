"""Kubernetes pod benchmark: crictl pod start to first answer, cold vs restored,
for a pod of two containers, side by side in one run.

    .venv/bin/python bench/pods.py [--repeat 3] [--weights-mb 256] [--warmup-rounds 6] [--out FILE]

Runs a complete loopback thaw node with containerd's CRI plugin
(control/dev/testbed.py CriStack: SeaweedFS, thawd, a private containerd
with CRI, gVisor's shim with thaw's stand-in under the `runsc-thaw` handler)
and drives it with crictl in the kubelet's order: RunPodSandbox, then
CreateContainer + StartContainer for the app and for the sidecar. The app's
warm-up (random "weights" in memory, hashed several times) stands in for a
model server's start-up; it then serves its state over HTTP on the pod's
address. "First answer" is the first HTTP 200 from http://<pod ip>:8080/,
timed from just before `crictl runp`. Cold runs are the same pod without the
opt-in annotation (plain runsc through the stand-in); restored runs are opted
in and find the image thawd published after the seed pod's cold start.
Cold and restored runs alternate.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import emit, spread  # noqa: E402
from control.dev.testbed import CriStack, pod_annotations  # noqa: E402

WORKLOAD = "bench-pods"


def first_answer(s: CriStack, name: str, annotations: dict, containers: dict) -> dict:
    """One pod: crictl runp, create + start of each container, then HTTP until the app answers."""
    t0 = time.monotonic()
    cfg = s.cri.pod_config(name, annotations, uid=f"{name}-uid")
    pod = s.cri.runp(cfg, "runsc-thaw")
    t_runp = time.monotonic() - t0
    ids = {}
    for cname, env in containers.items():
        cid = s.cri.create(pod, s.cri.container_config(f"{name}-0", cname, env=env,
                                                        image="thaw.dev/test/pod:1"), cfg)
        s.cri.start(cid)
        ids[cname] = cid
    t_started = time.monotonic() - t0
    ip = s.cri.pod_ip(pod)
    end = time.monotonic() + 600
    body = ""
    while True:
        try:
            body = urllib.request.urlopen(f"http://{ip}:8080/", timeout=2).read().decode()
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.01)
    t_answer = time.monotonic() - t0
    return {"pod": pod, "ids": ids, "boot": body.split()[0], "runp_s": round(t_runp, 3),
            "containers_started_s": round(t_started, 3), "first_answer_s": round(t_answer, 3)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weights-mb", type=int, default=256, help="in-memory 'weights' the app makes at start")
    ap.add_argument("--sidecar-weights-mb", type=int, default=32)
    ap.add_argument("--warmup-rounds", type=int, default=6, help="hash passes over the weights at start")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--base", type=Path, default=Path("/var/tmp/thaw-bench-pods"))
    ap.add_argument("--keep", action="store_true", help="keep --base (thawd's, containerd's and runsc's logs)")
    a = ap.parse_args()
    shutil.rmtree(a.base, ignore_errors=True)
    s = CriStack(a.base, "bench-pods")
    containers = {"app": {"PORT": "8080", "WEIGHTS_MB": str(a.weights_mb), "WARMUP_ROUNDS": str(a.warmup_rounds)},
                  "sidecar": {"WEIGHTS_MB": str(a.sidecar_weights_mb), "WARMUP_ROUNDS": str(a.warmup_rounds)}}
    result: dict = {
        "benchmark": "pods", "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, kernel {platform.release()})",
        "workload": (f"a pod of two busybox containers through CRI (crictl, handler runsc-thaw): app with "
                     f"{a.weights_mb} MB of random 'weights' in sandbox memory hashed {a.warmup_rounds} times at "
                     f"start, then busybox httpd on :8080; sidecar with {a.sidecar_weights_mb} MB, same warm-up; "
                     "each keeps a boot id and a counter in memory"),
        "measure": "monotonic seconds from just before `crictl runp` to the first HTTP 200 from the pod's "
                   "address (runp, then create + start of app and sidecar, then GET every 10 ms)",
        "cold": "the same pod without thaw.dev/workload (plain runsc through the stand-in)",
        "restored": f"opted in (workload {WORKLOAD}, both containers declared), restored from the image thawd "
                    "published after the seed pod's cold start",
        "repeat": a.repeat,
        # Other work on the machine skews 2-core timings: what was running when this began.
        "loadavg_at_start": open("/proc/loadavg").read().split()[:3]}
    try:
        s.start()
        ann = pod_annotations(WORKLOAD)
        seed = first_answer(s, "seed", ann, containers)
        entry = s.wait_key(f"k8s-default.{WORKLOAD}.", timeout_s=600)
        s.cri.remove_pod(seed["pod"])
        result.update(seed_cold_first_answer_s=seed["first_answer_s"], image_bytes=entry["bytes"],
                      workload_key=entry["key"])
        cold, warm = [], []
        for i in range(a.repeat):
            c = first_answer(s, f"cold{i}", {}, containers)
            assert c["boot"] != seed["boot"], "a cold pod has a new boot id"
            s.cri.remove_pod(c["pod"])
            cold.append({k: c[k] for k in ("runp_s", "containers_started_s", "first_answer_s")})
            w = first_answer(s, f"warm{i}", ann, containers)
            assert w["boot"] == seed["boot"], "a restored pod answers with the seed's memory"
            for cname, cid in w["ids"].items():
                s.state(cid)  # both containers answer exec
            s.cri.remove_pod(w["pod"])
            warm.append({k: w[k] for k in ("runp_s", "containers_started_s", "first_answer_s")})
        decisions = [d for d in s.decisions() if d["cmd"] == "start"]
        cm = spread([x["first_answer_s"] for x in cold])
        wm = spread([x["first_answer_s"] for x in warm])
        result.update(
            cold_runs=cold, restored_runs=warm, cold_first_answer=cm, restored_first_answer=wm,
            restored_runp=spread([x["runp_s"] for x in warm]), cold_runp=spread([x["runp_s"] for x in cold]),
            speedup=round(cm["median_s"] / wm["median_s"], 2),
            standin_start_decisions={k: sum(1 for d in decisions if d["decision"] == k)
                                     for k in sorted({d["decision"] for d in decisions})},
            counters=s.stats()["counters"])
    finally:
        s.stop()
        if not a.keep:
            shutil.rmtree(a.base, ignore_errors=True)
    return emit(result, a.out)


if __name__ == "__main__":
    sys.exit(main())
