"""The dev cluster (control/dev/cluster.py, docs/cluster.md): the pinned upstream
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and two nodes,
each its own containerd and kubelet in its own mount and network namespaces.
Both nodes Ready as the API server sees them; a pod on each node under the
default runtime (runc) and one under RuntimeClass runsc (plain gVisor); logs
and exec through the API server; pod to pod across the nodes; a privileged
hostPID pod sees the node's host paths, not the machine's, and restarts the
node's containerd the way `thaw provision --restart-containerd` would; stop
leaves nothing behind. Nothing is faked."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from control.dev import cluster as clustermod
from control.dev.clusternode import RESTART_SCRIPT
from tests.conftest import BUILD, require

pytestmark = pytest.mark.timeout(420)


@pytest.fixture
def cluster(name):
    for b in clustermod.NEEDED:
        require(os.access(BUILD / b, os.X_OK), f"{b} built at {BUILD / b} (ci/build-cluster.sh)")
    require(os.geteuid() == 0, "root")
    c = clustermod.Cluster(Path(f"/var/tmp/thaw-it/{name}"), name[:32].rstrip("-"), build=BUILD)
    host_paths = {p: os.path.exists(p) for p in ("/etc/containerd", "/etc/thaw", "/var/lib/kubelet", "/opt/thaw")}
    try:
        yield c.start()
    finally:
        c.stop()
        assert c.leftovers() == []
        assert {p: os.path.exists(p) for p in host_paths} == host_paths, "the machine's own paths changed"


def pod(name: str, node: str, command: str, runtime_class: str | None = None, **spec) -> dict:
    p = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"test": "cluster"}},
         "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                  "containers": [{"name": "c", "image": clustermod.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                  "command": ["sh", "-c", command]}], **spec}}
    if runtime_class:
        p["spec"]["runtimeClassName"] = runtime_class
    return p


SERVE = "echo hello from $(hostname); busybox httpd -p 8080 -h /etc; while :; do sleep 1; done"


def get_url(c, pod_name: str, ip: str, path: str) -> str:
    """An HTTP GET from inside a pod (busybox nc: its static wget crashes resolving)."""
    return c.kubectl("exec", pod_name, "--", "sh", "-c",
                     f'printf "GET {path} HTTP/1.0\\r\\n\\r\\n" | busybox nc -w 5 {ip} 8080').stdout


def test_cluster_runs_pods_on_both_nodes(cluster):
    c = cluster
    a, b = c.nodes
    nodes = {n["metadata"]["name"]: n for n in json.loads(c.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
    assert set(nodes) == {a.name, b.name}
    for n in (a, b):
        st = nodes[n.name]["status"]
        assert {x["type"]: x["status"] for x in st["conditions"]}["Ready"] == "True"
        assert st["nodeInfo"]["kubeletVersion"] == "v1.37.2"
        assert {"type": "InternalIP", "address": n.net.ip} in st["addresses"]
    assert c.kubectl("version", "-o", "json").stdout.count('"gitVersion": "v1.37.2"') == 2   # client and server

    hostish = {"hostPID": True, "volumes": [
        {"name": "run", "hostPath": {"path": "/run", "type": "Directory"}},
        {"name": "etc-thaw", "hostPath": {"path": "/etc/thaw", "type": "DirectoryOrCreate"}},
        {"name": "etc-containerd", "hostPath": {"path": "/etc/containerd", "type": "DirectoryOrCreate"}}]}
    plain_a = pod("plain-a", a.name, SERVE, **hostish)
    plain_a["spec"]["containers"][0].update(securityContext={"privileged": True}, volumeMounts=[
        {"name": "run", "mountPath": "/run", "mountPropagation": "Bidirectional"},
        {"name": "etc-thaw", "mountPath": "/etc/thaw"}, {"name": "etc-containerd", "mountPath": "/etc/containerd"}])
    for p in (plain_a, pod("plain-b", b.name, SERVE), pod("gvisor-b", b.name, SERVE, clustermod.RUNSC_CLASS)):
        c.apply(p)
    c.kubectl("wait", "--for=condition=Ready", "pod", "-l", "test=cluster", "--timeout=180s", timeout=200)
    pods = {p["metadata"]["name"]: p for p in json.loads(c.kubectl("get", "pods", "-o", "json").stdout)["items"]}
    assert {k: v["spec"]["nodeName"] for k, v in pods.items()} == {
        "plain-a": a.name, "plain-b": b.name, "gvisor-b": b.name}

    for name, node in (("plain-a", a), ("plain-b", b), ("gvisor-b", b)):
        ip = pods[name]["status"]["podIP"]
        assert ip.startswith(node.net.pod_cidr.rsplit(".", 2)[0] + "."), (name, ip, node.net.pod_cidr)
        assert f"hello from {name}" in c.kubectl("logs", name).stdout
    # The default runtime is the host kernel's (runc); runsc is gVisor's.
    assert "gvisor" not in c.kubectl("exec", "plain-a", "--", "cat", "/proc/version").stdout.lower()
    assert "gvisor" not in c.kubectl("exec", "plain-b", "--", "cat", "/proc/version").stdout.lower()
    assert "gvisor" in c.kubectl("exec", "gvisor-b", "--", "cat", "/proc/version").stdout.lower()

    # Pod to pod across the nodes, both ways, and gVisor's netstack on the same network.
    assert "root:x:0:" in get_url(c, "plain-a", pods["gvisor-b"]["status"]["podIP"], "/group")
    assert "root:x:0:" in get_url(c, "gvisor-b", pods["plain-a"]["status"]["podIP"], "/group")
    assert "root:x:0:" in get_url(c, "plain-b", pods["plain-a"]["status"]["podIP"], "/group")

    # A host path is the node's: what the pod writes lands in node a's directory, not the machine's.
    c.kubectl("exec", "plain-a", "--", "sh", "-c", "echo from-plain-a > /etc/thaw/probe")
    assert (a.host_path("/etc/thaw") / "probe").read_text() == "from-plain-a\n"
    assert f"node {a.name}" in c.kubectl("exec", "plain-a", "--", "head", "-1", "/etc/containerd/config.toml").stdout

    # provision's containerd restart, run from the privileged hostPID pod as its init
    # container would: the node's containerd is replaced, its pods keep running.
    ready = a.host_path("/run/containerd/containerd.ready")
    old = ready.read_text().strip()
    # The exec's stream passes through the containerd it restarts: the pod runs the
    # restart in the background and the test watches the node.
    c.kubectl("exec", "plain-a", "--", "sh", "-c", f"(sh {RESTART_SCRIPT} > /tmp/restart.log 2>&1 &)")
    end = time.monotonic() + 60
    while not (ready.exists() and ready.read_text().strip() not in ("", old)):
        assert time.monotonic() < end, "node a's containerd did not come back"
        time.sleep(0.2)
    c.wait_nodes_ready(60)
    assert "hello from plain-a" in c.kubectl("logs", "plain-a").stdout
    assert c.kubectl("exec", "plain-a", "--", "cat", "/tmp/restart.log").stdout == ""
