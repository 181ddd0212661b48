"""The dev cluster's plan, without starting anything (control/dev/cluster.py,
clusternode.py): names, where a cluster may live, addresses that do not
collide, the node's containerd config (a node's paths, runc by default, the
drop-in directory provision writes to), the kubelet's cgroup-v1 switch, and the
build's pins (tests/integration/test_cluster.py runs the real thing)."""
from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

import pytest

from control.dev import cluster as clustermod
from control.dev import ocibuild
from control.dev.clusternode import OWN_DIRS, archive_refs
from control.errors import UserError
from tests.conftest import REPO


@pytest.mark.parametrize("name", ["Dev", "dev_1", "-dev", "x" * 33, ""])
def test_a_cluster_name_must_be_a_dns_label(tmp_path, name):
    with pytest.raises(UserError, match="DNS label"):
        clustermod.Cluster(tmp_path / "c", name)


@pytest.mark.parametrize("base", ["/etc/k", "/var/lib/k", "/opt/k", "/var/log/k", "/run/k"])
def test_a_cluster_may_not_live_where_a_node_sees_its_own_files(base):
    with pytest.raises(UserError, match="sees as its own"):
        clustermod.Cluster(Path(base), "dev")


def test_addresses_are_distinct_and_routed_to_the_other_node(tmp_path):
    c = clustermod.Cluster(tmp_path / "c", "dev", index=7)
    a, b = c.nodes
    assert (a.name, b.name) == ("dev-a", "dev-b")
    assert c.host_address == "10.217.7.1" and (a.net.ip, b.net.ip) == ("10.217.7.2", "10.217.7.3")
    assert a.net.routes == ((b.net.pod_cidr, b.net.ip),) and b.net.routes == ((a.net.pod_cidr, a.net.ip),)
    nets = [ipaddress.ip_network(n) for n in (a.net.pod_cidr, b.net.pod_cidr, c.service_cidr, "10.217.7.0/24")]
    assert all(not x.overlaps(y) for i, x in enumerate(nets) for y in nets[i + 1:])
    # thaw's own sandboxes and the CRI tests use 10.213-10.216.
    assert all(not n.overlaps(ipaddress.ip_network("10.212.0.0/14")) for n in nets)
    assert len(c.bridge) <= 15 and all(len(n.net.veth) <= 15 for n in c.nodes)   # IFNAMSIZ
    assert (a.cgroup, b.cgroup) == ("/thaw-cluster-dev/a", "/thaw-cluster-dev/b")
    # Two clusters of different indexes share nothing.
    other = clustermod.Cluster(tmp_path / "o", "other", index=8)
    assert {n.net.pod_cidr for n in other.nodes}.isdisjoint({n.net.pod_cidr for n in c.nodes})
    assert 1 <= clustermod.index_of("dev") <= 120


def test_a_node_path_maps_to_its_own_directory(tmp_path):
    n = clustermod.Cluster(tmp_path / "c", "dev", index=7).nodes[0]
    assert n.host_path("/etc/thaw/config.toml") == n.fs / "etc/thaw/config.toml"
    assert n.socket == n.fs / "run/containerd/containerd.sock"
    with pytest.raises(ValueError):
        n.host_path("/etc/passwd")
    # What thaw's DaemonSet mounts from the host is the node's.
    daemonset = (REPO / "deploy/kubernetes/40-daemonset.yaml").read_text()
    for path in ("/etc/containerd", "/etc/thaw", "/etc/cdi", "/opt/thaw", "/var/lib/thaw", "/var/log/thaw", "/run"):
        assert f"path: {path}," in daemonset and path in OWN_DIRS


def test_the_node_containerd_config_is_a_nodes(tmp_path):
    c = clustermod.Cluster(tmp_path / "c", "dev", index=7, build=Path("/b"))
    cfg = tomllib.loads(clustermod._containerd_config(Path("/b"), c.nodes[0], clustermod.PAUSE_IMAGE))
    assert cfg["version"] == 3
    assert (cfg["root"], cfg["state"], cfg["grpc"]["address"]) == (
        "/var/lib/containerd", "/run/containerd", "/run/containerd/containerd.sock")
    # thaw provision's drop-in (/etc/containerd/conf.d/thaw.toml) is read.
    assert cfg["imports"] == ["/etc/containerd/conf.d/*.toml"]
    cri = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": "/b/runc", "SystemdCgroup": False}   # the kubelet's cgroupfs driver
    assert cri["containerd"]["runtimes"][clustermod.RUNSC_CLASS]["runtime_type"] == "io.containerd.runsc.v1"
    assert cri["cni"]["conf_dir"] == str(c.nodes[0].dir / "cni")
    assert cfg["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == clustermod.PAUSE_IMAGE


def test_archive_refs_reads_the_names_an_archive_holds(tmp_path):
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF")
    ocibuild.build(tmp_path / "x.tar", "thaw.dev/t/x:1", ocibuild.busybox_files(busybox), ["sh"])
    assert archive_refs(tmp_path / "x.tar") == ["thaw.dev/t/x:1"]


def test_the_build_pins_what_the_docs_say():
    """go/dev/*/go.mod hold the cluster's pins; docs/cluster.md names them."""
    mods = {m: (REPO / "go/dev" / m / "go.mod").read_text() for m in ("k8s", "etcd", "helm", "runc")}
    assert "k8s.io/kubernetes v1.37.2" in mods["k8s"]
    # The staging modules at the release cut from the same tree, or the graph asks for v0.0.0.
    assert "k8s.io/kubelet => k8s.io/kubelet v0.37.2" in mods["k8s"]
    assert "go.etcd.io/etcd/server/v3 v3.7.3" in mods["etcd"]
    assert "helm.sh/helm/v4 v4.3.2" in mods["helm"]
    assert "github.com/opencontainers/runc v1.5.3" in mods["runc"]
    doc = (REPO / "docs/cluster.md").read_text()
    for pin in ("v1.37.2", "v3.7.3", "v4.3.2", "v1.5.3"):
        assert pin in doc
