"""Plumbing for the provisioning integration tests: the real `thaw` CLI in a
subprocess, against the real build (runsc, shim, containerd) in ./build."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BUILD, require

THAW = Path(sys.executable).parent / "thaw"


def thaw(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the thaw CLI with no THAW_* variables from the caller (hermetic) plus `env`."""
    require(THAW.is_file(), f"thaw console script at {THAW} (make setup)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    clean.update(env or {})
    return subprocess.run([str(THAW), *args], capture_output=True, text=True, env=clean,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def thaw_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    p = thaw(*args, "--json", env=env)
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        pytest.fail(f"thaw {' '.join(args)} printed no JSON (exit {p.returncode}):\n"
                    f"{p.stdout}\n{p.stderr}", pytrace=False)


@pytest.fixture
def build() -> Path:
    for b in ("runsc", "containerd-shim-runsc-v1", "containerd"):
        require(os.access(BUILD / b, os.X_OK), f"{b} built at {BUILD / b}")
    require(os.geteuid() == 0, "root")
    return BUILD


@pytest.fixture
def node_root(name: str) -> Path:
    """An empty directory tree to provision into, named from the test; removed before and after."""
    root = Path("/tmp") / f"thaw-{name}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)
