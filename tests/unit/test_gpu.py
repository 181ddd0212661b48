"""nvproxy/gpu.py against a fake NVML (and the real one, which finds no GPU on CI)."""
from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from control.errors import GpuError, NotFound, PreconditionError
from nvproxy import gpu


class FakeNvml:
    """pynvml's surface with the real error class and constants; devices from a list."""
    NVMLError = pynvml.NVMLError
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    def __init__(self, devices=(), init_error=None, fail=None):
        self.devices = list(devices)
        self.init_error = init_error
        self.fail = fail or {}
        self.shutdowns = 0

    def _maybe_fail(self, name):
        if name in self.fail:
            raise pynvml.NVMLError(self.fail[name])

    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        self._maybe_fail("count")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.devices[i]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetMinorNumber(self, h):
        self._maybe_fail("minor")
        return h["minor"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["mem"], used=0, free=h["mem"])

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=h["bus"])


H200 = [{"name": "NVIDIA H200", "uuid": f"GPU-{i}aaa", "minor": m, "mem": 150754820096, "bus": f"0000:0{i}:00.0"}
        for i, m in enumerate((3, 1))]


def test_probe_reads_every_gpu():
    nvml = FakeNvml(H200)
    node = gpu.probe(nvml)
    assert node.driver_version == "580.159.04"
    assert node.cuda_driver_version == "13.0"
    assert [(g.index, g.minor, g.uuid, g.device_path) for g in node.gpus] == [
        (0, 3, "GPU-0aaa", "/dev/nvidia3"), (1, 1, "GPU-1aaa", "/dev/nvidia1")]
    assert node.gpus[0].memory_bytes == 150754820096
    assert node.compat() == {"gpu_product": "NVIDIA H200", "gpu_count": 2, "driver_version": "580.159.04",
                             "cuda_driver_version": "13.0"}
    assert nvml.shutdowns == 1


def test_bytes_names_from_old_bindings_are_decoded():
    dev = dict(H200[0], name=b"NVIDIA H200", uuid=b"GPU-b")
    node = gpu.probe(FakeNvml([dev]))
    assert (node.gpus[0].product, node.gpus[0].uuid) == ("NVIDIA H200", "GPU-b")


@pytest.mark.parametrize("err", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_gpu_is_a_normal_answer(err, tmp_path):
    node = gpu.probe(FakeNvml(init_error=err), procfs=tmp_path / "absent")
    assert not node and node.source == ""
    assert node.compat() == {"gpu_product": "", "gpu_count": 0, "driver_version": "", "cuda_driver_version": ""}


# /proc/driver/nvidia as the 580 open kernel module writes it (nv-procfs.c).
VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
           "(dvs-builder@U22-I3-AF03-09-1)  Thu Jul 31 22:03:01 UTC 2025\n"
           "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")


def _information(model, uuid, minor, bus, excluded="No"):
    return (f"Model: \t\t {model}\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.a5.00.01\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t {excluded}\n")


@pytest.fixture
def procfs(tmp_path):
    root = tmp_path / "nvidia"
    for bus, text in (("0000:1b:00.0", _information("NVIDIA H200", "GPU-b", 1, "0000:1b:00.0")),
                      ("0000:18:00.0", _information("NVIDIA H200", "GPU-a", 0, "0000:18:00.0")),
                      ("0000:2a:00.0", _information("NVIDIA H200", "GPU-x", 2, "0000:2a:00.0", "Yes"))):
        (root / "gpus" / bus).mkdir(parents=True)
        (root / "gpus" / bus / "information").write_text(text)
    (root / "version").write_text(VERSION)
    return root


def test_without_nvml_the_kernel_modules_procfs_answers(procfs):
    # A privileged pod: the host's /proc, no libnvidia-ml.
    node = gpu.probe(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), procfs=procfs)
    assert node.source == "procfs" and node.driver_version == "580.159.04" and node.cuda_driver_version == ""
    # PCI bus id order (NVML's), the excluded GPU left out as NVML leaves it out.
    assert [(g.index, g.uuid, g.minor, g.pci_bus_id, g.product) for g in node.gpus] == [
        (0, "GPU-a", 0, "0000:18:00.0", "NVIDIA H200"), (1, "GPU-b", 1, "0000:1b:00.0", "NVIDIA H200")]
    assert node.compat() == {"gpu_product": "NVIDIA H200", "gpu_count": 2, "driver_version": "580.159.04",
                             "cuda_driver_version": ""}


def test_nvml_wins_over_procfs(procfs):
    node = gpu.probe(FakeNvml(H200), procfs=procfs)
    assert node.source == "nvml" and [g.uuid for g in node.gpus] == ["GPU-0aaa", "GPU-1aaa"]


def test_procfs_driver_without_gpus_and_proprietary_version_line(tmp_path):
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 "
                                      "06:58:55 UTC 2025\n")
    node = gpu.from_procfs(tmp_path)
    assert not node and node.driver_version == "580.65.06" and node.source == "procfs"


def test_procfs_gpu_without_a_minor_is_an_error(procfs):
    info = procfs / "gpus" / "0000:18:00.0" / "information"
    info.write_text(info.read_text().replace("Device Minor", "Minor"))
    with pytest.raises(PreconditionError, match="0000:18:00.0/information: no 'Device Minor' line"):
        gpu.from_procfs(procfs)


def test_zero_devices_is_a_normal_answer():
    node = gpu.probe(FakeNvml([]))
    assert not node and node.driver_version == "580.159.04"


def test_broken_nvml_at_init_is_a_clear_error():
    with pytest.raises(GpuError) as ei:
        gpu.probe(FakeNvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    assert ei.value.call == "nvmlInit"
    assert "mismatch" in str(ei.value).lower()


def test_error_on_a_device_names_the_call_and_shuts_down():
    nvml = FakeNvml(H200, fail={"minor": pynvml.NVML_ERROR_GPU_IS_LOST})
    with pytest.raises(GpuError, match="nvmlDeviceGetMinorNumber failed: .*[Ll]ost"):
        gpu.probe(nvml)
    assert nvml.shutdowns == 1


def test_select_by_index_uuid_and_all():
    node = gpu.probe(FakeNvml(H200))
    assert [g.index for g in node.select(["1"])] == [1]
    assert [g.index for g in node.select(["GPU-1aaa", "0", "1"])] == [1, 0]
    assert [g.index for g in node.select(["all"])] == [0, 1]
    with pytest.raises(NotFound, match="GPU '7' not found: this node has 0 \\(GPU-0aaa\\), 1 \\(GPU-1aaa\\)"):
        node.select(["7"])


def test_cuda_version():
    assert gpu.cuda_version(12080) == "12.8"
    assert gpu.cuda_version(13000) == "13.0"


def test_real_nvml_answers_without_raising():
    # CI has no GPU: the real pynvml must say so as an empty answer, not an error.
    # (On a GPU node the same call lists its GPUs.)
    node = gpu.probe()
    assert bool(node) == bool(node.driver_version)
