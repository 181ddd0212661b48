"""The GPU pods run (issue 28) rehearsed on CPU: `bench/gpu/pods.sh --cpu`, the script
the H200 runs, with fake GPUs (testbed.write_fake_gpus: device nodes and a fake
nvidia-smi, given through CRI's CDI injection) and the server's fake backend. Every
other part is the real stack: two nodes on one machine, each its own containerd with
CRI (ci/cri.sh), thawd and cache, one SeaweedFS; pods driven through crictl as the
kubelet calls CRI (runp with runsc-thaw, create with the CDI device, start); a cold
pod checkpointed and published by thawd, pods on the new node B streamed from the
store (its table and cache entry removed before each), pods on A from its cache, pods
on B pulled whole then restored, a twin workload's cold pod, and the same image as a
lone container (`ctr run`) cold and restored; two rounds of each."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import BUILD, REPO, require

REPEAT = 2


@pytest.mark.timeout(480)
def test_gpu_pods_script_rehearsed_on_cpu(name, tmp_path):
    require(os.geteuid() == 0, "root")
    for b in ("containerd", "ctr", "crictl", "containerd-shim-runsc-v1", "runsc", "thaw-runsc", "thaw-runsc-hooks",
              "thaw-chunk", "thaw-fetch", "thaw-gofer", "thaw-ctrinfo", "thaw-image", "busybox", "cni-bin/ptp",
              "cni-bin/host-local", "cni-bin/loopback"):
        require((BUILD / b).is_file(), f"{b} built in {BUILD} (make setup)")
    work, out = Path(f"/tmp/thaw-it/{name}"), tmp_path / "out"
    cdi_before = {p: os.path.exists(p) for p in ("/etc/cdi", "/var/run/cdi")}
    p = subprocess.run(["bash", "bench/gpu/pods.sh", "--cpu", "--work", str(work), "--out", str(out),
                        "--budget-s", "360", "--repeat", str(REPEAT)], cwd=REPO, capture_output=True, text=True,
                       timeout=440)
    assert (out / "pods.json").is_file(), p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "pods.json").read_text())
    failed = [c for c in r["checks"] if not c["ok"]]
    assert p.returncode == 0 and r["ok"], (r["errors"], failed, p.stdout[-3000:])
    names = [s["step"] for s in r["steps"]]
    assert names == ["weights", "up", "cold", "checkpoint", *["streamed"] * REPEAT, *["cache"] * REPEAT,
                     "thawd_restart", *["pull"] * REPEAT, *["cold"] * (REPEAT - 1), "lone_cold",
                     *["lone_cache"] * REPEAT], names
    steps = {n: [s for s in r["steps"] if s["step"] == n] for n in names}
    assert {s["what"] for s in r["skipped"]} == {"nvproxy, the CUDA helper and GPU memory in the pod",
                                                 "the transformers model on the GPU"}
    assert 'debug-log = "' in steps["up"][0]["runsc_toml"] and steps["up"][0]["cdi_spec"] == ["thaw-fake-gpu.json"]

    cold, ck = steps["cold"][0], steps["checkpoint"][0]
    assert cold["node"] == "a" and cold["pod_name"].startswith("gpu-pod-5d8f7b6c9d-")
    assert [d[:2] for d in cold["decisions"]["pod"]] == [["create", "cold"], ["start", "started-cold"]]
    assert "/dev/nvidia0" in cold["devices"] and cold["nvidia_smi"]["uuids"] == ["GPU-fake-0000"]
    assert ck["key"].startswith("k8s-default.gpu-pod.") and ck["bytes"] > 0

    # Node B is a new node every round: its table comes from the store, its image streams in.
    for k, st in enumerate(steps["streamed"], start=1):
        assert st["round"] == k and st["node"] == "b" and st["same_process"] and st["identical"], st
        assert st["boot"] == cold["boot"] and st["sidecar_boot"] == cold["sidecar_boot"]
        assert "pod table from the store" in st["table_from"][0] and st["stream_done"] and not st["pulled_whole"]
        assert st["new_node"]["entries_left"] == [] and st["new_node"]["tables_removed"] == (0 if k == 1 else 1)
        assert st["gpu_assigned"] == k % 2 and st["nvidia_smi"]["uuids"] == [f"GPU-fake-000{k % 2}"]
        assert f"/dev/nvidia{k % 2}" in st["devices"]
    for k, ca in enumerate(steps["cache"], start=1):
        assert ca["node"] == "a" and ca["cache_hits"] == 1 and ca["same_process"] and ca["identical"]
    for k, pu in enumerate(steps["pull"], start=1):
        assert pu["node"] == "b" and pu["pull"] and pu["same_process"] and pu["identical"]
    assert [x["stream"] for x in steps["thawd_restart"]] == [False]
    twin = steps["cold"][1]
    assert twin["workload"] == "gpu-pod-cold2" and twin["boot"] != cold["boot"] and twin["answers_equal_first_cold"]
    assert "never ready" in twin["auto_checkpoint"], twin["auto_checkpoint"]
    lone = steps["lone_cold"][0]
    assert [d[:2] for d in lone["decisions"]] == [["create", "cold"], ["start", "started-cold"]]
    for lc in steps["lone_cache"]:
        assert lc["key"].startswith("ctr-thaw-lone.gpu-lone.") and lc["same_process"] and lc["identical"]

    # Every crictl, ctr and thaw command is in the report, in the kubelet's order for a pod.
    argv = [" ".join(c["argv"]) for c in r["commands"]]
    verbs = [a.split(" --config ")[1].split()[1] for a in argv if "crictl --config" in a]
    assert verbs[:5] == ["runp", "create", "start", "create", "start"], verbs[:5]
    assert any("runp --runtime runsc-thaw" in a for a in argv) and any(" run -d --null-io " in a for a in argv)
    # (an exec may fail and be tried again: a state read that met the file being replaced)
    calls = [c for c in r["commands"] if "crictl" in c["argv"][0] and c["argv"][3] != "exec"]
    assert all(c["rc"] == 0 for c in calls), [c for c in calls if c["rc"]]

    h = r["headline"]
    assert h["rounds"] == {"asked": REPEAT, **{k: REPEAT for k in ("cold", "streamed", "cache", "pull", "lone_cache")},
                           "lone_cold": 1}
    assert h["answers_identical"] and h["same_process"]
    for k in ("pod_cold_to_first_answer_s", "pod_streamed_new_node_to_first_answer_s", "pod_from_cache_to_first_answer_s",
              "pod_pull_then_restore_new_node_to_first_answer_s", "lone_from_cache_to_first_answer_s"):
        assert h[k]["n"] == REPEAT and h[k]["median_s"] > 0, (k, h[k])
    t = h["targets"]
    assert t["pod_vs_lone_from_cache"]["value"] == round(
        h["pod_from_cache_to_first_answer_s"]["median_s"] / h["lone_from_cache_to_first_answer_s"]["median_s"], 3)
    assert t["streamed_vs_pull_then_restore"]["target"] == 0.5 and t["pod_vs_lone_from_cache"]["target"] == 1.15
    assert h["gpu_index"]["streamed"] == [1, 0] and h["gpu_index"]["cache"] == [0, 1]
    with tarfile.open(out / "pods-logs.tar.xz") as tar:
        logs = tar.getnames()
    assert {"a/thawd.log", "b/thawd.log", "a/standin.log", "a/containerd.log"} <= set(logs), logs[:20]

    # Nothing of the machine's was left changed.
    assert {p: os.path.exists(p) for p in cdi_before} == cdi_before
    assert not work.exists()
