"""control.node.doctor: the checks as pure functions of made-up facts."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from control.node import doctor as d
from control.config import RUNSC_VERSION_LABEL
from nvproxy.gpu import Gpu, NodeGpus

V2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
V1 = ("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
      "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
      "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
GPU = NodeGpus("580.65.06", "13.0", (Gpu(0, "NVIDIA H200", "GPU-0", 0, 150 << 30, "0000:01:00.0"),), "nvml")
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
    ("auto", NodeGpus(), d.WARN),      # CPU node: warn, not fail
    ("auto", GPU, d.PASS),
    ("yes", NodeGpus(), d.FAIL),
    ("yes", GPU, d.PASS),
    ("no", GPU, d.PASS),
])
def test_gpu(setting, gpu, status):
    assert d.check_gpu(setting, gpu).status == status


def test_unreadable_gpu_facts_fail_whatever_node_gpu_says():
    for setting in ("auto", "yes", "no"):
        c = d.check_gpu(setting, NodeGpus(), "NVML nvmlInit failed: RM has detected an NVIDIA/NVIDIA driver mismatch")
        assert c.status == d.FAIL and "mismatch" in c.detail and "thawd" in c.detail


def test_gpu_detail_names_the_models_and_the_source():
    two = NodeGpus("580.65.06", "", (GPU.gpus[0], Gpu(1, "NVIDIA A100-SXM4-80GB", "GPU-1", 1, 0, "0000:02:00.0")),
                   "procfs")
    assert d.check_gpu("auto", two).detail == "2 x NVIDIA A100-SXM4-80GB, NVIDIA H200 (procfs)"


def test_gpu_wanted():
    assert d.gpu_wanted("auto", GPU) and not d.gpu_wanted("auto", NodeGpus())
    assert d.gpu_wanted("yes", NodeGpus()) and not d.gpu_wanted("no", GPU)


def test_driver():
    assert d.check_driver(GPU, True, SUPPORTED).status == d.PASS
    old = NodeGpus("580.1.2", "", GPU.gpus, "procfs")
    c = d.check_driver(old, True, SUPPORTED)
    assert c.status == d.FAIL and "580.65.06" in c.detail and "570" not in c.detail
    assert d.check_driver(NodeGpus(), False, SUPPORTED).status == d.PASS
    assert d.check_driver(NodeGpus(), True, SUPPORTED).status == d.FAIL
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
    # the same tuple, and hash, that images record (control/node/compat.py)
    from control.node.compat import CompatTuple
    assert CompatTuple.from_dict(t).hash() == h


def test_no_tuple_without_gpu_facts(tmp_path):
    from control import config
    s = config.load(environ={}, default_file=tmp_path / "absent")
    facts = d.NodeFacts("x86_64", "6.1", 0, V2, False, NodeGpus(), None, None,
                        runsc_version=RUNSC_VERSION_LABEL, gpu_error="NVML nvmlInit failed: Unknown Error")
    assert d.compatibility_tuple(s, facts) == {"error": "NVML nvmlInit failed: Unknown Error"}


FAKE_RUNSC = f"""#!/bin/sh
# Answers what doctor and compat.node_tuple ask runsc; anything else fails.
for a in "$@"; do
  case "$a" in
    --version) echo "runsc version {RUNSC_VERSION_LABEL}"; echo "spec: 1.1.0"; exit 0;;
    cpu-features) echo "sse4_2,avx2,fpu"; exit 0;;
    list-supported-drivers) echo "580.159.04"; exit 0;;
  esac
done
exit 1
"""


def test_doctor_prints_the_tuple_thawd_builds(tmp_path, monkeypatch):
    # One fake NVML (a mixed node, GPU 0 an H200) feeds both paths: doctor's
    # gather + compatibility_tuple, and compat.node_tuple as thawd calls it at
    # start (control/thawd/image_source.py). Same tuple, same hash; the GPU
    # product is the sorted distinct names, not GPU 0's.
    from control import config
    from control.node import compat
    from nvproxy import gpu
    from tests.unit.test_gpu import FakeNvml
    runsc = tmp_path / "runsc"
    runsc.write_text(FAKE_RUNSC)
    runsc.chmod(0o755)
    s = config.load(environ={"THAW_RUNSC_PATH": str(runsc), "THAW_NODE_MACHINE_TYPE": "mixed-2"},
                    default_file=tmp_path / "absent")
    devices = [{"name": n, "uuid": f"GPU-{i}", "minor": i, "mem": 1 << 30, "bus": f"0000:0{i}:00.0"}
               for i, n in enumerate(("NVIDIA H200", "NVIDIA A100-SXM4-80GB"))]
    monkeypatch.setattr(gpu, "_pynvml", lambda: FakeNvml(devices))

    printed = d.compatibility_tuple(s, d.gather(s, s.runsc_path))
    served = compat.node_tuple(s)
    assert printed == {**served.to_dict(), "hash": served.hash()}
    assert printed["gpu_product"] == "NVIDIA A100-SXM4-80GB,NVIDIA H200" and printed["gpu_count"] == 2
    assert printed["cpu_features"] == ["avx2", "fpu", "sse4_2"] and printed["machine_type"] == "mixed-2"


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
