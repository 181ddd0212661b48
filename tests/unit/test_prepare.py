"""What thawd adds to an opted-in container's spec at its create, cold or restored
alike (control/thawd/prepare.py Preparer.prepare_spec), for a pod's app container
(`visible_devices`): the CUDA helper mounted into a GPU spec, GPUs named by
NVIDIA_VISIBLE_DEVICES injected through this node's CDI registry (here a spec of fake
devices), the workload profile's environment; the shim's own config.json kept beside.
Real bundles and specs; the preparer's other parts are not used by prepare_spec."""
from __future__ import annotations

import json
import stat

import pytest

from control import config
from control.errors import ThawError
from control.thawd.containers import RuntimeRef
from control.thawd.prepare import ORIG_CONFIG, Preparer
from nvproxy import helper
from runsc_hooks import spec as specmod
from tests.unit.test_pod import POD_ANN, member


@pytest.fixture
def preparer(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    runsc = tmp_path / "bin" / "runsc"
    runsc.parent.mkdir()
    runsc.write_text("#!/bin/sh\nexit 0\n")
    runsc.chmod(runsc.stat().st_mode | stat.S_IEXEC)
    cuda = tmp_path / "bin" / helper.BINARY_NAME        # installed beside runsc, as provision does
    cuda.write_text("#!/bin/sh\nexit 0\n")
    cuda.chmod(0o755)
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_RUNSC_PATH": str(runsc)},
                    config_file=tmp_path / "empty.toml")
    return Preparer(s, containers=None, images=None, quarantine=None, metrics=None, pool=None, parking=None)


def rt_of(tmp, cid: str, spec: dict) -> RuntimeRef:
    b = tmp / "bundles" / cid
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(spec))
    return RuntimeRef.validate(cid, str(b), "/run/test-root", ["--root=/run/test-root"])


def gpu_member(name: str, minors=(0,)) -> dict:
    m = member(name)
    m.setdefault("linux", {})["devices"] = [
        {"path": p, "type": "c", "major": 195, "minor": n}
        for p, n in [("/dev/nvidiactl", 255), *((f"/dev/nvidia{i}", i) for i in minors)]]
    return m


def test_a_gpu_container_of_a_pod_gets_the_cuda_helper_and_its_original_config_is_kept(preparer, tmp_path):
    spec = gpu_member("app")
    app = rt_of(tmp_path, "s2-app", spec)
    original = (app.bundle / "config.json").read_text()
    preparer.prepare_spec(app, spec, visible_devices=True)
    saved = specmod.Bundle(app.bundle).load()
    assert [m["source"] for m in saved["mounts"] if m["destination"] == helper.HELPER_DIR] == \
        [str(preparer.s.state_dir / "cuda-helper")], "config.json names the staged helper"
    assert (app.bundle / ORIG_CONFIG).read_text() == original, "the shim's own config is kept"
    preparer.prepare_spec(app, saved, visible_devices=True)   # a second create: nothing changes
    assert specmod.Bundle(app.bundle).load() == saved and (app.bundle / ORIG_CONFIG).read_text() == original


def test_a_cpu_container_is_left_as_the_shim_wrote_it(preparer, tmp_path):
    spec = member("sidecar")
    side = rt_of(tmp_path, "s2-sidecar", spec)
    preparer.prepare_spec(side, spec, visible_devices=True)
    assert not (side.bundle / ORIG_CONFIG).exists() and specmod.Bundle(side.bundle).load() == spec


def test_nvidia_visible_devices_become_cdi_devices_of_this_node(preparer, tmp_path, monkeypatch):
    """The device plugin's envvar strategy: thaw injects the GPUs it names through the
    node's CDI registry, as the NVIDIA container runtime would; a value that names no
    GPU of this node is a ThawError before anything is written."""
    from control.lifecycle import gpus as gpumod
    from nvproxy import cdi
    from nvproxy.gpu import NodeGpus
    doc = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "containerEdits": {
        "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]},
        "devices": [{"name": str(i), "containerEdits": {"deviceNodes": [
            {"path": f"/dev/nvidia{i}", "type": "c", "major": 195, "minor": i}]}} for i in range(2)]}
    reg = cdi.Registry()
    reg.add(cdi.parse(doc))
    monkeypatch.setattr(gpumod, "node_devices", lambda: gpumod.Devices(NodeGpus(), reg))
    spec = member("app", env={"NVIDIA_VISIBLE_DEVICES": "1"})
    app = rt_of(tmp_path, "s2-app", spec)
    preparer.prepare_spec(app, spec, visible_devices=True)
    assert [d["path"] for d in specmod.Bundle(app.bundle).load()["linux"]["devices"]] == \
        ["/dev/nvidiactl", "/dev/nvidia1"]
    bad_spec = member("sidecar", env={"NVIDIA_VISIBLE_DEVICES": "gpu-one"})
    bad = rt_of(tmp_path, "s2-sidecar", bad_spec)
    with pytest.raises(ThawError, match="NVIDIA_VISIBLE_DEVICES='gpu-one'"):
        preparer.prepare_spec(bad, bad_spec, visible_devices=True)
    assert not (bad.bundle / ORIG_CONFIG).exists(), "nothing written"


def test_a_pods_profile_sets_its_environment_on_every_app_container(preparer, tmp_path):
    """The vllm profile's settings for C/R (loopback host IP, spawned workers, an
    IPC path inside the sandbox) are thaw's to set, not the user's."""
    spec = member("app", ann={**POD_ANN, "thaw.dev/profile": "vllm"}, env={"VLLM_HOST_IP": "10.0.0.9"})
    app = rt_of(tmp_path, "s2-app", spec)
    preparer.prepare_spec(app, spec, visible_devices=True)
    env = dict(e.split("=", 1) for e in specmod.Bundle(app.bundle).load()["process"]["env"])
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["VLLM_RPC_BASE_PATH"] == "/tmp"
