"""`thaw bench gpu` (control/gpu_bench_cli.py), with the driver's run() replaced."""
from __future__ import annotations

import importlib
import json
import sys
import types

from click.testing import CliRunner

try:   # control.cli lists control.sandbox_cli, which lands from another branch.
    importlib.import_module("control.sandbox_cli")
except ImportError:
    sys.modules["control.sandbox_cli"] = types.SimpleNamespace(COMMANDS=[])

from control import gpu_bench_cli  # noqa: E402
from control.cli import Context  # noqa: E402

ROW = {"cold_start_s": 18.2, "checkpoint_s": 2.1, "image_bytes": 2_500_000_000, "restore_s": 0.93,
       "identical": True, "target_s": 1.0, "met_target": True, "errors": []}


def invoke(args, json_out=True, runsc="/opt/runsc"):
    ctx = Context({"runsc.path": runsc}, json_out, 0)
    return CliRunner().invoke(gpu_bench_cli.gpu, args, obj=ctx)


def test_from_results_prints_the_five_fields(tmp_path):
    f = tmp_path / "models.json"
    f.write_text(json.dumps({"models": {"gpt2-large": ROW}}))
    r = invoke(["--from-results", str(f)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"gpt2-large": {k: ROW[k] for k in (
        "cold_start_s", "checkpoint_s", "image_bytes", "restore_s", "identical", "target_s", "met_target")}}


def test_human_table_and_failure_exit(tmp_path):
    f = tmp_path / "models.json"
    f.write_text(json.dumps({"models": {"gpt2-large": ROW, "llama-8b": dict(ROW, identical=False, restore_s=None)}}))
    r = invoke(["--from-results", str(f)], json_out=False)
    assert r.exit_code == 1
    assert "gpt2-large" in r.output and "0.930" in r.output and "2.50" in r.output
    assert "failed or not identical: llama-8b" in r.output


def test_options_reach_the_driver(monkeypatch, tmp_path):
    driver = gpu_bench_cli.load_driver()
    seen = {}

    def fake_run(opts):
        seen["opts"] = opts
        opts.validate()
        return {"models": {"tiny": dict(ROW, target_s=None, met_target=None)}}

    monkeypatch.setattr(driver, "run", fake_run)
    monkeypatch.setattr(gpu_bench_cli, "load_driver", lambda: driver)
    r = invoke(["--models", "tiny", "--device", "cpu", "--backend", "fake", "--out", str(tmp_path / "o"),
                "--work", str(tmp_path / "w"), "--budget-s", "100", "--no-cdi"])
    assert r.exit_code == 0, r.output
    o = seen["opts"]
    assert (str(o.runsc), o.models, o.device, o.backend, o.helper, o.cdi, o.budget_s) == (
        "/opt/runsc", ["tiny"], "cpu", "fake", None, False, 100.0)
    assert o.variants == list(driver.DEFAULT_VARIANTS)
    assert json.loads(r.output)["tiny"]["restore_s"] == 0.93


def test_bad_model_is_a_user_error(monkeypatch):
    driver = gpu_bench_cli.load_driver()
    monkeypatch.setattr(driver, "run", lambda opts: opts.validate())
    monkeypatch.setattr(gpu_bench_cli, "load_driver", lambda: driver)
    r = invoke(["--models", "gpt5", "--device", "cpu"])
    assert r.exit_code == 2
    assert "unknown model" in r.output


def test_exported_for_the_bench_group():
    assert gpu_bench_cli.BENCH_COMMANDS == [gpu_bench_cli.gpu]
    assert gpu_bench_cli.gpu.name == "gpu"
