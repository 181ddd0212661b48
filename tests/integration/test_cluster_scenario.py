"""Issue 29's scenario on the real dev cluster (control/dev/cluster.py): thaw's
Helm chart installed (its DaemonSet image loaded into each node's containerd),
a Deployment of a CPU server with 256 MB of state, a readinessProbe and
RuntimeClass runsc-thaw. At one replica it starts cold on node a and is
checkpointed (thawd reads its readiness from the pod's own readinessProbe);
scaled to six, its pods land on both nodes and restore, node b's from the store
(streamed); all Ready as the kubelet sees them; thawd's Events on every pod; a
deleted pod's replacement restores; node a drained, its pods restore on node b;
a rolling update to a new image starts cold and is checkpointed, the old
replicas untouched; `helm uninstall`. The store is SeaweedFS on the cluster's
bridge address. Nothing is faked."""
from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from control.dev import chart, ocibuild
from control.dev import cluster as clustermod
from control.dev.clusternode import RESTART_COMMAND
from control.dev.seaweed import Seaweed
from control.dev.testbed import POD_SCRIPT
from tests.conftest import BUILD, require

pytestmark = pytest.mark.timeout(600)

SERVER_IMAGE = "thaw.dev/scenario/server:1"
SERVER_IMAGE_2 = "thaw.dev/scenario/server:2"   # other content: another digest, so another key
APP = "server"
WEIGHTS_MB = 256
METRICS_PORT = 9464   # deploy/helm/thaw/values.yaml metrics.port
# thawd's Event reasons (control/thawd/events.py).
COLD, CHECKPOINTED, RESTORED = "ThawColdStart", "ThawCheckpointed", "ThawRestored"


@pytest.fixture
def env(name, request):
    for b in (*clustermod.NEEDED, "k8s/helm", "thaw-daemonset.oci.tar"):
        require(os.access(BUILD / b, os.R_OK), f"{b} built at {BUILD / b} (make setup)")
    require(os.geteuid() == 0, "root")
    base = Path(f"/var/tmp/thaw-it/{name}")
    shutil.rmtree(base, ignore_errors=True)
    failed = request.session.testsfailed
    c = clustermod.Cluster(base / "cluster", name[:32].rstrip("-"), build=BUILD)
    weed = None
    try:
        c.start()
        weed = Seaweed(base / "weed", host=c.host_address).start()
        files = ocibuild.busybox_files(BUILD / "busybox", {"/app/run.sh": ocibuild.File(POD_SCRIPT, 0o755),
                                                           "/bin/httpd": ocibuild.File(link="busybox"),
                                                           "/bin/mv": ocibuild.File(link="busybox")})
        for i, ref in enumerate((SERVER_IMAGE, SERVER_IMAGE_2)):
            ocibuild.build(base / f"server-{i}.tar", ref, {**files, "/etc/version": ocibuild.File(ref.encode())},
                           ["/app/run.sh"])
            c.import_image(base / f"server-{i}.tar")
        yield c, weed
    finally:
        keep_logs(c, base / "logs")
        c.stop()
        if weed is not None:
            weed.stop()
        assert c.leftovers() == []
        if request.session.testsfailed == failed:
            shutil.rmtree(base)
        else:   # a failure's logs stay, nothing else
            for p in base.iterdir():
                if p.name != "logs":
                    shutil.rmtree(p) if p.is_dir() else p.unlink()


def keep_logs(c, out: Path) -> None:
    """thawd's and the stand-in's logs of each node, kept past the cluster's stop (a failure's why)."""
    out.mkdir(parents=True, exist_ok=True)
    for n in c.nodes:
        for f in (n.host_path("/var/log/thaw")).glob("*.log"):
            (out / f"{n.letter}-{f.name}").write_bytes(f.read_bytes())
    p = c.kubectl("logs", "-n", "thaw-system", "-l", "app.kubernetes.io/name=thawd", "--prefix", "--tail=-1",
                  "--all-containers", check=False)
    (out / "thawd-pods.log").write_text(p.stdout + p.stderr)


def values(c, weed, bucket: str) -> dict:
    return {
        "store": {"endpoint": weed.endpoint, "bucket": bucket, "region": "us-east-1",
                  "credentials": {"accessKeyId": weed.credentials.access_key,
                                  "secretAccessKey": weed.credentials.secret_key}},
        "cache": {"budget": "8g", "minFree": "1g"},
        "node": {"gpu": "no"},
        # The node's containerd restarts as a systemd unit's would (docs/cluster.md).
        "containerd": {"restartCommand": list(RESTART_COMMAND)},
        # No kube-proxy here: the `kubernetes` Service does not route, the API server's
        # address does (docs/cluster.md "Not there").
        "extraConfig": {"kubernetes": {"server": c.api_url},
                        # Node b's pods arrive together: the first streams the image, the
                        # others wait for its cache entry rather than start cold (the 4 s
                        # default is shorter than this machine's stream of 256 MB).
                        "thawd": {"prepare_timeout_s": 30}},
    }


def deployment(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"thaw.dev/workload": name}},
                "spec": {
                    "runtimeClassName": "runsc-thaw", "terminationGracePeriodSeconds": 1,
                    # Both nodes, evenly (node b is cordoned while the first pod starts).
                    # A cordoned (drained) node is no domain of the spread (nodeTaintsPolicy).
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                   "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
                                                   "labelSelector": {"matchLabels": labels}}],
                    "containers": [{
                        "name": APP, "image": SERVER_IMAGE, "imagePullPolicy": "Never",
                        "env": [{"name": "PORT", "value": "8080"}, {"name": "WEIGHTS_MB", "value": str(WEIGHTS_MB)}],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        # thaw's readiness: this probe (kubernetes.read_pods), no thaw.dev/ready.
                        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                    }],
                }}}}


def scrape(target: str, timeout_s: float = 30) -> str:
    """GET http://<target>/metrics (a thawd pod's address: the host routes the pod ranges)."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def pods(c, name: str) -> dict[str, dict]:
    out = c.kubectl("get", "pods", "-n", "default", "-l", f"app={name}", "-o", "json").stdout
    return {p["metadata"]["name"]: p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")}


def events(c, pod: str) -> list[dict]:
    out = c.kubectl("get", "events", "-n", "default", "--field-selector", f"involvedObject.name={pod}",
                    "-o", "json").stdout
    return [e for e in json.loads(out)["items"] if e.get("reportingComponent") == "thaw.dev/thawd"]


def wait_event(c, pod: str, reason: str, timeout_s: float) -> dict:
    end = time.monotonic() + timeout_s
    while True:
        evs = events(c, pod)
        for e in evs:
            if e["reason"] == reason:
                return e
        assert time.monotonic() < end, f"no {reason} Event on {pod} within {timeout_s:.0f}s: " \
            f"{[(e['reason'], e['message']) for e in evs]}"
        time.sleep(1)


def wait_ready(c, name: str, n: int, timeout_s: float) -> dict[str, dict]:
    """`n` pods of `name`, each Ready as the kubelet reports it."""
    end = time.monotonic() + timeout_s
    while True:
        ps = pods(c, name)
        ready = {k: p for k, p in ps.items()
                 if any(x["type"] == "Ready" and x["status"] == "True" for x in p["status"].get("conditions", []))}
        if len(ps) == n and len(ready) == n:
            return ps
        assert time.monotonic() < end, f"{len(ready)} of {n} pods of {name} Ready within {timeout_s:.0f}s: " \
            f"{ {k: (p['spec'].get('nodeName'), p['status'].get('phase')) for k, p in ps.items()} }"
        time.sleep(1)


def test_a_deployment_scales_out_across_two_nodes_by_restoring(env, name):
    c, weed = env
    a, b = c.nodes
    t0 = time.monotonic()
    release = chart.install(c.kubeconfig, values=values(c, weed, name), nodes=c.node_names,
                            load_image=c.import_image, pull_never=True, helm=BUILD / "k8s" / "helm",
                            kubectl=BUILD / "k8s" / "kubectl", timeout_s=240)
    installed = time.monotonic() - t0
    thawds = json.loads(c.kubectl("get", "pods", "-n", "thaw-system", "-o", "json").stdout)["items"]
    assert sorted(p["spec"]["nodeName"] for p in thawds) == sorted(c.node_names)
    # Metrics as a Prometheus in the cluster finds them: the headless Service's endpoints are
    # each thawd's pod address and metrics port, and each answers /metrics there.
    eps = json.loads(c.kubectl("get", "endpoints", "thawd-metrics", "-n", "thaw-system", "-o", "json").stdout)
    targets = sorted(f"{a['ip']}:{pt['port']}" for sub in eps.get("subsets", [])
                     for a in sub.get("addresses", []) for pt in sub.get("ports", []))
    assert targets == sorted(f"{p['status']['podIP']}:{METRICS_PORT}" for p in thawds), (targets, eps)
    for t in targets:
        assert "thaw_cold_starts_total" in scrape(t), t

    # One replica, cold, on node a (b cordoned), checkpointed once its readinessProbe passes.
    c.kubectl("cordon", b.name)
    c.apply(deployment(APP, 1))
    [(first, p0)] = wait_ready(c, APP, 1, 120).items()
    assert p0["spec"]["nodeName"] == a.name
    cold = wait_event(c, first, COLD, 30)
    assert "no-image" in cold["message"], cold["message"]
    saved = wait_event(c, first, CHECKPOINTED, 180)
    assert "published" in saved["message"], saved["message"]
    readiness = wait_event(c, first, "ThawReadiness", 5)
    assert "http:8080/=200-399" in readiness["message"], readiness["message"]

    # Six replicas: both nodes; the five new pods restore, node b's from the store.
    c.kubectl("uncordon", b.name)
    t1 = time.monotonic()
    c.kubectl("scale", "deployment", APP, "--replicas=6")
    ps = wait_ready(c, APP, 6, 180)
    scaled = time.monotonic() - t1
    on = {n.name: sorted(k for k, p in ps.items() if p["spec"]["nodeName"] == n.name) for n in (a, b)}
    assert len(on[a.name]) == 3 and len(on[b.name]) == 3, on
    how = {}
    for pod in ps:
        if pod == first:
            continue
        e = wait_event(c, pod, RESTORED, 60)
        how[pod] = e["message"]
    assert all(f"restored from image k8s-default.{APP}" in m for m in how.values()), how
    assert any("streamed from the store" in how[p] for p in on[b.name]), how

    # A deleted pod's replacement restores.
    gone = on[b.name][0]
    c.kubectl("delete", "pod", gone, "--wait=false")
    end = time.monotonic() + 120
    while not (new := set(pods(c, APP)) - set(ps)):
        assert time.monotonic() < end, "no replacement pod"
        time.sleep(0.5)
    [replacement] = new
    wait_ready(c, APP, 6, 120)
    assert "restored from image" in wait_event(c, replacement, RESTORED, 60)["message"]

    # Node a drained: its pods, rescheduled onto node b, restore there (from its cache now).
    before = pods(c, APP)
    c.kubectl("drain", a.name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s", timeout=150)
    ps = wait_ready(c, APP, 6, 120)
    assert {p["spec"]["nodeName"] for p in ps.values()} == {b.name}
    moved = sorted(set(ps) - set(before))
    assert len(moved) == 3, (moved, sorted(before))
    for pod in moved:
        assert "restored from image" in wait_event(c, pod, RESTORED, 60)["message"]
    c.kubectl("uncordon", a.name)

    # A rolling update to a new image: its first pod starts cold (a new digest, so a new key)
    # and is checkpointed; the old replicas run on untouched meanwhile (minReadySeconds holds
    # the rollout after the first new pod).
    old = {k: p["status"]["containerStatuses"][0]["restartCount"] for k, p in ps.items()}
    c.kubectl("patch", "deployment", APP, "--type=strategic", "-p", json.dumps({"spec": {
        "minReadySeconds": 300, "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {"spec": {"containers": [{"name": APP, "image": SERVER_IMAGE_2}]}}}}))
    end = time.monotonic() + 120
    while not (new := set(pods(c, APP)) - set(ps)):
        assert time.monotonic() < end, "no pod of the new version"
        time.sleep(0.5)
    [updated] = new
    cold = wait_event(c, updated, COLD, 60)
    # Both versions share the pod's lookup key; the new one's first pod may be handed the
    # old version's table, fail over once and start cold (docs/containerd.md, rolling updates).
    assert "no-image" in cold["message"] or "container-mismatch" in cold["message"], cold["message"]
    saved2 = wait_event(c, updated, CHECKPOINTED, 180)
    first_key = saved["message"].split("image ")[1].split(":")[0]
    assert first_key not in saved2["message"], (saved["message"], saved2["message"])
    now = pods(c, APP)
    assert {k: now[k]["status"]["containerStatuses"][0]["restartCount"] for k in old if k in now} == old
    assert set(old) <= set(now), "the old replicas are untouched while the new one holds the rollout"

    c.kubectl("delete", "deployment", APP, "--wait=true", timeout=120)
    end = time.monotonic() + 120
    while pods(c, APP):
        assert time.monotonic() < end, "the Deployment's pods did not go"
        time.sleep(0.5)
    chart.uninstall(release, timeout_s=120)
    assert c.kubectl("get", "runtimeclass", "runsc-thaw", check=False).returncode != 0
    end = time.monotonic() + 90   # the DaemonSet's pods go after it (garbage collection, 30 s grace)
    while json.loads(c.kubectl("get", "pods", "-n", "thaw-system", "-o", "json").stdout)["items"]:
        assert time.monotonic() < end, "thawd's pods outlived helm uninstall by 90 s"
        time.sleep(1)
    print(f"install {installed:.1f}s, scale 1 -> 6 to all Ready {scaled:.1f}s")
