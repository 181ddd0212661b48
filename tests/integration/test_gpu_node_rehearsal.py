"""The GPU node run (issue 15) rehearsed on CPU: `bench/gpu/node.sh --cpu`, the
script the H200 runs, with a fake GPU. Every step but the GPU's own goes
through the real stack: `thaw provision` into the node's real paths (bind
mounts in a private mount namespace), SeaweedFS, thawd, containerd with
gVisor's shim and thaw's stand-in, runsc; `ctr run --device` with a CDI spec;
the automatic checkpoint and publish, `thaw evict`, a pull from the store, a
restore onto the other (fake) GPU, a warm-cache restore, each repeated
(--repeat 3: two more cold starts of a twin workload thawd neither restores
nor checkpoints, evictions, restores alternating between the fake GPUs) with
the headline's medians over the rounds, a streamed restore (issue 18: thawd
restarted with store.stream on, the image restored while it arrives, whole in
the cache afterwards), parked sandboxes adopted (docs/parking.md: thawd
restarted with park.enabled, each parked sandbox on a spool directory of its
own, the template and every earlier container gone before each adoption, and
proof of which sandbox answered: issue 32 item 5), and a chunk altered in the
store that ends in a cold start and a quarantined image."""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import BUILD, REPO, require

REPEAT = 3
STREAM = 2
PARK = 2
NODE_PATHS = ("/opt/thaw", "/etc/thaw", "/etc/containerd", "/etc/cdi", "/etc/tmpfiles.d", "/var/lib/thaw",
              "/var/log/thaw", "/var/lib/containerd", "/run/containerd", "/run/thaw")   # twin: bench/gpu/node.py


def _kill_leftovers(work: Path) -> None:
    pids = work / "pids"
    if pids.exists():
        for line in pids.read_text().split():
            try:
                os.killpg(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(560)
def test_gpu_node_script_rehearsed_on_cpu(name, tmp_path):
    require(os.geteuid() == 0, "root")
    for b in ("containerd", "ctr", "containerd-shim-runsc-v1", "runsc", "thaw-runsc", "thaw-runsc-hooks",
              "thaw-chunk", "thaw-fetch", "thaw-gofer"):
        require((BUILD / b).is_file(), f"{b} built in {BUILD} (make setup)")
    work, out = Path(f"/tmp/thaw-it/{name}"), tmp_path / "out"
    _kill_leftovers(work)
    existed = {p: os.path.exists(p) for p in NODE_PATHS}
    try:
        p = subprocess.run(["bash", "bench/gpu/node.sh", "--cpu", "--work", str(work), "--out", str(out),
                            "--budget-s", "440", "--repeat", str(REPEAT), "--stream", str(STREAM), "--park", str(PARK)],
                           cwd=REPO, capture_output=True, text=True, timeout=500)
        assert (out / "node.json").is_file(), p.stdout[-3000:] + p.stderr[-3000:]
        r = json.loads((out / "node.json").read_text())
        failed = [c for c in r["checks"] if not c["ok"]]
        assert p.returncode == 0 and r["ok"], (r["errors"], failed, p.stdout[-3000:])
    finally:
        _kill_leftovers(work)
    names = [s["step"] for s in r["steps"]]
    rounds = ["cold", "evict", "restore_from_store", "restore_from_cache"]
    assert names == ["stack", "weights", "cold", "checkpoint", "evict", "restore_from_store", "restore_from_cache",
                     *rounds * (REPEAT - 1), "thawd_restart", *["evict", "restore_streamed"] * STREAM,
                     "thawd_restart", "thawd_restart", "park_template", *["restore_parked"] * PARK,
                     "thawd_restart", "broken_image"], names
    steps = {n: [s for s in r["steps"] if s["step"] == n] for n in names}
    assert r["mode"] == "cpu" and len(r["checks"]) >= 12 * REPEAT
    # The GPU's own steps are skipped by design, and say so.
    assert {s["what"] for s in r["skipped"]} >= {"nvproxy and the CUDA checkpoint helper",
                                                 "the transformers model on the GPU"}

    stack = steps["stack"][0]
    assert stack["provision_steps"]["install thaw-runsc"] == "created"
    assert stack["provision_steps"]["cdi spec"] == "skipped"          # a CPU node
    assert "quarantine_after = 1" in stack["config"] and "prepare_timeout_s = 60" in stack["config"]
    assert 'binary_name = "/opt/thaw/bin/thaw-runsc"' in stack["runsc_toml"]

    colds, stores, caches = steps["cold"], steps["restore_from_store"], steps["restore_from_cache"]
    assert len(colds) == len(stores) == len(caches) == REPEAT
    cold, store, cache, broken = colds[0], stores[0], caches[0], steps["broken_image"][0]
    assert cold["gpu_assigned"]["index"] == 0 and cold["server_gpu"]["gpu"] == "fake"
    ck = steps["checkpoint"][0]
    # The tenant is the containerd namespace thawd found through thaw-ctrinfo (issue 13).
    assert ck["key"].startswith("ctr-thaw-gpu-node.gpu-server.") and ck["checkpoint"]["image_bytes"] > 0
    assert ck["publish"]["uploaded_bytes"] > 0 and ck["publish"]["seconds"] > 0
    assert ck["nvidia_smi"]["uuids"] == ["GPU-fake-0000"]
    assert all(e["result"]["evicted"] is True for e in steps["evict"]) and len(steps["evict"]) == REPEAT + STREAM

    # The repeats' cold starts: a twin workload, cold for want of an image, probed by thawd
    # but never checkpointed; a new process each time, answering as the first did.
    for k, c in enumerate(colds[1:], start=2):
        assert c["container"] == f"c1-cold-r{k}" and c["workload"] == f"gpu-server-cold{k}"
        assert [d["decision"] for d in c["decisions"]] == ["cold", "started-cold"], c["decisions"]
        assert c["decisions"][0]["reason"] == "no-image" and "never ready" in c["auto_checkpoint"]
        assert c["images_of_workload"] == [] and c["answers_equal_first_cold"]
        assert len({x["boot"] for x in colds[:k]}) == k and c["nvidia_smi"]["uuids"] == ["GPU-fake-0000"]

    # Pulled from the store, restored onto the other GPU, the same process answering the same;
    # every round pulls again (evicted before) and alternates the GPUs.
    for k, (st, ca) in enumerate(zip(stores, caches), start=1):
        assert st["round"] == ca["round"] == k
        assert st["decisions"][0]["decision"] == "restore" and st["same_process"] and st["identical"]
        assert st["pull"]["fetched_bytes"] > 0 and st["pull"]["image_mb_s"] > 0
        assert st["pull"]["of_disk_read_limit"] > 0 and st["disk"] == store["disk"]
        assert (st["gpu_before"], st["gpu_after"]) == (0, k % 2)
        assert st["nvidia_smi"]["uuids"] == [f"GPU-fake-000{k % 2}"] and st["nvidia_smi"]["host_indexes"] == [k % 2]
        assert ca["cache_hits"] == 1 and ca["identical"] and ca["gpu_after"] == (k - 1) % 2
    assert store["disk"]["mb_s"] > 0 and store["disk"]["round"] == 1     # dd once a run

    # Streamed (issue 18): thawd restarted with store.stream on, no pull first, the same
    # process answering the same on the other GPU, the image whole in the cache once the
    # stream ended; thawd back to pulls for the broken image.
    restarts = steps["thawd_restart"]
    assert [(x["stream"], x["park"]) for x in restarts] == [(True, False), (False, False), (False, True),
                                                           (False, False)]
    streamed = steps["restore_streamed"]
    assert len(streamed) == STREAM
    for k, st in enumerate(streamed, start=1):
        assert st["round"] == k and st["streamed"] and st["pulled_whole"] == [], st
        assert st["decisions"][0]["decision"] == "restore" and st["same_process"] and st["identical"]
        assert st["stream"]["seconds"] > 0 and len(st["cache_entries"]) == 1
        assert st["gpu_after"] == k % 2 and st["nvidia_smi"]["uuids"] == [f"GPU-fake-000{k % 2}"]

    # Parked (issue 32 item 5): each adoption answered identically, through its parked
    # sandbox's own spool directory (the nonce written before each request read back), with
    # the template and every earlier container gone first and only the adopted sandbox's
    # processes holding that directory open.
    parked = steps["restore_parked"]
    ids = [x["parked"]["id"] for x in parked]
    assert len(set(ids)) == PARK and all(i.startswith("thaw-parked-") for i in ids), ids
    for k, x in enumerate(parked, start=1):
        assert x["round"] == k and [d["decision"] for d in x["decisions"]] == ["adopt", "restored"], x
        assert x["identical"] and x["boot_of_checkpointed_process"]
        assert x["earlier_gone"]["gone"] and "c6-park-seed" in x["earlier_gone"]["ids"], x["earlier_gone"]
        assert set(ids[:k - 1]) | {f"c6-park-{j}" for j in range(1, k)} <= set(x["earlier_gone"]["ids"])
        sp = x["spool"]
        assert sp["dir"] == f"park-{k}" and sp["linked_at"] <= sp["parked_at"] < sp["next_linked_at"], sp
        assert [a["op"] for a in sp["answers"]] == ["generate", "gpu"]
        assert all(a["nonce_seen"] == a["nonce_sent"] and a["nonce_sent"].startswith(f"park-{k}:")
                   for a in sp["answers"]), sp
        assert {h["sandbox"] for h in sp["holders"].values()} == {ids[k - 1]}, sp["holders"]
    tpl = steps["park_template"][0]["spool"]
    # The holders check's control: the template, which answered through park-1, held it;
    # so may the sandbox its start made thawd park (it shares park-1), named by its bundle.
    held = {h["sandbox"] for h in tpl["holders"].values()}
    assert tpl["dir"] == "park-1" and "c6-park-seed" in held, tpl
    assert held - {"c6-park-seed"} <= {f"parked:{i}" for i in ids}, tpl
    assert all(s["spool"]["dir"] == "main" for s in colds + stores + caches + streamed)
    assert r["headline"]["restore_parked_to_first_answer_s"]["runs_s"] == [x["first_answer_s"] for x in parked]
    # Seven checks a round on CPU (the GPU adds the CUDA wake's): each of the above, in node.json.
    park_checks = [c["check"] for c in r["checks"] if c["check"].startswith("parked#")]
    assert len(park_checks) == 7 * PARK and sum("hold park-" in c for c in park_checks) == PARK, park_checks

    # The altered chunk: refused at the pull, cold start, quarantined.
    assert broken["decisions"][0]["decision"] == "cold" and "altered" in broken["decisions"][0]["reason"]
    assert broken["boot"] != cold["boot"] and "fetch-failed" in broken["quarantine"]
    assert "tenants/ctr-thaw-gpu-node/packs/" in broken["altered"]["object"]   # the tenant's own pack

    # The headline: every series' runs in order, their median, min, max and n, the ratios of the medians.
    h = r["headline"]
    assert h["repeat"] == {"asked": REPEAT, "done": {"cold": REPEAT, "store": REPEAT, "cache": REPEAT}}
    for key, series in (("cold_start_to_first_answer_s", colds), ("restore_from_store_to_first_answer_s", stores),
                        ("restore_from_cache_to_first_answer_s", caches)):
        runs = [x["first_answer_s"] for x in series]
        assert h[key] == {"runs_s": runs, "n": REPEAT, "median_s": round(statistics.median(runs), 3),
                          "min_s": min(runs), "max_s": max(runs)}, (key, h[key])
    for series in ("store", "cache"):
        assert h[f"ctr_run_cold_vs_restored_from_{series}"] == round(
            h["cold_start_to_first_answer_s"]["median_s"] / h[f"restore_from_{series}_to_first_answer_s"]["median_s"],
            2)
    assert h["pull_image_mb_s"]["runs_mb_s"] == [s["pull"]["image_mb_s"] for s in stores]
    assert h["pull_of_disk_read_limit"]["n"] == REPEAT and h["disk_read_limit"]["mb_s"] > 0
    assert {k: v for k, v in h["gpu_index"].items() if k != "stream"} == {
        "cold": [0] * REPEAT, "store": [k % 2 for k in range(1, REPEAT + 1)],
        "cache": [(k - 1) % 2 for k in range(1, REPEAT + 1)]}
    runs = [x["first_answer_s"] for x in streamed]
    assert h["restore_streamed_to_first_answer_s"]["runs_s"] == runs
    assert h["streamed_vs_pull_then_restore"] == round(
        h["restore_streamed_to_first_answer_s"]["median_s"] / h["restore_from_store_to_first_answer_s"]["median_s"], 3)
    assert h["stream_to_whole_in_cache_s"]["n"] == STREAM and h["gpu_index"]["stream"] == [1, 0]
    assert h["answers_identical"] and h["checkpoint"]["image_bytes"] > 0 and h["publish"]["uploaded_bytes"] > 0
    # Every restore read its pages through thaw-gofer: from the cache each chunk checked
    # (cache.verify = read, issue 30), so not through the pages-file loader
    # ci/patch-runsc-loader.py tunes.
    assert all(x["read_through_gofer"] for x in stores + caches), [x["page_loader"] for x in stores + caches]
    with tarfile.open(out / "node-logs.tar.xz") as tar:
        names = tar.getnames()
    assert "logs/thawd.log" in names and "var-log-thaw/standin.log" in names and "server.log" in names

    # Nothing of the machine's was left changed: mount points made for the run are gone again.
    assert {p: os.path.exists(p) for p in NODE_PATHS} == existed
    assert not work.exists()


# One lap (bench/gpu/soak.py Soak.lap): store, cache, cache, stream, cache, the park rounds'
# template (a cache restore), park, park.
LAP = ["store", "cache", "cache", "stream", "cache", "cache", "park", "park"]
SOAK = len(LAP)


def _soak(name: str, tmp_path: Path, *args: str, laps: int = 1) -> dict:
    """`bench/gpu/soak.sh --cpu` for `laps` laps (SOAK restores each); its soak.json, every check passed."""
    require(os.geteuid() == 0, "root")
    require((BUILD / "runsc").is_file(), f"runsc built in {BUILD} (make setup)")
    work, out = Path(f"/tmp/thaw-it/{name}"), tmp_path / "out"
    _kill_leftovers(work)
    try:
        p = subprocess.run(["bash", "bench/gpu/soak.sh", "--cpu", "--work", str(work), "--out", str(out),
                            "--soak", str(SOAK * laps), "--budget-s", str(200 * laps), *args],
                           cwd=REPO, capture_output=True, text=True, timeout=220 * laps)
        assert (out / "soak.json").is_file(), p.stdout[-3000:] + p.stderr[-3000:]
        r = json.loads((out / "soak.json").read_text())
        assert p.returncode == 0 and r["ok"], (r["errors"], [c for c in r["checks"] if not c["ok"]])
    finally:
        _kill_leftovers(work)
    # node.sh collects soak-logs.tar.xz on the device: the soak's logs carry its name
    assert (out / "soak-logs.tar.xz").is_file() and not (out / "node-logs.tar.xz").exists()
    assert not work.exists()
    rows = r["restores"]
    assert [x["kind"] for x in rows] == LAP * laps, rows
    for x in rows:
        assert x["ok"] and x["identical"] is True and x["t"] > 0, x
        # Only this start's decisions, though a later lap's containers were named as an earlier's
        # once (the H200 soak of 2026-12-05 failed every adoption after the first lap that way).
        assert x["decisions"] == (["adopt", "restored"] if x["kind"] == "park" else ["restore", "restored"]), x
    assert [x["container"] for x in rows if x["kind"] == "park"] == [
        f"c6-park-L{n}-{k}" for n in range(1, laps + 1) for k in (1, 2)]
    assert {k: v["count"] for k, v in r["soak"]["kinds"].items()} == {
        "store": laps, "cache": 4 * laps, "stream": laps, "park": 2 * laps}
    assert r["soak"]["failures"] == 0
    return r


@pytest.mark.timeout(480)
def test_gpu_soak_script_rehearsed_on_cpu(name, tmp_path):
    """Issue 32 item 3's soak, rehearsed: `bench/gpu/soak.sh --cpu` runs two laps of every
    kind of restore; each must have restored (not cold) and answered as the cold start did."""
    r = _soak(name, tmp_path, laps=2)
    assert all(len(r["build"][k]) == 64 for k in ("runsc_sha256", "bins_sha256", "product_sha256")), r["build"]
    assert r["build"]["thaw_commit"]
    assert r["profile"] == "pytorch" and {x["profile"] for x in r["restores"]} == {"pytorch"}
    assert all(x["weights_back_s"] is None for x in r["restores"])   # the pytorch profile has no post-restore hook
    assert "native" not in r       # the driver's own restore runs on a GPU only


@pytest.mark.timeout(240)
def test_gpu_soak_cooperative_rehearsed_on_cpu(name, tmp_path):
    """Issue 32 items 3 and 6, rehearsed: `--profile pytorch-offload` runs the lap on the
    cooperative image through containerd. thawd checkpointed it behind the profile's
    pre-checkpoint hooks (the weights offloaded), gave the cold container its weights back
    (it serves on: thawd.leave_running), and ran the post-restore hook at every restore and
    every adoption of a parked sandbox before the first answer: the fake server refuses to
    generate while its weights are offloaded, so an identical answer is one the hook made
    possible."""
    r = _soak(name, tmp_path, "--profile", "pytorch-offload")
    assert r["profile"] == "pytorch-offload" and r["options"]["profile"] == "pytorch-offload"
    checks = {c["check"]: c for c in r["checks"]}
    pre = checks["checkpoint: thawd ran the pytorch-offload profile's pre-checkpoint hooks (/thaw/pre-checkpoint, "
                 "/thaw/offload-weights) and each answered"]
    assert pre["ok"] and pre["detail"]["profile"] == "pytorch-offload", pre
    back = next(c for c in r["checks"] if c["check"].startswith("checkpoint: the cold container serves on"))
    assert back["ok"] and back["detail"]["identical"] is True, back
    hooked = [c for c in r["checks"] if "profile's post-restore hook on" in c["check"]]
    # each of the restores, the park rounds' template (a cache restore) among them
    assert len(hooked) == SOAK and all(c["ok"] for c in hooked), hooked
    parked = [c["check"] for c in hooked if c["check"].startswith("parked#")]
    assert len(parked) == 2 and all(" on thaw-parked-" in c for c in parked), parked   # woken: the parked sandbox
    for x in r["restores"]:
        assert x["profile"] == "pytorch-offload" and x["weights_back_s"] > 0 and x["weights_copy_s"] is not None, x
    assert set(r["soak"]["profiles"]) == {f"tiny/pytorch-offload/{k}" for k in ("store", "cache", "stream", "park")}
    pv = r["parked_vs_native"]
    assert pv["parked_first_answer_s"]["n"] == 2 and pv["parked_weights_back_s"]["n"] == 2, pv
    assert pv["target_s"] == 1.5 and pv["native_restore_s"] is None, pv   # no native restore on CPU
