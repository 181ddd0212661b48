"""control/lifecycle/gpus.py: --gpus requests, injection with the CUDA helper,
what an image says it needs, and the restore checks (fake NVML facts and a
CDI registry generated for them; device nodes from a fake stat)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from control.errors import ImageError, NotFound, PreconditionError, UserError
from control.lifecycle import gpus
from nvproxy.cuda import helper_path as cuda_helper_path
from nvproxy import cdi, helper, restore_spec
from nvproxy.gpu import Gpu, NodeGpus
from runsc_hooks import spec as specmod

from tests.unit.test_cdi import DRIVER, driver_tree, fake_stat

H200 = "NVIDIA H200"


def node(n: int = 2, product: str = H200, driver: str = DRIVER) -> NodeGpus:
    return NodeGpus(driver, "13.0", tuple(Gpu(i, product, f"GPU-{i}{i}{i}", i, 150 << 30, f"0000:0{i}:00.0")
                                          for i in range(n)))


def devices(tmp_path: Path, n: int = 2, product: str = H200, driver: str = DRIVER) -> gpus.Devices:
    """What a node with `n` GPUs would answer: NVML facts (`driver` as NVML says
    it) and a CDI registry generated for them from fake driver files."""
    nd = node(n, product, driver)
    if not n:
        return gpus.Devices(nd, cdi.Registry(), fake_stat)
    root = tmp_path / "driver-files"
    lib, bindir = (root / "usr/local/nvidia/lib64", root / "bin") if root.exists() else driver_tree(root)
    doc = cdi.generate(node(n, product), lib_dirs=[lib], bin_dirs=[bindir], exists=lambda p: True)
    return gpus.Devices(nd, cdi.Registry([cdi.parse(doc)]), fake_stat)


@pytest.fixture
def helper_dir(tmp_path) -> Path:
    exe = tmp_path / "bin" / "thaw-cuda-checkpoint"
    exe.parent.mkdir()
    exe.write_bytes(b"#!/bin/sh\n")
    return Path(helper.stage(exe, tmp_path / "helper")).parent


@pytest.fixture
def spec(tmp_path) -> dict:
    return specmod.command_spec(["/usr/bin/python3", "/srv/server.py"], rootfs=str(tmp_path / "root"))


# -- requests ---------------------------------------------------------------------

@pytest.mark.parametrize("text, names", [
    ("all", ["nvidia.com/gpu=all"]),
    ("0", ["nvidia.com/gpu=0"]),
    ("1,0,1", ["nvidia.com/gpu=1", "nvidia.com/gpu=0"]),
    ("GPU-3f2a-77", ["nvidia.com/gpu=GPU-3f2a-77"]),
    ("nvidia.com/gpu=0, example.com/fpga=x", ["nvidia.com/gpu=0", "example.com/fpga=x"]),
])
def test_parse_request(text, names):
    assert gpus.parse_request(text) == names


@pytest.mark.parametrize("text", ["", ",", "gpu0", "nvidia.com/gpu=", "-1", "0;1"])
def test_bad_requests_say_what_is_accepted(text):
    with pytest.raises(UserError, match="--gpus"):
        gpus.parse_request(text)


# -- run ----------------------------------------------------------------------------

def test_inject_adds_devices_driver_files_and_the_helper(tmp_path, spec, helper_dir):
    out = gpus.inject(spec, ["nvidia.com/gpu=1"], devices(tmp_path), helper_dir)
    specmod.validate(out)
    assert cdi.gpu_nodes(out) == ["/dev/nvidia1"]
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= {d["path"] for d in out["linux"]["devices"]}
    assert any(m["destination"].endswith(f"libcuda.so.{DRIVER}") for m in out["mounts"])
    # The engine will pass --cuda-checkpoint-path because the helper is mounted.
    assert cuda_helper_path(out) == helper.HELPER_PATH
    [m] = [m for m in out["mounts"] if m["destination"] == helper.HELPER_DIR]
    assert m["source"] == str(helper_dir) and "ro" in m["options"]
    assert "/dev/nvidia1" not in json.dumps(spec)   # the input is untouched


def test_requests_on_a_node_without_gpus_fail_before_anything(tmp_path, spec, helper_dir):
    with pytest.raises(PreconditionError, match="this node has no NVIDIA GPU"):
        gpus.inject(spec, ["nvidia.com/gpu=0"], devices(tmp_path, n=0), helper_dir)


def test_unknown_index_names_the_known_devices(tmp_path, spec, helper_dir):
    with pytest.raises(NotFound, match=r"nvidia.com/gpu=7' not found: known: nvidia.com/gpu=0"):
        gpus.inject(spec, ["nvidia.com/gpu=7"], devices(tmp_path), helper_dir)


def test_a_gpu_spec_without_a_helper_binary_is_refused(tmp_path, spec):
    with pytest.raises(PreconditionError, match="CUDA checkpoint helper"):
        gpus.inject(spec, ["nvidia.com/gpu=0"], devices(tmp_path), None)


def test_with_helper_leaves_a_cpu_spec_alone(spec, helper_dir):
    assert gpus.with_helper(spec, helper_dir) == spec


# -- what an image needs ---------------------------------------------------------

def test_needs_says_count_product_driver_and_indexes(tmp_path, spec, helper_dir):
    dev = devices(tmp_path, n=4)
    out = gpus.inject(spec, ["nvidia.com/gpu=3", "nvidia.com/gpu=GPU-111"], dev, helper_dir)
    need = gpus.needs(out, dev.gpus)
    assert need == {"count": 2, "product": H200, "driver_version": DRIVER, "indexes": [1, 3],
                    "devices": ["nvidia.com/gpu=3", "nvidia.com/gpu=GPU-111"]}
    assert gpus.needs(spec, dev.gpus) is None
    # NVML failed at checkpoint: the count is still true, the rest says "unknown".
    assert gpus.needs(out, None) == {"count": 2, "product": "", "driver_version": "", "indexes": [],
                                     "devices": ["nvidia.com/gpu=3", "nvidia.com/gpu=GPU-111"]}


# -- restore ---------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path, spec, helper_dir):
    """A spec saved with GPU 0 of a 2-GPU H200 node, and what its image needs."""
    dev = devices(tmp_path)
    out = gpus.inject(spec, ["nvidia.com/gpu=0"], dev, helper_dir)
    return out, gpus.needs(out, dev.gpus)


def test_restore_without_gpus_uses_the_saved_indexes(tmp_path, saved, helper_dir):
    sp, need = saved
    new = gpus.for_restore(sp, need, None, devices(tmp_path), helper_dir, "/img")
    assert cdi.gpu_nodes(new) == ["/dev/nvidia0"]
    restore_spec.check_restore_compatible(sp, new)


def test_restore_onto_another_gpu(tmp_path, saved, tmp_path_factory):
    sp, need = saved
    other_helper = tmp_path_factory.mktemp("node2")
    (other_helper / helper.HELPER_NAME).write_bytes(b"#!/bin/sh\n")
    (other_helper / helper.HELPER_NAME).chmod(0o755)
    new = gpus.for_restore(sp, need, ["nvidia.com/gpu=1"], devices(tmp_path), other_helper, "/img")
    assert cdi.gpu_nodes(new) == ["/dev/nvidia1"]
    # Same mount destinations (runsc's restore validation), this node's helper source.
    assert sorted(m["destination"] for m in new["mounts"]) == sorted(m["destination"] for m in sp["mounts"])
    [m] = [m for m in new["mounts"] if m["destination"] == helper.HELPER_DIR]
    assert m["source"] == str(other_helper)


def test_restore_with_another_gpu_count_is_refused_naming_both(tmp_path, saved, helper_dir):
    sp, need = saved
    with pytest.raises(ImageError, match=r"needs 1 GPU\(s\) \(NVIDIA H200, driver 580.159.04\); "
                                         r"--gpus 0,1 assigns 2 \(0, 1\)"):
        gpus.for_restore(sp, need, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], devices(tmp_path), helper_dir, "/img")


def test_restore_on_a_node_without_gpus(tmp_path, saved, helper_dir):
    sp, need = saved
    with pytest.raises(PreconditionError, match=r"image /img needs 1 GPU\(s\) .*this node has no NVIDIA GPU"):
        gpus.for_restore(sp, need, None, devices(tmp_path, n=0), helper_dir, "/img")


def test_restore_onto_another_driver_or_model_is_refused(tmp_path, saved, helper_dir):
    sp, need = saved
    with pytest.raises(ImageError, match=f"saved with NVIDIA driver {DRIVER}; this node has 580.65.06"):
        gpus.for_restore(sp, need, None, devices(tmp_path, driver="580.65.06"), helper_dir, "/img")
    with pytest.raises(ImageError, match="saved on NVIDIA H200; the image's own GPU indexes .* assigns NVIDIA A100"):
        gpus.for_restore(sp, need, None, devices(tmp_path, product="NVIDIA A100"), helper_dir, "/img")


def test_default_indexes_missing_here_ask_for_gpus(tmp_path, helper_dir, spec):
    dev2 = devices(tmp_path, n=2)
    sp = gpus.inject(spec, ["nvidia.com/gpu=1"], dev2, helper_dir)
    need = gpus.needs(sp, dev2.gpus)
    with pytest.raises(NotFound, match=r"own GPU indexes \(1; pass --gpus to choose\): this node has GPUs 0"):
        gpus.for_restore(sp, need, None, devices(tmp_path, n=1), helper_dir, "/img")
    # An image that does not say where it ran needs --gpus.
    with pytest.raises(ImageError, match="pass --gpus"):
        gpus.for_restore(sp, {**need, "indexes": []}, None, dev2, helper_dir, "/img")


def test_cold_start_takes_whatever_gpus_it_is_given(tmp_path, saved, helper_dir):
    sp, need = saved
    new = gpus.for_cold(sp, need, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], devices(tmp_path), helper_dir, "/img")
    assert cdi.gpu_nodes(new) == ["/dev/nvidia0", "/dev/nvidia1"]
    assert cuda_helper_path(new) == helper.HELPER_PATH
    assert [d["path"] for d in new["linux"]["devices"]].count("/dev/nvidiactl") == 1
