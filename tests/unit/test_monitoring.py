"""deploy/prometheus (alert rules) and deploy/grafana (dashboard): they name only
series control/metrics.py declares, and the rules do what their tests say under
the real promtool (`promtool check rules`, `promtool test rules`)."""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml

from control import metrics
from tests.conftest import BUILD, REPO

RULES = REPO / "deploy" / "prometheus" / "thaw-rules.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "thaw-rules.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "thaw-dashboard.json"
PROMTOOL_VERSION = "v0.316.0"   # twin: ci/build-promtool.sh PROMTOOL_VERSION
_SUFFIXES = ("_bucket", "_sum", "_count")


def series_in(expr: str) -> set[str]:
    out = set()
    for name in re.findall(r"\bthaw_[a-z0-9_]+", expr):
        for suf in _SUFFIXES:
            if name.endswith(suf) and name[:-len(suf)] in metrics.HELP:
                name = name[:-len(suf)]
        out.add(name)
    return out


def test_the_rules_and_the_dashboard_name_only_declared_series():
    rules = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dash = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = set().union(*map(series_in, exprs))
    assert used - set(metrics.HELP) == set()
    # What the issue asks alerts for: restores falling back cold, quarantines, store errors, cache full.
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"ThawRestoresFallingBackCold", "ThawImageQuarantined", "ThawStoreErrors", "ThawCacheFull"} <= names
    # The dashboard shows every counter and gauge an operator acts on.
    assert {"thaw_fallbacks_total", "thaw_cold_decisions_total", "thaw_restore_seconds", "thaw_cache_used_bytes",
            "thaw_store_errors_total", "thaw_parked_sandboxes", "thaw_build_info"} <= used


def test_the_dashboard_is_grafana_json_with_unique_ids_and_a_datasource_variable():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"]
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "instance"}
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["targets"] and all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), p["title"]


@pytest.fixture(scope="module")
def promtool():
    """build/promtool, which `make setup` builds (ci/setup.sh runs ci/build-promtool.sh):
    missing or of another version, the test fails and says so; it never builds it (the
    first build takes minutes on a 2-core machine, no unit test's business)."""
    script = (REPO / "ci" / "build-promtool.sh").read_text()
    assert f"PROMTOOL_VERSION={PROMTOOL_VERSION}" in script
    assert "bash ci/build-promtool.sh" in (REPO / "ci" / "setup.sh").read_text()
    p = BUILD / "promtool"
    assert p.is_file() and os.access(p, os.X_OK), f"{p} is missing: run `make setup` (ci/build-promtool.sh)"
    # `go install` stamps the module version in the binary's build info.
    info = subprocess.run(["go", "version", "-m", str(p)], capture_output=True, text=True, timeout=60)
    assert f"github.com/prometheus/prometheus\t{PROMTOOL_VERSION}" in info.stdout, (
        f"{p} is not promtool {PROMTOOL_VERSION}: run `make setup` (ci/build-promtool.sh)\n{info.stdout[:500]}")
    return p


def test_promtool_checks_the_rules_and_their_tests_pass(promtool):
    check = subprocess.run([str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([str(promtool), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                          timeout=120, cwd=RULE_TESTS.parent)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout + test.stderr


def test_promtool_fails_a_rule_test_whose_expectation_is_wrong(promtool, tmp_path):
    """The rule tests can fail: the same file expecting the fallback alert on the good node fails."""
    (tmp_path / "thaw-rules.yaml").write_text(RULES.read_text())
    bad = RULE_TESTS.read_text().replace("exp_labels: {severity: warning, instance: bad}",
                                         "exp_labels: {severity: warning, instance: good}", 1)
    assert bad != RULE_TESTS.read_text()
    (tmp_path / "t.yaml").write_text(bad)
    test = subprocess.run([str(promtool), "test", "rules", "t.yaml"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert test.returncode != 0
