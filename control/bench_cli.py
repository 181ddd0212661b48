"""`thaw bench ...`: benchmarks that run on demand (results under bench/results).

A plain click group; each area adds its subcommand here. The benchmark code
lives in bench/<area>.py (outside the installed packages) and is loaded by path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import click

from control.cli import Context, handle_errors, json_option
from control.config import REPO_ROOT
from control.errors import PreconditionError


def load_bench(area: str) -> ModuleType:
    path = REPO_ROOT / "bench" / f"{area}.py"
    if not path.is_file():
        raise PreconditionError(f"benchmark {path} not found (benchmarks run from a source checkout)")
    spec = importlib.util.spec_from_file_location(f"thaw_bench_{area}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@click.group("bench")
def bench() -> None:
    """Run a benchmark and print its results."""


@bench.command("store")
@click.option("--image-gb", type=float, default=3.0, show_default=True, help="Size of the fetch benchmark image.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("/var/tmp/thaw-bench-store"),
              show_default=True, help="Scratch space (SeaweedFS data, images, caches); removed at the end.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the result JSON here (e.g. bench/results/store-<date>.json).")
@click.option("--reps", type=int, default=5, show_default=True, help="Alternating fetch runs (medians reported).")
@click.option("--sweep/--no-sweep", default=True, show_default=True,
              help="Also measure other chunk sizes (fetch at 1 MiB; dedup at 64 KiB..4 MiB).")
@json_option
@click.pass_obj
@handle_errors
def bench_store(obj: Context, image_gb: float, workdir: Path, out: Path | None, reps: int, sweep: bool) -> None:
    """Store benchmarks: fetch vs boto3 download_file and the disk, dedup across real checkpoints."""
    mod = load_bench("store")
    result = mod.run(obj.settings, image_bytes=int(image_gb * (1 << 30)), workdir=workdir, out=out,
                     reps=reps, sweep=sweep)
    obj.emit(result, mod.human)


COMMANDS = [bench]
