"""control/lifecycle/deadlines.py: runsc deadlines scaled by what a call moves."""
from __future__ import annotations

import pytest

from control import config
from control.errors import GpuError, RunscError
from control.lifecycle import deadlines
from nvproxy import gpu
from tests.unit.test_gpu import H200, FakeNvml

GIB = 1 << 30


def settings(**env):
    return config.load(environ={"THAW_CONFIG": "/dev/null", **env})


def test_scaled_adds_the_per_gib_seconds_and_names_both_settings():
    s = settings(THAW_RUNSC_TIMEOUT_S="120", THAW_RUNSC_TIMEOUT_PER_GIB_S="4")
    d = deadlines.scaled(s, 108 * GIB)
    assert d.seconds == pytest.approx(120 + 4 * 108)
    assert d.key == "runsc.timeout_s + runsc.timeout_per_gib_s x 108.0 GiB"
    assert deadlines.scaled(s, 0) == deadlines.Deadline(120.0, "runsc.timeout_s", 0)


def test_zero_per_gib_is_the_fixed_deadline():
    s = settings(THAW_RUNSC_TIMEOUT_PER_GIB_S="0")
    assert deadlines.scaled(s, 500 * GIB) == deadlines.Deadline(s.runsc_timeout_s, "runsc.timeout_s", 500 * GIB)


def test_a_restore_scales_with_the_image_files_only(tmp_path):
    for name, size in (("checkpoint.img", 10), ("pages_meta.img", 20), ("pages.img", 3 * GIB // 2)):
        with open(tmp_path / name, "wb") as f:
            f.truncate(size)
    (tmp_path / "thaw.json").write_text("{}")   # not runsc's: not loaded by the restore
    s = settings(THAW_RUNSC_TIMEOUT_S="10", THAW_RUNSC_TIMEOUT_PER_GIB_S="2")
    d = deadlines.for_restore(s, tmp_path)
    assert d.nbytes == 3 * GIB // 2 + 30 and d.seconds == pytest.approx(10 + 2 * d.nbytes / GIB)
    assert deadlines.for_restore(s, tmp_path / "absent").seconds == 10.0   # a view: its stream bounds it


class Runsc:
    def __init__(self, usage=None, error=None):
        self.usage, self.error = usage, error

    def memory_usage(self, cid):
        if self.error:
            raise self.error
        return self.usage


GPU_SPEC = {"linux": {"devices": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia1", "minor": 1}]}}


def test_a_checkpoint_counts_the_sandbox_memory_and_its_gpus_in_use():
    seen = []

    def used(minors):
        seen.append(minors)
        return 100 * GIB

    s = settings(THAW_RUNSC_TIMEOUT_S="120", THAW_RUNSC_TIMEOUT_PER_GIB_S="1")
    d = deadlines.for_checkpoint(s, Runsc(usage=8 * GIB), "c", [GPU_SPEC, {"linux": {}}], gpu_used=used)
    assert seen == [[1]] and d.nbytes == 108 * GIB and d.seconds == pytest.approx(228)
    # A CPU sandbox asks NVML nothing.
    assert deadlines.for_checkpoint(s, Runsc(usage=GIB), "c", [], gpu_used=used).nbytes == GIB and seen == [[1]]


def test_a_footprint_that_cannot_be_read_counts_zero_never_fails():
    s = settings()
    err = RunscError(["runsc", "events"], 1, "", "sandbox gone")

    def broken(minors):
        raise GpuError("nvmlInit", "lost")

    d = deadlines.for_checkpoint(s, Runsc(error=err), "c", [GPU_SPEC], gpu_used=broken)
    assert d == deadlines.Deadline(s.runsc_timeout_s, "runsc.timeout_s", 0)


def test_used_bytes_sums_the_named_gpus_only():
    class Used(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, h):
            from types import SimpleNamespace
            return SimpleNamespace(total=h["mem"], used=h["minor"] * GIB, free=0)

    nv = Used(H200)   # minors 3 and 1
    assert gpu.used_bytes([1], nvml=nv) == GIB
    assert gpu.used_bytes([1, 3], nvml=nv) == 4 * GIB
    assert gpu.used_bytes([], nvml=nv) == 0
    import pynvml
    assert gpu.used_bytes([0], nvml=FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) == 0
