"""The CUDA checkpoint helper (C) and its Python twin nvproxy/helper.py.

The helper is built with gcc and run for real; libcuda is either missing
(THAW_LIBCUDA points nowhere) or a fake built from tests/unit/data/fake_libcuda.c.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from control.errors import PreconditionError, SpecError
from nvproxy import helper
from runsc_hooks import spec as specmod

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "nvproxy/cuda_checkpoint/thaw-cuda-checkpoint.c"
FAKE_SRC = Path(__file__).parent / "data/fake_libcuda.c"


def _gcc(*args: str) -> None:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed to build the CUDA checkpoint helper (ci/setup.sh installs it)"
    subprocess.run([gcc, *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("helper")
    out = {"helper": d / "thaw-cuda-checkpoint", "fake": d / "libcuda-fake.so", "old": d / "libcuda-old.so"}
    _gcc("-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out["helper"]), str(SRC), "-ldl")
    _gcc("-shared", "-fPIC", "-Wall", "-Werror", "-o", str(out["fake"]), str(FAKE_SRC))
    _gcc("-shared", "-fPIC", "-Wall", "-Werror", "-DNO_CHECKPOINT_API", "-o", str(out["old"]), str(FAKE_SRC))
    return out


def run(built, *args: str, lib: str | Path = "/nonexistent/libcuda.so.1", **env: str):
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "THAW_LIBCUDA": str(lib), **env}
    return subprocess.run([str(built["helper"]), *args], env=e, capture_output=True, text=True, timeout=10)


def calls(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if not ln.startswith("init")] if log.exists() else []


# -- argument handling: exit 2, before libcuda is ever loaded ---------------

@pytest.mark.parametrize("args, message", [
    ([], "nothing to do"),
    (["--toggle"], "--pid is required"),
    (["--get-state", "--pid", "abc"], "--pid wants a positive integer"),
    (["--get-state", "--pid", "0"], "--pid wants a positive integer"),
    (["--get-state", "--pid", "-4"], "--pid wants a positive integer"),
    (["--toggle", "--get-state", "--pid", "4"], "give one of"),
    (["--toggle", "--action", "lock", "--pid", "4"], "give one of"),
    (["--action", "freeze", "--pid", "4"], "unknown --action freeze"),
    (["--action"], "missing its value"),
    (["--toggle", "--pid", "4", "--timeout", "soon"], "--timeout wants milliseconds"),
    (["--toggle", "--pid", "4", "--bogus"], "unknown argument --bogus"),
])
def test_bad_arguments_exit_2_with_a_message(built, args, message):
    r = run(built, *args)
    assert r.returncode == helper.EXIT_USAGE, r.stderr
    assert message in r.stderr
    assert "usage: thaw-cuda-checkpoint" in r.stderr


def test_help_exits_0(built):
    r = run(built, "--help")
    assert r.returncode == 0
    assert "--get-state" in r.stderr


# -- no libcuda: exit 3 with a hint --------------------------------------------

@pytest.mark.parametrize("args", [["--get-state", "--pid", "7"], ["--toggle", "--pid=7"],
                                  ["--action=restore", "--pid", "7", "--timeout=100"]])
def test_without_libcuda_exit_3(built, args):
    r = run(built, *args)
    assert r.returncode == helper.EXIT_NO_LIBCUDA
    assert "cannot load /nonexistent/libcuda.so.1" in r.stderr
    assert "NVIDIA driver mounted" in r.stderr


def test_driver_without_checkpoint_api_exits_4(built):
    r = run(built, "--toggle", "--pid", "7", lib=built["old"])
    assert r.returncode == helper.EXIT_NO_API
    assert "R555" in r.stderr


# -- with a fake libcuda: the toggle's state machine ----------------------------

def test_get_state_prints_the_state(built, tmp_path):
    r = run(built, "--get-state", "--pid", "42", lib=built["fake"], FAKE_CUDA_STATE="checkpointed")
    assert (r.returncode, r.stdout) == (0, "checkpointed\n")


@pytest.mark.parametrize("state, expected", [
    ("running", ["get-state 42", "lock 42 0", "checkpoint 42"]),
    ("locked", ["get-state 42", "checkpoint 42"]),
    ("checkpointed", ["get-state 42", "restore 42", "unlock 42"]),
])
def test_toggle_moves_running_to_checkpointed_and_back(built, tmp_path, state, expected):
    log = tmp_path / "calls"
    r = run(built, "--toggle", "--pid", "42", lib=built["fake"], FAKE_CUDA_STATE=state, FAKE_CUDA_LOG=str(log))
    assert r.returncode == 0, r.stderr
    assert calls(log) == expected


def test_toggle_refuses_a_failed_process_with_exit_5(built, tmp_path):
    log = tmp_path / "calls"
    r = run(built, "--toggle", "--pid", "42", lib=built["fake"], FAKE_CUDA_STATE="failed", FAKE_CUDA_LOG=str(log))
    assert r.returncode == helper.EXIT_STATE
    assert "pid 42 is failed" in r.stderr
    assert calls(log) == ["get-state 42"]


def test_lock_timeout_reaches_the_driver(built, tmp_path):
    log = tmp_path / "calls"
    r = run(built, "--action", "lock", "--pid", "9", "--timeout", "5000", lib=built["fake"], FAKE_CUDA_LOG=str(log))
    assert r.returncode == 0, r.stderr
    assert calls(log) == ["lock 9 5000"]


def test_driver_error_exits_1_naming_the_error_and_stops(built, tmp_path):
    log = tmp_path / "calls"
    r = run(built, "--toggle", "--pid", "42", lib=built["fake"], FAKE_CUDA_FAIL="lock", FAKE_CUDA_LOG=str(log))
    assert r.returncode == helper.EXIT_DRIVER
    assert "lock of pid 42 failed: CUDA_ERROR_UNKNOWN (999)" in r.stderr
    assert calls(log) == ["get-state 42", "lock 42 0"]   # no checkpoint after a failed lock


def test_cuinit_error_exits_1(built):
    r = run(built, "--get-state", "--pid", "42", lib=built["fake"], FAKE_CUDA_FAIL="init")
    assert r.returncode == helper.EXIT_DRIVER
    assert "cuInit failed: CUDA_ERROR_UNKNOWN" in r.stderr


def test_timing_reports_each_step_of_a_toggle(built, tmp_path):
    log = tmp_path / "calls"
    r = run(built, "--toggle", "--timing", "--pid", "42", lib=built["fake"], FAKE_CUDA_STATE="checkpointed",
            FAKE_CUDA_LOG=str(log))
    assert r.returncode == 0, r.stderr
    t = helper.parse_timing(r.stderr)
    assert list(t) == ["dlopen", "cuInit", "get-state", "restore", "unlock", "total"]
    assert all(v >= 0 for v in t.values()) and t["total"] >= t["cuInit"]
    assert calls(log) == ["get-state 42", "restore 42", "unlock 42"]   # --timing changes nothing else


def test_timing_is_printed_when_the_helper_fails_too(built):
    r = run(built, "--get-state", "--pid", "42", "--timing")
    assert r.returncode == helper.EXIT_NO_LIBCUDA
    assert list(helper.parse_timing(r.stderr)) == ["dlopen", "total"]


def test_timing_file_from_the_environment_gets_one_line_per_run(built, tmp_path):
    # runsc starts the restore's toggle itself with the container's environment
    # and keeps the helper's stderr only in a debug log: the file is how a run sees it.
    f = tmp_path / "helper-timing.log"
    r = run(built, "--toggle", "--pid", "42", lib=built["fake"], FAKE_CUDA_STATE="checkpointed",
            THAW_CUDA_CHECKPOINT_TIMING=str(f))
    assert r.returncode == 0, r.stderr
    assert "timing" not in r.stderr     # runsc reads --get-state's stdout and stderr as one
    run(built, "--get-state", "--pid", "7", THAW_CUDA_CHECKPOINT_TIMING=str(f))    # no libcuda: exit 3
    first, second = f.read_text().splitlines()
    assert "mode=toggle pid=42 rc=0 started=" in first and "mode=get-state pid=7 rc=3 " in second
    t = helper.parse_timing(first)
    assert {"pid", "rc", "started", "dlopen", "cuInit", "restore", "total"} <= set(t) and t["started"] > 1.7e9


def test_no_timing_line_without_the_flag(built):
    r = run(built, "--get-state", "--pid", "42", lib=built["fake"])
    assert r.returncode == 0 and "timing" not in r.stderr
    assert helper.parse_timing(r.stderr) == {}
    assert helper.parse_timing("thaw-cuda-checkpoint timing: cuInit=x total=0.5\n") == {"total": 0.5}


# -- the Python twin -------------------------------------------------------------

def test_exit_codes_match_the_c_enum():
    enum = re.search(r"enum \{ (EXIT_OK[^}]*)\}", SRC.read_text()).group(1)
    c_codes = {k.strip(): int(v) for k, v in (item.split("=") for item in enum.split(","))}
    py_codes = {k: v for k, v in vars(helper).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert c_codes == py_codes
    assert set(helper.EXIT_MEANING) == set(c_codes.values())


def test_helper_path_matches_the_smoke():
    smoke = (REPO / "bench/gpu/smoke.py").read_text()
    assert f'HELPER_DEST = "{helper.HELPER_PATH}"' in smoke


def test_explain():
    assert "R555" in helper.explain(4)
    assert helper.explain(-9) == "killed by signal 9"
    assert helper.explain(77) == "unknown exit code 77"


def test_stage_and_mount(built, tmp_path):
    exe = helper.stage(built["helper"], tmp_path / "bin")
    assert exe == tmp_path / "bin" / helper.HELPER_NAME
    assert os.access(exe, os.X_OK)
    assert not [p for p in exe.parent.iterdir() if ".partial-" in p.name]
    m = helper.bind_mount(tmp_path / "bin")
    assert m == {"destination": "/thaw/bin", "type": "bind", "source": str(tmp_path / "bin"),
                 "options": ["rbind", "ro"]}


def test_stage_missing_binary(tmp_path):
    with pytest.raises(PreconditionError, match="make setup"):
        helper.stage(tmp_path / "nope", tmp_path / "bin")


def test_bind_mount_needs_the_executable(tmp_path):
    with pytest.raises(PreconditionError, match="not an executable"):
        helper.bind_mount(tmp_path)


def test_add_to_spec_replaces_the_old_source_and_refuses_mounts_inside(built, tmp_path):
    helper.stage(built["helper"], tmp_path / "a")
    helper.stage(built["helper"], tmp_path / "b")
    sp = specmod.command_spec(["/bin/true"], rootfs=str(tmp_path / "root"))
    helper.add_to_spec(sp, tmp_path / "a")
    helper.add_to_spec(sp, tmp_path / "b")
    helper_mounts = [m for m in sp["mounts"] if m["destination"] == helper.HELPER_DIR]
    assert [m["source"] for m in helper_mounts] == [str(tmp_path / "b")]
    sp["mounts"].append(specmod.bind_mount("/tmp", "/thaw/bin/x"))
    sp["mounts"] = [m for m in sp["mounts"] if m["destination"] != helper.HELPER_DIR]
    with pytest.raises(SpecError, match="reserves"):
        helper.add_to_spec(sp, tmp_path / "a")


def test_one_helper_mount_for_both_doors(built, tmp_path):
    """nvproxy/cuda.py mount_helper, which thawd's create and the CLI's GPU specs both
    call: a CPU spec is left alone, a GPU spec gets the mount once (a second call
    changes nothing), and a GPU spec with no staged helper is refused with the fix."""
    from nvproxy import cuda
    helper.stage(built["helper"], tmp_path / "a")
    cpu = specmod.command_spec(["/bin/true"], rootfs=str(tmp_path / "root"))
    assert cuda.mount_helper(cpu, None) is False and cpu == specmod.command_spec(["/bin/true"],
                                                                                 rootfs=str(tmp_path / "root"))
    gpu = specmod.command_spec(["/bin/true"], rootfs=str(tmp_path / "root"))
    gpu.setdefault("linux", {})["devices"] = [{"path": cuda.CONTROL_NODE, "type": "c", "major": 195, "minor": 255}]
    assert cuda.mount_helper(gpu, tmp_path / "a") is True
    assert cuda.mount_helper(gpu, tmp_path / "a") is False
    assert cuda.helper_path(gpu) == helper.HELPER_PATH
    with pytest.raises(PreconditionError, match="make setup"):
        cuda.mount_helper(gpu, None)
