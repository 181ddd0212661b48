"""bench/gpu's scripts as modules for the unit tier: they are scripts, not a package
(bench/gpu is on no import path), so each test file loads the ones it tests by path."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_bench_gpu(name: str):
    """bench/gpu/NAME.py, registered as bench_gpu_NAME (one module object per name, so
    a script that imports another by that name shares it)."""
    spec = importlib.util.spec_from_file_location(f"bench_gpu_{name}", REPO / "bench/gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
