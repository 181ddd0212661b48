"""control.node.doctor: the checks as pure functions of made-up facts."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from control.node import doctor as d
from control.config import RUNSC_VERSION_LABEL

V2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
V1 = ("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
      "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
      "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
GPU = d.GpuFacts(("NVIDIA H200",), (0,), "580.65.06", "13.0", "nvml")
SUPPORTED = ["570.124.06", "580.65.06", "580.105.08"]


def test_arch_kernel_root():
    assert d.check_arch("x86_64").status == d.PASS
    assert d.check_arch("aarch64").status == d.FAIL
    assert d.kernel_version("6.18.44-fc-v657") == (6, 18)
    assert d.check_kernel("5.6.0").status == d.PASS
    assert d.check_kernel("5.4.0-150-generic").status == d.FAIL
    assert d.check_kernel("garbage").status == d.FAIL
    assert d.check_root(0).status == d.PASS
    assert d.check_root(1000).status == d.FAIL


@pytest.mark.parametrize("mounts, status", [
    (V2, d.PASS),
    (V1, d.PASS),
    ("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n", d.FAIL),    # no memory controller
    ("proc /proc proc rw 0 0\n", d.FAIL),
])
def test_cgroups(mounts, status):
    assert d.check_cgroups(mounts).status == status


def test_runsc_version():
    p = Path("/opt/thaw/bin/runsc")
    assert d.check_runsc(p, RUNSC_VERSION_LABEL).status == d.PASS
    assert d.check_runsc(p, "VERSION_MISSING").status == d.WARN
    assert d.check_runsc(p, None, "exit 1").status == d.FAIL


def test_platform():
    assert d.check_platform("kvm", kvm_present=False).status == d.FAIL
    assert d.check_platform("kvm", kvm_present=True).status == d.PASS
    assert d.check_platform("systrap", kvm_present=False).status == d.PASS


@pytest.mark.parametrize("setting, gpu, status", [
    ("auto", d.GpuFacts(), d.WARN),      # CPU node: warn, not fail
    ("auto", GPU, d.PASS),
    ("yes", d.GpuFacts(), d.FAIL),
    ("yes", GPU, d.PASS),
    ("no", GPU, d.PASS),
])
def test_gpu(setting, gpu, status):
    assert d.check_gpu(setting, gpu).status == status


def test_gpu_wanted():
    assert d.gpu_wanted("auto", GPU) and not d.gpu_wanted("auto", d.GpuFacts())
    assert d.gpu_wanted("yes", d.GpuFacts()) and not d.gpu_wanted("no", GPU)


def test_driver():
    assert d.check_driver(GPU, True, SUPPORTED).status == d.PASS
    old = d.GpuFacts(("X",), (0,), "580.1.2")
    c = d.check_driver(old, True, SUPPORTED)
    assert c.status == d.FAIL and "580.65.06" in c.detail and "570" not in c.detail
    assert d.check_driver(d.GpuFacts(), False, SUPPORTED).status == d.PASS
    assert d.check_driver(d.GpuFacts(), True, SUPPORTED).status == d.FAIL
    assert d.check_driver(GPU, True, None).status == d.FAIL


def test_containerd():
    b = Path("/usr/bin/containerd")
    assert d.check_containerd(b, "containerd github.com/containerd/containerd/v2 v2.4.2 abc").status == d.PASS
    assert d.check_containerd(b, "containerd containerd.io 1.7.27 05044ec").status == d.FAIL
    assert d.check_containerd(None, None).status == d.WARN
    assert d.check_containerd(b, "???").status == d.WARN


def test_space():
    g = 1 << 30
    assert d.check_space(Path("/"), 5 * g, 100 * g, 10 * g).status == d.FAIL
    assert d.check_space(Path("/"), 50 * g, 100 * g, 10 * g).status == d.WARN
    assert d.check_space(Path("/"), 500 * g, 100 * g, 10 * g).status == d.PASS


def test_worst():
    c = [d.Check("a", d.PASS, ""), d.Check("b", d.WARN, "")]
    assert d.worst(c) == d.WARN
    assert d.worst(c + [d.Check("c", d.FAIL, "")]) == d.FAIL
    assert d.worst([]) == d.PASS


def test_thawd_reachable(tmp_path):
    sock = tmp_path / "thawd.sock"
    assert d.thawd_reachable(sock) == (False, "socket does not exist")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(str(sock))
        ok, _ = d.thawd_reachable(sock)
        assert not ok                                  # bound, not listening: refused
        srv.listen(1)
        assert d.thawd_reachable(sock) == (True, "")
    finally:
        srv.close()
    assert d.check_thawd(sock, True, "").status == d.PASS
    assert d.check_thawd(sock, False, "refused").status == d.FAIL


def test_compatibility_tuple_fields(tmp_path):
    from control import config
    s = config.load(environ={"THAW_NODE_MACHINE_TYPE": "p5.48xlarge"}, default_file=tmp_path / "absent")
    facts = d.NodeFacts("x86_64", "6.1", 0, V2, False, GPU, None, None,
                        runsc_version=RUNSC_VERSION_LABEL, cpu_features=["avx2", "sse4_2"])
    t = d.compatibility_tuple(s, facts)
    h = t.pop("hash")
    assert t == {"runsc_version": RUNSC_VERSION_LABEL, "platform": "systrap", "arch": "x86_64",
                 "cpu_features": ["avx2", "sse4_2"], "gpu_product": "NVIDIA H200", "gpu_count": 1,
                 "driver_version": "580.65.06", "cuda_driver_version": "13.0",
                 "machine_type": "p5.48xlarge"}
    # the same tuple, and hash, that images record (control/compat.py)
    from control.node.compat import CompatTuple
    assert CompatTuple.from_dict(t).hash() == h


def test_nearest_existing(tmp_path):
    assert d.nearest_existing(tmp_path / "a" / "b") == tmp_path


def _standin_view(tmp_path, node_toml: str | None, **env: str):
    """doctor's stand-in check on a tree whose /etc/thaw/config.toml is `node_toml`,
    for a thaw running with `env` (and no config file of its own)."""
    from control import config
    from control.node import provision
    root = tmp_path / "root"
    if node_toml is not None:
        (root / "etc/thaw").mkdir(parents=True)
        (root / "etc/thaw/config.toml").write_text(node_toml)
    used = config.load(environ=env, config_file=Path("/dev/null"))
    return provision.standin_config_check(used, provision.Layout(root))


def test_standin_config_same_file_passes(tmp_path):
    c = _standin_view(tmp_path, '[thawd]\nsocket = "/run/x/thawd.sock"\n', THAW_THAWD_SOCKET="/run/x/thawd.sock")
    assert c.status == d.PASS and "thawd.socket" in c.detail
    assert _standin_view(tmp_path / "none", None).status == d.PASS   # defaults on both sides


def test_standin_config_other_socket_fails_naming_both(tmp_path):
    # thawd runs with another socket than the node's file gives the stand-in (a
    # ConfigMap changed after provision seeded the host's file): every start is cold.
    c = _standin_view(tmp_path, "", THAW_THAWD_SOCKET="/run/new/thawd.sock")
    assert c.status == d.FAIL
    assert '"/run/new/thawd.sock" here, "/run/thaw/thawd.sock" for the stand-in' in c.detail
    assert str(tmp_path / "root/etc/thaw/config.toml") in c.detail


def test_standin_config_other_deadline_warns(tmp_path):
    c = _standin_view(tmp_path, "", THAW_THAWD_PREPARE_TIMEOUT_S="9")
    assert c.status == d.WARN and "thawd.prepare_timeout_s is 9.0 here, 4.0 for the stand-in" in c.detail


def test_standin_config_bad_node_file_fails(tmp_path):
    c = _standin_view(tmp_path, "[thawd]\nprepare_timeout_s = -3\n")
    assert c.status == d.FAIL and "thawd.prepare_timeout_s" in c.detail and "cold" in c.detail
