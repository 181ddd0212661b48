"""The CUDA checkpoint helper: where it lives in a sandbox and what its exit codes mean.

runsc runs the helper inside the sandbox (`runsc checkpoint
--cuda-checkpoint-path HELPER_PATH`): the path is one inside the container, so
every GPU sandbox gets the helper's host directory bind-mounted read-only at
HELPER_DIR, at checkpoint and at restore alike (restore toggles the same
processes back with the same path; docs/notes/gvisor-facts.md "GPU"). The helper is
nvproxy/cuda_checkpoint/thaw-cuda-checkpoint.c, built by ci/setup.sh into
build/thaw-cuda-checkpoint; it has no Python dependency and loads libcuda at
run time (THAW_LIBCUDA overrides the library it loads, for tests).
"""

from __future__ import annotations

import os
from pathlib import Path

from control.errors import PreconditionError, SpecError
from control.files import write_bytes_atomic
from runsc_hooks import spec as specmod

# Where the helper is in every GPU sandbox. The directory is mounted, not the
# file: the GPU smoke proved a directory bind across checkpoint/restore.
# Twin: bench/gpu/smoke.py HELPER_DEST.
# The helper as installed beside runsc (build/ or <node.install_dir>/bin);
# provision installs it under this name and thawd and the CLI stage it from there.
BINARY_NAME = "thaw-cuda-checkpoint"
HELPER_DIR = "/thaw/bin"
HELPER_NAME = "cuda-checkpoint"
HELPER_PATH = f"{HELPER_DIR}/{HELPER_NAME}"

# Exit codes of the helper. Twin: the EXIT_* enum in
# nvproxy/cuda_checkpoint/thaw-cuda-checkpoint.c (tests/unit/test_helper.py
# reads the C file and checks both agree).
EXIT_OK = 0
EXIT_DRIVER = 1       # the driver refused the operation; its CUresult name is on stderr
EXIT_USAGE = 2        # bad arguments
EXIT_NO_LIBCUDA = 3   # libcuda.so.1 could not be loaded
EXIT_NO_API = 4       # libcuda has no cuCheckpointProcess* (driver older than R555)
EXIT_STATE = 5        # the process is locked/failed: toggle moves only running or checkpointed

# What an operator does about each exit code.
EXIT_MEANING = {
    EXIT_OK: "ok",
    EXIT_DRIVER: "the NVIDIA driver refused the operation (its error name is on the helper's stderr); "
                 "a process stuck CHECKPOINTED after a failed restore needs `--action restore` then "
                 "`--action unlock` by hand",
    EXIT_USAGE: "bad arguments to the helper (runsc and thaw pass --get-state/--toggle --pid N)",
    EXIT_NO_LIBCUDA: "libcuda.so.1 is not visible inside the sandbox: mount the driver libraries "
                     "(CDI spec) into the container",
    EXIT_NO_API: "the driver has no CUDA checkpoint API: R555 or later is needed",
    EXIT_STATE: "the process is locked or failed; only running or checkpointed processes toggle",
}


# `--timing`: the helper prints one line to stderr with the seconds each of
# its steps took. Twin: took()/main() in thaw-cuda-checkpoint.c.
TIMING_FLAG = "--timing"
_TIMING_PREFIX = "thaw-cuda-checkpoint timing:"


def parse_timing(stderr: str) -> dict[str, float]:
    """The helper's `--timing` line as {step: seconds} (dlopen, cuInit,
    get-state, lock, checkpoint, restore, unlock, total); {} without one."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(_TIMING_PREFIX):
            out = {}
            for item in line[len(_TIMING_PREFIX):].split():
                k, sep, v = item.partition("=")
                if sep:
                    try:
                        out[k] = float(v)
                    except ValueError:
                        pass
            return out
    return {}


def explain(returncode: int) -> str:
    """One line an operator can act on, for a helper exit code."""
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return EXIT_MEANING.get(returncode, f"unknown exit code {returncode}")


def stage(binary: Path, directory: Path) -> Path:
    """Install `binary` as `directory/cuda-checkpoint` (mode 0755), atomically.

    `directory` is then the host side of the helper's bind mount.
    """
    binary = Path(binary)
    if not binary.is_file():
        raise PreconditionError(f"CUDA checkpoint helper not found at {binary}: run `make setup`",
                                path=str(binary))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(directory / HELPER_NAME, binary.read_bytes(), mode=0o755)
    return directory / HELPER_NAME


def bind_mount(host_dir: Path) -> dict:
    """The spec mount that puts `host_dir` (holding cuda-checkpoint) at HELPER_DIR, read-only."""
    host_dir = Path(host_dir)
    exe = host_dir / HELPER_NAME
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        raise PreconditionError(f"{exe} is not an executable CUDA checkpoint helper "
                                "(nvproxy.helper.stage puts one there)", path=str(exe))
    return specmod.bind_mount(str(host_dir), HELPER_DIR, readonly=True)


def add_to_spec(spec: dict, host_dir: Path) -> dict:
    """Mount the helper into `spec` (in place, and returned).

    An existing mount at HELPER_DIR is replaced (its source may differ at
    restore; the destination and options stay, as restore validation wants).
    A different mount at a path inside HELPER_DIR would hide nothing but is
    almost certainly a mistake, so it is refused.
    """
    mount = bind_mount(host_dir)
    mounts = spec.setdefault("mounts", [])
    for i, m in enumerate(mounts):
        dest = str(m.get("destination", "")).rstrip("/")
        if dest == HELPER_DIR:
            mounts[i] = mount
            return spec
        if dest.startswith(HELPER_DIR + "/"):
            raise SpecError(f"mounts[{i}].destination", f"{dest} is inside {HELPER_DIR}, "
                            "which thaw reserves for the CUDA checkpoint helper")
    mounts.append(mount)
    return spec
