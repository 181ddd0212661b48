"""`thaw bench gpu`: the GPU restore benchmark of issue 6 (bench/gpu/models.py).

A standalone click command; the `bench` group (control/bench_cli.py) adds
every command in BENCH_COMMANDS. Options map one to one onto
bench/gpu/models.py's Options; the driver lives under bench/ (it is run from
the repo tree on the GPU machine) and is loaded from there.

Prints per model: cold_start_s, checkpoint_s, image_bytes, restore_s,
identical (and the target and whether it was met). Exit status 1 when any
model failed or answered differently after a restore.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import click

from control.cli import Context, handle_errors, json_option
from control.config import REPO_ROOT
from control.errors import NotFound, UserError

DRIVER = REPO_ROOT / "bench" / "gpu" / "models.py"
DEFAULT_HELPER = REPO_ROOT / "build" / "thaw-cuda-checkpoint"


def load_driver(path: Path = DRIVER) -> ModuleType:
    if not path.is_file():
        raise NotFound("benchmark driver", str(path), "run thaw from its repository tree")
    spec = importlib.util.spec_from_file_location("thaw_bench_gpu_models", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _human(rows: dict) -> str:
    head = f"{'model':<12} {'cold s':>8} {'ckpt s':>8} {'image GB':>9} {'restore s':>10} {'target':>7} {'identical':>9}"
    lines = [head]
    for m, r in rows.items():
        def num(v, fmt="{:.2f}"):
            return "-" if v is None else fmt.format(v)
        lines.append(f"{m:<12} {num(r['cold_start_s']):>8} {num(r['checkpoint_s']):>8} "
                     f"{num(r['image_bytes'] and r['image_bytes'] / 1e9):>9} {num(r['restore_s'], '{:.3f}'):>10} "
                     f"{num(r['target_s'], '{:.1f}'):>7} {str(r['identical']):>9}")
    return "\n".join(lines)


@click.command("gpu")
@click.option("--models", default="gpt2-large,llama-3b,llama-8b", show_default=True,
              help="Comma-separated: gpt2-large, llama-3b, llama-8b (tiny, tiny-llama for CPU tests).")
@click.option("--variants", default=None, help="Comma-separated restore variants (default: all).")
@click.option("--helper", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_HELPER,
              show_default=True, help="The CUDA checkpoint helper binary on this node.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("/var/tmp/thaw-bench-out"),
              show_default=True, help="Where models.json and the runsc logs go.")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=Path("/var/tmp/thaw-bench"),
              show_default=True, help="Weights, bundles and images (tens of GB for llama-8b).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--backend", type=click.Choice(["transformers", "fake"]), default="transformers", show_default=True)
@click.option("--channel", type=click.Choice(["file", "http"]), default="file", show_default=True,
              help="How the driver talks to the server: spool directory or HTTP over a veth.")
@click.option("--python", default="python3", show_default=True, help="Interpreter with torch + transformers.")
@click.option("--cdi/--no-cdi", default=True, show_default=True, help="GPUs through nvproxy.cdi.")
@click.option("--repeat", type=click.IntRange(1, 20), default=1, show_default=True)
@click.option("--budget-s", type=float, default=None, help="Start no new step after this many seconds.")
@click.option("--from-results", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Print the summary of an earlier models.json instead of running.")
@json_option
@click.pass_obj
@handle_errors
def gpu(obj: Context, models: str, variants: str | None, helper: Path, out: Path, work: Path, device: str,
        backend: str, channel: str, python: str, cdi: bool, repeat: int, budget_s: float | None,
        from_results: Path | None) -> None:
    """Cold start vs restore of GPU inference servers in runsc sandboxes (issue 6)."""
    driver = load_driver()
    if from_results is not None:
        try:
            result = json.loads(from_results.read_text())
        except ValueError as e:
            raise UserError(f"{from_results}: not a benchmark result ({e})") from None
    else:
        opts = driver.Options(
            runsc=obj.settings.runsc_path, out=out, work=work,
            models=[m for m in models.split(",") if m],
            variants=[v for v in variants.split(",") if v] if variants else list(driver.DEFAULT_VARIANTS),
            helper=helper if device == "cuda" else None, device=device, backend=backend, channel=channel,
            python=python, cdi=cdi, repeat=repeat, budget_s=budget_s)
        try:
            result = driver.run(opts)
        except SystemExit as e:      # the driver's own argument checks
            raise UserError(str(e.code)) from None
    rows = driver.headline(result)
    obj.emit(rows, _human)
    failed = [m for m, r in result.get("models", {}).items() if r.get("errors") or not r.get("identical")]
    if failed:
        click.echo(f"thaw: bench gpu: failed or not identical: {', '.join(failed)}", err=True)
        raise click.exceptions.Exit(1)


BENCH_COMMANDS = [gpu]
