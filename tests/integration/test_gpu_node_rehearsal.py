"""The GPU node run (issue 15) rehearsed on CPU: `bench/gpu/node.sh --cpu`, the
script the H200 runs, with a fake GPU. Every step but the GPU's own goes
through the real stack: `thaw provision` into the node's real paths (bind
mounts in a private mount namespace), SeaweedFS, thawd, containerd with
gVisor's shim and thaw's stand-in, runsc; `ctr run --device` with a CDI spec;
the automatic checkpoint and publish, `thaw evict`, a pull from the store, a
restore onto the other (fake) GPU, a warm-cache restore, and a chunk altered
in the store that ends in a cold start and a quarantined image."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
from pathlib import Path

from tests.conftest import BUILD, REPO, require

NODE_PATHS = ("/opt/thaw", "/etc/thaw", "/etc/containerd", "/etc/cdi", "/var/lib/thaw", "/var/log/thaw",
              "/var/lib/containerd", "/run/containerd", "/run/thaw")   # twin: bench/gpu/node.py


def _kill_leftovers(work: Path) -> None:
    pids = work / "pids"
    if pids.exists():
        for line in pids.read_text().split():
            try:
                os.killpg(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_gpu_node_script_rehearsed_on_cpu(name, tmp_path):
    require(os.geteuid() == 0, "root")
    for b in ("containerd", "ctr", "containerd-shim-runsc-v1", "runsc", "thaw-runsc", "thaw-runsc-hooks",
              "thaw-chunk", "thaw-fetch"):
        require((BUILD / b).is_file(), f"{b} built in {BUILD} (make setup)")
    work, out = Path(f"/tmp/thaw-it/{name}"), tmp_path / "out"
    _kill_leftovers(work)
    existed = {p: os.path.exists(p) for p in NODE_PATHS}
    try:
        p = subprocess.run(["bash", "bench/gpu/node.sh", "--cpu", "--work", str(work), "--out", str(out),
                            "--budget-s", "240"], cwd=REPO, capture_output=True, text=True, timeout=420)
        assert (out / "node.json").is_file(), p.stdout[-3000:] + p.stderr[-3000:]
        r = json.loads((out / "node.json").read_text())
        failed = [c for c in r["checks"] if not c["ok"]]
        assert p.returncode == 0 and r["ok"], (r["errors"], failed, p.stdout[-3000:])
    finally:
        _kill_leftovers(work)
    steps = {s["step"]: s for s in r["steps"]}
    assert list(steps) == ["stack", "weights", "cold", "checkpoint", "evict", "restore_from_store",
                           "restore_from_cache", "broken_image"]
    assert r["mode"] == "cpu" and len(r["checks"]) >= 12
    # The GPU's own steps are skipped by design, and say so.
    assert {s["what"] for s in r["skipped"]} >= {"nvproxy and the CUDA checkpoint helper",
                                                 "the transformers model on the GPU"}

    stack = steps["stack"]
    assert stack["provision_steps"]["install thaw-runsc"] == "created"
    assert stack["provision_steps"]["cdi spec"] == "skipped"          # a CPU node
    assert "quarantine_after = 1" in stack["config"] and "prepare_timeout_s = 60" in stack["config"]
    assert 'binary_name = "/opt/thaw/bin/thaw-runsc"' in stack["runsc_toml"]

    cold, store, cache, broken = (steps[k] for k in ("cold", "restore_from_store", "restore_from_cache",
                                                     "broken_image"))
    assert cold["gpu_assigned"]["index"] == 0 and cold["server_gpu"]["gpu"] == "fake"
    ck = steps["checkpoint"]
    # The tenant is the containerd namespace thawd found through thaw-ctrinfo (issue 13).
    assert ck["key"].startswith("ctr-thaw-gpu-node.gpu-server.") and ck["checkpoint"]["image_bytes"] > 0
    assert ck["publish"]["uploaded_bytes"] > 0 and ck["publish"]["seconds"] > 0
    assert ck["nvidia_smi"]["uuids"] == ["GPU-fake-0000"]
    assert steps["evict"]["result"]["evicted"] is True

    # Pulled from the store, restored onto the other GPU, the same process answering the same.
    assert store["decisions"][0]["decision"] == "restore" and store["same_process"] and store["identical"]
    assert store["pull"]["fetched_bytes"] > 0 and store["pull"]["image_mb_s"] > 0
    assert store["disk"]["mb_s"] > 0 and store["pull"]["of_disk_read_limit"] > 0
    assert (store["gpu_before"], store["gpu_after"]) == (0, 1)
    assert store["nvidia_smi"]["uuids"] == ["GPU-fake-0001"] and store["nvidia_smi"]["host_indexes"] == [1]
    assert cache["cache_hits"] == 1 and cache["identical"] and cache["gpu_after"] == 0

    # The altered chunk: refused at the pull, cold start, quarantined.
    assert broken["decisions"][0]["decision"] == "cold" and "altered" in broken["decisions"][0]["reason"]
    assert broken["boot"] != cold["boot"] and "fetch-failed" in broken["quarantine"]
    assert "tenants/ctr-thaw-gpu-node/packs/" in broken["altered"]["object"]   # the tenant's own pack

    h = r["headline"]
    assert h["gpu_index"] == {"cold": 0, "store": 1, "cache": 0} and h["answers_identical"]
    assert h["ctr_run_cold_vs_restored_from_cache"] > 0 and h["cold_start_to_first_answer_s"] > 0
    with tarfile.open(out / "node-logs.tar.xz") as tar:
        names = tar.getnames()
    assert "logs/thawd.log" in names and "var-log-thaw/standin.log" in names and "server.log" in names

    # Nothing of the machine's was left changed: mount points made for the run are gone again.
    assert {p: os.path.exists(p) for p in NODE_PATHS} == existed
    assert not work.exists()
