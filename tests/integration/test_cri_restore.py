"""Kubernetes pods restored through CRI: a private containerd with its CRI
plugin (ci/cri.sh), gVisor's shim with thaw's stand-in under the `runsc-thaw`
handler, thawd and SeaweedFS (control/dev/testbed.py CriStack), driven by
crictl in the kubelet's order: RunPodSandbox, then CreateContainer and
StartContainer per container. The pod is an app and a sidecar, each with a
boot id and a counter in memory (testbed POD_SCRIPT). Nothing is faked.
store.stream is on, thaw-gofer at build/thaw-gofer: a pod whose image is not in
the node cache streams it (issue 18); the other tests restore from the cache.
CRI's CDI registry holds two fake GPUs (testbed.write_fake_gpus: device nodes
/dev/nvidia0 and /dev/nvidia1 and a fake nvidia-smi each; no /dev/nvidiactl,
which turns runsc's nvproxy on and cannot start without a driver), asked for as
the kubelet asks for a device plugin's GPU: CDI_devices in the container config.

One stack serves the module (its start is most of the cost); every test uses
its own workload name, so their images and pod records do not meet."""
from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from control.dev.cri import CrictlError
from control.dev.testbed import FAKE_GPU_DIR, POD_CONTAINERS, POD_IMAGE, POD_IMAGE_2, CriStack, pod_annotations

from tests.conftest import BUILD, require
from tests.integration import streamed

BASE = Path("/tmp/thaw-it/t-cri-restore")


@pytest.fixture(scope="module")
def cs(runsc_bin):
    for b in ("crictl", "containerd", "thaw-runsc", "thaw-runsc-hooks", "busybox", "cni-bin/ptp", "thaw-gofer"):
        require((BUILD / b).is_file(), f"{b} built at {BUILD / b}")
    subprocess.run(["rm", "-rf", str(BASE)])
    s = CriStack(BASE, "t-cri-restore", extra_env={"THAW_STORE_STREAM": "1",
                                                   "THAW_STORE_GOFER": str(BUILD / "thaw-gofer")}, gpus=2)
    try:
        yield s.start()
    finally:
        s.stop()
        subprocess.run(["rm", "-rf", str(BASE)])


def decisions(cs: CriStack, *ids: str) -> dict[str, list[tuple[str, str]]]:
    """The stand-in's decisions per container id: [(command, decision)]."""
    out: dict[str, list] = {i: [] for i in ids}
    for d in cs.decisions():
        if d["id"] in out:
            out[d["id"]].append((d["cmd"], d["decision"]))
    return out


def reason(cs: CriStack, cid: str, cmd: str = "create") -> str:
    return next(d["reason"] for d in cs.decisions() if d["id"] == cid and d["cmd"] == cmd)


def seed(cs: CriStack, workload: str, extra: dict | None = None) -> dict[str, tuple[str, int]]:
    """A pod of `workload` started cold, published by thawd once both containers were
    ready, then removed: the saved state of each container (`extra`: run_pod's)."""
    pod, _, ids = cs.run_pod(f"{workload}-seed", pod_annotations(workload), extra=extra)
    boots = {n: cs.state(c)[0] for n, c in ids.items()}
    entry = cs.wait_key(f"k8s-default.{workload}.")
    saved = {n: cs.state(c) for n, c in ids.items()}
    assert {n: s[0] for n, s in saved.items()} == boots, "checkpoints leave the pod running"
    assert decisions(cs, pod, *ids.values()) == {
        i: [("create", "cold"), ("start", "started-cold")] for i in (pod, *ids.values())}
    assert reason(cs, pod).startswith("no-image") and reason(cs, ids["app"]).startswith("pod-cold")
    cs.cri.remove_pod(pod)
    assert entry["key"].count("-") >= 1
    return saved


def test_pod_restores_both_containers_and_the_cri_view_stays_true(cs):
    w = "pods-restore"
    saved = seed(cs, w)
    pod, cfg, ids = cs.run_pod(f"{w}-b", pod_annotations(w), uid="b-uid")
    for n, cid in ids.items():
        boot, i = cs.state(cid)
        assert boot == saved[n][0], f"{n} must come back with its own saved memory"
        # The counter goes on from where the checkpoint saved it (the seed ran on
        # after its checkpoint, so `saved` may be ahead; a cold start has a new boot id).
        end = time.monotonic() + 5
        while cs.state(cid)[1] <= i and time.monotonic() < end:
            time.sleep(0.1)
        assert cs.state(cid)[1] > i >= 1
    assert saved["app"][0] != saved["sidecar"][0]
    assert decisions(cs, pod, *ids.values()) == {
        i: [("create", "restore"), ("start", "restored")] for i in (pod, *ids.values())}
    counters = cs.stats()["counters"]
    assert counters.get("thaw_restores_total") == 1, counters   # one restore: the pod

    # crictl pods / ps / inspect say what runs.
    pods = cs.cri.json("pods", "--name", f"{w}-b")["items"]
    assert [(p["id"], p["state"], p["runtimeHandler"]) for p in pods] == [(pod, "SANDBOX_READY", "runsc-thaw")]
    ps = {c["metadata"]["name"]: c for c in cs.cri.json("ps", "--pod", pod)["containers"]}
    assert {n: (c["id"], c["state"]) for n, c in ps.items()} == {
        n: (ids[n], "CONTAINER_RUNNING") for n in POD_CONTAINERS}
    info = cs.cri.json("inspect", ids["sidecar"])
    assert info["status"]["state"] == "CONTAINER_RUNNING" and info["info"]["pid"] > 0
    assert info["info"]["runtimeSpec"]["annotations"]["io.kubernetes.cri.container-name"] == "sidecar"
    # Logs: the restored processes write into this pod's log files (every line here is new).
    end = time.monotonic() + 10
    logs = ""
    while f"tick {saved['app'][0]}" not in logs and time.monotonic() < end:
        logs = cs.cri.crictl("logs", ids["app"]).stdout
        time.sleep(0.2)
    assert f"tick {saved['app'][0]}" in logs and "started" not in logs, logs[-500:]
    # The pod's new address answers with the restored app's memory.
    ip = cs.cri.pod_ip(pod)
    body = urllib.request.urlopen(f"http://{ip}:8080/", timeout=5).read().decode()
    assert body.split()[0] == saved["app"][0]
    assert "gvisor" in cs.cri.exec(ids["sidecar"], "cat", "/proc/version").stdout.lower()

    # The kubelet restarts a container that exited: it stops and removes it and
    # creates it again in the same pod (attempt 1). That one starts cold.
    cs.cri.crictl("stop", ids["app"])
    cs.cri.crictl("rm", ids["app"])
    again = cs.cri.create(pod, cs.cri.container_config(f"{w}-b-1", "app", env=POD_CONTAINERS["app"], attempt=1,
                                                       image=POD_IMAGE), cfg)
    cs.cri.start(again)
    assert cs.state(again)[0] not in (saved["app"][0], saved["sidecar"][0])
    assert decisions(cs, again)[again] == [("create", "cold"), ("start", "started-cold")]
    assert reason(cs, again).startswith("pod-running")
    assert cs.state(ids["sidecar"])[0] == saved["sidecar"][0], "the restart touches no other container"
    assert cs.stats()["counters"].get("thaw_restores_total") == 1

    cs.cri.crictl("stop", again)
    cs.cri.crictl("rm", again)
    cs.cri.remove_pod(pod)
    assert cs.cri.crictl("pods", "-q", "--name", f"{w}-b").stdout.strip() == ""
    entry = next(e for e in cs.stats()["entries"] if e["key"].startswith(f"k8s-default.{w}."))
    assert entry["leases"] == 0, "removing the pod released its image"


def gofer_log(cs: CriStack, key: str) -> str:
    """What the thaw-gofer of `key`'s stream logged (streamed.gofer_logs, for one key)."""
    return "".join(p.read_text() for p in sorted((cs.base / "log" / "streams").glob(f"{key}@*.gofer.log")))


def test_a_pod_whose_image_is_not_on_the_node_streams_it_while_it_restores(cs):
    """store.stream for a pod (issue 18): the image is in the store only, which thawd
    reads through thaw-s3proxy throttled to ~6 s for the image. The pause container's
    `runsc restore` starts thaw-gofer as runsc's checkpoint-gofer and the sentry opens
    the image through it, but the restore itself runs when the last app container
    registers (runsc/boot/restore.go): until then the sentry holds the image open (the
    gofer's "done" comes after). Both containers come back with their memory while the
    image still arrives, and the stream installs the node's cache entry as a pull would."""
    from tests.integration.faults.s3proxy import S3Proxy
    require((BUILD / "thaw-s3proxy").is_file(), "build/thaw-s3proxy (make setup)")
    w = "pods-stream"
    saved = seed(cs, w)
    entry = cs.wait_key(f"k8s-default.{w}.")
    key = entry["key"]
    assert cs.thaw("evict", key).returncode == 0
    assert streamed.cache_state(cs.base / "cache", key) == {"ready": [], "partials": [], "streams": []}
    proxy = S3Proxy(BUILD / "thaw-s3proxy", cs.weed.endpoint, cs.base / f"{w}-s3proxy.log").start()
    try:
        cs.stop_thawd()
        cs.extra_env["THAW_STORE_ENDPOINT"] = proxy.endpoint
        cs.start_thawd()
        proxy.add(kind="throttle", rate_bps=max(1 << 20, entry["bytes"] // 6))
        name = f"{w}-b"
        cfg = cs.cri.pod_config(name, pod_annotations(w), uid=f"{w}-b-uid")
        pod = cs.cri.runp(cfg, "runsc-thaw")
        assert decisions(cs, pod)[pod] == [("create", "restore"), ("start", "restored")], reason(cs, pod)
        log = gofer_log(cs, key)
        assert [line.split(" open ")[1].split()[0] for line in log.splitlines() if " open " in line] == [
            "checkpoint.img", "pages_meta.img", "pages.img"], log
        assert " done: " not in log, log
        ids = {}
        for cname, env in POD_CONTAINERS.items():
            ids[cname] = cs.cri.create(pod, cs.cri.container_config(f"{name}-0", cname, POD_IMAGE, env=env), cfg)
            cs.cri.start(ids[cname])
        for n, cid in ids.items():
            assert cs.state(cid)[0] == saved[n][0], f"{n} must come back with its own saved memory"
        assert decisions(cs, *ids.values()) == {i: [("create", "restore"), ("start", "restored")]
                                                for i in ids.values()}
        thawd_log = (cs.base / "thawd.log").read_text()
        assert f"pull {key}: pulled whole" not in thawd_log, thawd_log[-3000:]
        streamed.wait_for(lambda: cs.stats()["counters"].get('thaw_streams_total{result="installed"}') == 1,
                          120, f"the stream installing its entry (thawd log: {thawd_log[-3000:]})", step=0.5)
        c = cs.stats()["counters"]
        assert c.get("thaw_restores_total") == 1 and c.get("thaw_cache_misses_total") == 1, c
        assert 'thaw_streams_total{result="failed"}' not in c, c
        # The sentry read the whole image through thaw-gofer, some reads waited for bytes
        # still in flight, and it let go of the image once loaded.
        streamed.wait_for(lambda: " done: " in gofer_log(cs, key), 60, "the sentry closing the image")
        log = gofer_log(cs, key)
        assert " 0 failed" in log and " 0 waited " not in log, log
        state = streamed.cache_state(cs.base / "cache", key)
        assert len(state["ready"]) == 1 and state["partials"] == [] and len(state["streams"]) == 1, state
        [ready] = [e for e in cs.stats()["entries"] if e["key"] == key and e["state"] == "ready"]
        assert ready["leases"] == 1, ready   # the running pod's
        cs.cri.remove_pod(pod)
        assert next(e for e in cs.stats()["entries"] if e["key"] == key)["leases"] == 0, "removing the pod released it"
        state = streamed.cache_state(cs.base / "cache", key)
        assert len(state["ready"]) == 1 and state["streams"] == [], state
    finally:
        cs.stop_thawd()     # back to the store itself for the module's other tests
        cs.extra_env.pop("THAW_STORE_ENDPOINT", None)
        cs.start_thawd()
        proxy.stop()


def test_single_container_pod_is_the_same_path(cs):
    """One container, declared the short way (thaw.dev/ready for the pod's one
    container, as deploy/kubernetes/examples/pod.yaml does)."""
    w = "pods-single"
    ann = {"thaw.dev/workload": w, "thaw.dev/ready": "file:/tmp/ready"}
    one = {"server": POD_CONTAINERS["app"]}
    pod, _, ids = cs.run_pod(f"{w}-a", ann, one)
    boot, _ = cs.state(ids["server"])
    cs.wait_key(f"k8s-default.{w}.")
    cs.cri.remove_pod(pod)
    pod, _, ids = cs.run_pod(f"{w}-b", ann, one, uid="single-b")
    assert cs.state(ids["server"])[0] == boot
    assert decisions(cs, pod, ids["server"]) == {
        i: [("create", "restore"), ("start", "restored")] for i in (pod, ids["server"])}
    cs.cri.remove_pod(pod)


def test_pod_stopped_while_restoring_goes_away(cs):
    """The kubelet stops and removes a pod whose last container never started:
    runsc has no process to signal yet, so thaw removes the restoring sandbox and
    StopPodSandbox and RemovePodSandbox succeed; nothing of the pod is left."""
    w = "pods-stopped"
    seed(cs, w)
    cfg = cs.cri.pod_config(f"{w}-b", pod_annotations(w), uid=f"{w}-b-uid")
    pod = cs.cri.runp(cfg, "runsc-thaw")
    app = cs.cri.create(pod, cs.cri.container_config(f"{w}-b-0", "app", POD_IMAGE, env=POD_CONTAINERS["app"]), cfg)
    cs.cri.start(app)
    assert decisions(cs, app)[app] == [("create", "restore"), ("start", "restored")]
    cs.cri.remove_pod(pod)
    assert cs.cri.crictl("pods", "-q", "--name", f"{w}-b").stdout.strip() == ""
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                if pod.encode() in _read(p) and _read(p).startswith(b"runsc-sandbox")], "sandbox left behind"


def test_a_pod_restores_while_its_first_container_is_polled(cs):
    """Issue 32: containerd's CRI polls every running container's stats once a second
    (the shim's task Stats -> `runsc events --stats`), the kubelet too, and a task's
    processes are listed with `runsc ps`.
    A pod's first container is running in the shim's view while its last one
    restores, and at the pin a poll that landed while that restore swapped the
    sandbox's kernel panicked the sentry: the last `runsc restore` exited 128 and
    the pod started cold (5 restores in 70 under load; 7 of 8 polled this densely).
    thaw's runsc answers such a poll with an error instead (ci/patch-runsc-restoring.py).
    Each round polls the first container with both commands from create of the
    second container until its start returns: the pod restores every time, and
    `runsc ps` says the sandbox was restoring at least once, so the polls did
    overlap the restore (an unpatched runsc never says so)."""
    w = "pods-polled"
    saved = seed(cs, w)
    runsc, root = BUILD / "runsc", cs.base / "cri" / "runsc-root" / "k8s.io"
    for r in range(3):
        name = f"{w}-r{r}"
        cfg = cs.cri.pod_config(name, pod_annotations(w), uid=f"{name}-uid")
        pod = cs.cri.runp(cfg, "runsc-thaw")
        app = cs.cri.create(pod, cs.cri.container_config(f"{name}-0", "app", POD_IMAGE, env=POD_CONTAINERS["app"]),
                            cfg)
        cs.cri.start(app)
        stop, said = threading.Event(), []
        pollers = [threading.Thread(target=_poll, args=([str(runsc), f"--root={root}", *c, app], stop, said))
                   for c in (["events", "--stats"], ["ps"])]
        for t in pollers:
            t.start()
        try:
            side = cs.cri.create(pod, cs.cri.container_config(f"{name}-0", "sidecar", POD_IMAGE,
                                                              env=POD_CONTAINERS["sidecar"]), cfg)
            cs.cri.start(side)
        finally:
            stop.set()
            for t in pollers:
                t.join()
        ids = {"app": app, "sidecar": side}
        assert decisions(cs, pod, *ids.values()) == {
            i: [("create", "restore"), ("start", "restored")] for i in (pod, *ids.values())}, reason(cs, pod)
        assert {n: cs.state(c)[0] for n, c in ids.items()} == {n: s[0] for n, s in saved.items()}
        assert any("the sandbox is restoring" in s for s in said), f"round {r}: {len(said)} polls, {said[-3:]}"
        cs.cri.remove_pod(pod)


def _poll(argv: list[str], stop: threading.Event, said: list[str]) -> None:
    """Runs argv until `stop`, keeping each run's stderr in `said`."""
    while not stop.is_set():
        said.append(subprocess.run(argv, capture_output=True, text=True, timeout=30).stderr)


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError:
        return b""


def test_pod_declaring_another_container_set_starts_cold(cs):
    w = "pods-set"
    saved = seed(cs, w)
    pod, _, ids = cs.run_pod(f"{w}-b", pod_annotations(w, ("app", "other")),
                             {"app": POD_CONTAINERS["app"], "other": {}})
    assert reason(cs, pod).startswith("no-image")
    assert cs.state(ids["app"])[0] != saved["app"][0]
    assert decisions(cs, *ids.values()) == {i: [("create", "cold"), ("start", "started-cold")] for i in ids.values()}
    cs.cri.remove_pod(pod)


@pytest.mark.parametrize("case, sidecar, why", [
    ("image", {"image": POD_IMAGE_2}, "workload key (image"),
    ("caps", {"linux": {"security_context": {"capabilities": {"add_capabilities": ["NET_ADMIN"]}}}},
     "capabilities"),
])
def test_pod_whose_containers_differ_from_the_image_starts_cold(cs, case, sidecar, why):
    """The same names, but the sidecar is another image, or asks a capability runsc
    compares at restore. The pod's sandbox was restoring when the sidecar's runsc
    create came (the kubelet starts containers one by one): thawd removes it and the
    start fails with the reason; the kubelet then re-creates the pod (same uid,
    attempt 1), and that sandbox starts cold."""
    w = f"pods-differ-{case}"
    saved = seed(cs, w)
    name, uid = f"{w}-b", f"{w}-uid"
    cfg = cs.cri.pod_config(name, pod_annotations(w), uid=uid)
    pod = cs.cri.runp(cfg, "runsc-thaw")
    app = cs.cri.create(pod, cs.cri.container_config(f"{name}-0", "app", POD_IMAGE, env=POD_CONTAINERS["app"]), cfg)
    cs.cri.start(app)
    side = {"image": POD_IMAGE, **sidecar}
    # CRI's CreateContainer only records the container; StartContainer creates the
    # task (runsc create, where thaw decides) and starts it: that call fails.
    sc = cs.cri.create(pod, cs.cri.container_config(f"{name}-0", "sidecar", env=POD_CONTAINERS["sidecar"], **side),
                       cfg)
    with pytest.raises(CrictlError) as e:
        cs.cri.start(sc)
    assert "pod-failed: container-mismatch: container 'sidecar' differs" in e.value.stderr, e.value.stderr
    assert why in e.value.stderr
    for cid in (pod, app):  # both had registered for the restore (the app's task is gone with the sandbox)
        assert decisions(cs, cid)[cid][:2] == [("create", "restore"), ("start", "restored")]
    # No start; containerd's delete of the failed task may already have released it.
    assert [d for d in decisions(cs, sc)[sc] if d != ("delete", "released")] == [("create", "cold")]
    assert reason(cs, sc).startswith("pod-failed: container-mismatch")
    cs.cri.wait_pod_state(pod, "SANDBOX_NOTREADY")
    cs.cri.remove_pod(pod)   # the kubelet: the sandbox died; stop and remove it, make a new one

    pod2, _, ids2 = cs.run_pod(name, pod_annotations(w), uid=uid, attempt=1, extra={"sidecar": side})
    assert reason(cs, pod2).startswith("pod-failed-before"), reason(cs, pod2)
    for n, cid in ids2.items():
        assert cs.state(cid)[0] != saved[n][0], f"{n} started cold"
        assert decisions(cs, cid)[cid] == [("create", "cold"), ("start", "started-cold")]
    cs.cri.remove_pod(pod2)


def run_with_init(cs: CriStack, name: str, workload: str, uid: str) -> tuple[str, str, dict[str, str]]:
    """A pod as the kubelet starts one with an init container: RunPodSandbox, the init
    container (it writes a file into the pod's /tmp and exits 0) created, started and
    waited for until CRI reports it exited, then the app containers."""
    cfg = cs.cri.pod_config(name, pod_annotations(workload), uid=uid)
    pod = cs.cri.runp(cfg, "runsc-thaw")
    init = cs.cri.create(pod, cs.cri.container_config(
        f"{name}-0", "fetch", POD_IMAGE, command=["sh", "-c", "echo fetched > /tmp/fetched; exit 0"]), cfg)
    cs.cri.start(init)
    end = time.monotonic() + 60
    while (st := cs.cri.json("inspect", init)["status"])["state"] != "CONTAINER_EXITED":
        assert time.monotonic() < end, st
        time.sleep(0.2)
    assert st["exitCode"] == 0, st
    ids = {"fetch": init}
    for cname, env in POD_CONTAINERS.items():
        ids[cname] = cs.cri.create(pod, cs.cri.container_config(f"{name}-0", cname, POD_IMAGE, env=env), cfg)
        cs.cri.start(ids[cname])
    return pod, cfg, ids


def test_a_pod_with_an_init_container_restores_and_its_init_container_is_answered_as_done(cs):
    """Issue 28: the kubelet runs a new pod's init containers before its app containers,
    and CRI deletes an exited container's task, so the image holds the app containers
    only; a restored pod's init container is answered as done (exit 0, nothing run), and
    the app containers come back with their memory."""
    w = "pods-init"
    pod, _, ids = run_with_init(cs, f"{w}-seed", w, f"{w}-seed-uid")
    saved = {n: cs.state(ids[n]) for n in POD_CONTAINERS}
    entry = cs.wait_key(f"k8s-default.{w}.")
    assert decisions(cs, ids["fetch"])[ids["fetch"]][:2] == [("create", "cold"), ("start", "started-cold")]
    cs.cri.remove_pod(pod)
    pod, _, ids = run_with_init(cs, f"{w}-b", w, f"{w}-b-uid")
    d = decisions(cs, pod, *ids.values())
    assert d[pod] == [("create", "restore"), ("start", "restored")], reason(cs, pod)
    assert d[ids["fetch"]][0] == ("create", "satisfied"), d[ids["fetch"]]
    assert reason(cs, ids["fetch"]).startswith("init-satisfied")
    for n in POD_CONTAINERS:
        assert d[ids[n]] == [("create", "restore"), ("start", "restored")], (n, d[ids[n]])
        assert cs.state(ids[n])[0] == saved[n][0], f"{n} must come back with its own saved memory"
    st = cs.cri.json("inspect", ids["fetch"])["status"]
    assert (st["state"], st["exitCode"]) == ("CONTAINER_EXITED", 0), st
    assert entry["key"].startswith(f"k8s-default.{w}.")
    cs.cri.remove_pod(pod)


def test_the_first_pod_on_a_node_that_never_assembled_one_restores_with_the_stores_table(cs):
    """Issue 28: a node that never assembled a pod of the workload (scale-out: no pod table
    of its own, no cache entry) finds the table in the store, where the node that assembled
    the first pod published it, and restores the pod from the store's image. Here the new
    node is this one with thawd's table and cache entry of the workload removed: what a new
    node holds of it (nothing), against the same store."""
    w = "pods-newnode"
    saved = seed(cs, w)
    key = cs.wait_key(f"k8s-default.{w}.")["key"]
    tables = list((cs.base / "state" / "thawd" / "pods").glob(f"*/{key}.json"))
    assert len(tables) == 1, tables
    assert cs.thaw("evict", key).returncode == 0
    cs.stop_thawd()
    tables[0].unlink()
    cs.start_thawd()
    marks = len((cs.base / "thawd.log").read_text())
    pod, _, ids = cs.run_pod(f"{w}-b", pod_annotations(w), uid=f"{w}-b-uid")
    for n, cid in ids.items():
        assert cs.state(cid)[0] == saved[n][0], f"{n} must come back with its own saved memory"
    assert decisions(cs, pod, *ids.values()) == {
        i: [("create", "restore"), ("start", "restored")] for i in (pod, *ids.values())}, reason(cs, pod)
    log = (cs.base / "thawd.log").read_text()[marks:]
    assert f"restores {key} (pod table from the store" in log, log[-3000:]
    assert tables[0].is_file(), "the store's table is kept on the node from then on"
    cs.cri.remove_pod(pod)


# -- GPU pods on CPU (issue 28) ---------------------------------------------------------

def gpus(*indexes: int) -> dict:
    """A container config's GPUs as the kubelet passes a device plugin's: CDI devices."""
    return {"CDI_devices": [{"name": f"nvidia.com/gpu={i}"} for i in indexes]}


def devices(cs: CriStack, cid: str) -> list[str]:
    """The device nodes of a container's OCI spec, as CRI made it."""
    spec = cs.cri.json("inspect", cid)["info"]["runtimeSpec"]
    return [d["path"] for d in (spec.get("linux") or {}).get("devices") or []]


@pytest.fixture(scope="module")
def gpu_image(cs):
    """A GPU-declared pod ("app" on fake GPU 0 beside a CPU "sidecar") started cold and
    checkpointed: the saved state of each container."""
    return seed(cs, "pods-gpu", {"app": gpus(0)})


def test_a_gpu_declared_pod_saved_on_gpu_0_restores_onto_gpu_1(cs, gpu_image):
    """Issue 28: the GPUs a pod's container is given now are the node's choice, not the
    image's. The image was saved with the app holding GPU 0; the next pod's app is given
    GPU 1 (CDI, as the kubelet asks for a device plugin's GPU) and both containers come
    back with their memory, the app seeing the GPU it holds now. On CPU a fake GPU is its
    device node and its files (testbed.write_fake_gpus): runsc cannot run a container
    with /dev/nvidiactl without a driver, so the CUDA helper and GPU memory are the H200
    run's (bench/gpu/pods.py); what thaw decides about the GPUs a container holds, and
    runsc's restore with another one, run here."""
    pod, _, ids = cs.run_pod("pods-gpu-b", pod_annotations("pods-gpu"), uid="pods-gpu-b-uid",
                             extra={"app": gpus(1)})
    assert decisions(cs, pod, *ids.values()) == {
        i: [("create", "restore"), ("start", "restored")] for i in (pod, *ids.values())}, reason(cs, ids["app"])
    for n, cid in ids.items():
        assert cs.state(cid)[0] == gpu_image[n][0], f"{n} must come back with its own saved memory"
    assert [d for d in devices(cs, ids["app"]) if d.startswith("/dev/nvidia")] == ["/dev/nvidia1"]
    assert not [d for d in devices(cs, ids["sidecar"]) if d.startswith("/dev/nvidia")], "the sidecar holds no GPU"
    smi = cs.cri.exec(ids["app"], f"{FAKE_GPU_DIR}/nvidia-smi").stdout
    assert "GPU-fake-0001" in smi, f"the restored app sees the GPU it was given now: {smi}"
    cs.cri.remove_pod(pod)


def test_a_gpu_pod_given_another_gpu_count_starts_cold_with_its_reason(cs, gpu_image):
    """Issue 28: an image saved with one GPU in the app cannot restore into an app given
    two (runsc restores onto as many GPUs as were saved). The app's create, the first
    time thawd sees its GPUs, refuses with one line; the restoring sandbox goes (it
    cannot start cold), and the pod the kubelet makes again starts cold, saying why:
    in the stand-in's log and in thawd's decisions (`thaw stats --decisions`)."""
    name, uid = "pods-gpu-count", "pods-gpu-count-uid"
    cfg = cs.cri.pod_config(name, pod_annotations("pods-gpu"), uid=uid)
    pod = cs.cri.runp(cfg, "runsc-thaw")
    assert decisions(cs, pod)[pod] == [("create", "restore"), ("start", "restored")], reason(cs, pod)
    app = cs.cri.create(pod, cs.cri.container_config(f"{name}-0", "app", POD_IMAGE, env=POD_CONTAINERS["app"],
                                                     **gpus(0, 1)), cfg)
    with pytest.raises(CrictlError) as e:
        cs.cri.start(app)
    why = ("container 'app': spec field linux.devices: the checkpoint has 1 GPU(s) (/dev/nvidia0), "
           "this restore assigns 2 (/dev/nvidia0, /dev/nvidia1)")
    assert f"pod-failed: container-mismatch: {why}" in e.value.stderr, e.value.stderr
    assert reason(cs, app) == f"pod-failed: container-mismatch: {why}"
    cs.cri.wait_pod_state(pod, "SANDBOX_NOTREADY")
    cs.cri.remove_pod(pod)   # the kubelet: the sandbox died; stop and remove it, make a new one

    pod2, _, ids = cs.run_pod(name, pod_annotations("pods-gpu"), uid=uid, attempt=1, extra={"app": gpus(0, 1)})
    assert reason(cs, pod2) == f"pod-failed-before: an earlier sandbox of this pod was not restored " \
                               f"(container-mismatch: {why})"
    for n, cid in ids.items():
        assert decisions(cs, cid)[cid] == [("create", "cold"), ("start", "started-cold")]
        assert cs.state(cid)[0] != gpu_image[n][0], f"{n} started cold"
    assert [d for d in devices(cs, ids["app"]) if d.startswith("/dev/nvidia")] == ["/dev/nvidia0", "/dev/nvidia1"]
    ring = cs.stats_decisions(pod2)
    assert [(r["decision"], r["reason"]) for r in ring][:1] == [("cold", reason(cs, pod2))], ring
    cs.cri.remove_pod(pod2)


# -- two versions of one workload at once (issue 28) -----------------------------------

def wait_new_key(cs: CriStack, prefix: str, known: set[str], timeout_s: float = 180) -> str:
    """The key of a published image of `prefix` not among `known`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        keys = {e["key"] for e in cs.stats()["entries"] if e["state"] == "ready" and e["key"].startswith(prefix)}
        if keys - known:
            return sorted(keys - known)[0]
        time.sleep(0.5)
    raise AssertionError(f"no new image of {prefix} (thawd log: {(cs.base / 'thawd.log').read_text()[-3000:]})")


def test_two_versions_of_a_workload_keep_their_own_tables_and_images(cs):
    """Issue 28, a rolling update: the Deployment's pods of the old and the new version
    (another image digest) run at once on the node. Each version's pods are named
    <deployment>-<pod-template-hash>-<5 characters>, so the pod's name less its
    generated suffix tells the version (podtables.hint_of). The first pod of the new
    version finds only the old version's table and fails over to a cold sandbox once
    (the cost of a wrong pick: one sandbox restart, never a wrong restore); from then on
    both tables and both images are kept, and each version's next pod restores its own."""
    w = "pods-roll"
    v1, v2 = f"{w}-6b7f9c8d5f", f"{w}-7c9d6f5b4d"      # <deployment>-<pod-template-hash>
    ann, prefix = pod_annotations(w), f"k8s-default.{w}."
    old = {"image": POD_IMAGE}
    new = {"app": {"image": POD_IMAGE_2}, "sidecar": {"image": POD_IMAGE_2}}

    pod, _, ids = cs.run_pod(f"{v1}-x2x4z", ann, uid="roll-v1-a")
    k1 = wait_new_key(cs, prefix, set())
    saved1 = {n: cs.state(c)[0] for n, c in ids.items()}
    cs.cri.remove_pod(pod)

    cfg = cs.cri.pod_config(f"{v2}-k9q7m", ann, uid="roll-v2-a")
    pod = cs.cri.runp(cfg, "runsc-thaw")
    assert decisions(cs, pod)[pod][0] == ("create", "restore"), "the old version's table, the only one yet"
    app = cs.cri.create(pod, cs.cri.container_config(f"{v2}-k9q7m-0", "app", POD_IMAGE_2,
                                                     env=POD_CONTAINERS["app"]), cfg)
    with pytest.raises(CrictlError) as e:
        cs.cri.start(app)
    assert "pod-failed: container-mismatch: container 'app'" in e.value.stderr, e.value.stderr
    cs.cri.wait_pod_state(pod, "SANDBOX_NOTREADY")
    cs.cri.remove_pod(pod)
    pod, _, ids = cs.run_pod(f"{v2}-k9q7m", ann, uid="roll-v2-a", attempt=1, extra=new)
    assert reason(cs, pod).startswith("pod-failed-before")
    k2 = wait_new_key(cs, prefix, {k1})
    saved2 = {n: cs.state(c)[0] for n, c in ids.items()}
    cs.cri.remove_pod(pod)

    tables = sorted(p.stem for p in (cs.base / "state" / "thawd" / "pods").glob(f"*/{prefix}*.json"))
    assert tables == sorted([k1, k2]), tables
    for version, name, extra, saved, key in ((v1, f"{v1}-p5bq8", {"app": old}, saved1, k1),
                                             (v2, f"{v2}-z7w2n", new, saved2, k2)):
        marks = len((cs.base / "thawd.log").read_text())
        pod, _, ids = cs.run_pod(name, ann, uid=f"{name}-uid", extra=extra)
        assert decisions(cs, pod, *ids.values()) == {
            i: [("create", "restore"), ("start", "restored")] for i in (pod, *ids.values())}, reason(cs, pod)
        assert {n: cs.state(c)[0] for n, c in ids.items()} == saved, f"{version}'s pod restores {version}'s state"
        assert f"restores {key} (pod table from the node, hint '{version}')" in \
            (cs.base / "thawd.log").read_text()[marks:]
        cs.cri.remove_pod(pod)
    ready = {e["key"] for e in cs.stats()["entries"] if e["state"] == "ready"}
    assert {k1, k2} <= ready, "neither version's image evicted the other's"
