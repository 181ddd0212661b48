"""One version source (control/version.py): every other place that names thaw's
version derives it from there, or is a checked copy of it (issue 31)."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import yaml
from click.testing import CliRunner

from control import version
from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_wheel_reads_its_version_and_name_from_control_version():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "control.version.VERSION"}
    assert project["name"] == version.DISTRIBUTION
    assert project["scripts"] == {"thaw": "control.cli.main:main"}   # the command stays `thaw`


def test_the_installed_metadata_is_this_version():
    """The editable install `make setup` made: stale after a version change until
    `make setup` runs again (its virtualenv stamp covers control/version.py)."""
    from importlib.metadata import version as installed
    assert installed(version.DISTRIBUTION) == version.VERSION
    assert "control/version.py" in (REPO / "ci/setup.sh").read_text()


def test_version_py_prints_the_version_for_the_shell_scripts():
    out = subprocess.run([sys.executable, str(REPO / "control/version.py")], capture_output=True, text=True,
                         check=True).stdout
    assert out == version.VERSION + "\n"
    for script in ("ci/build-go.sh", "ci/build-image.sh", "ci/release.sh"):
        assert "control/version.py" in (REPO / script).read_text(), script


def test_thawd_and_manifests_report_this_version():
    from control.images import chunk
    from control.thawd import server
    assert server.VERSION is version.VERSION
    assert chunk._thaw_version() == version.VERSION


def test_the_go_commands_are_stamped_with_it():
    text = (REPO / "ci/build-go.sh").read_text()
    assert 'thaw_version=$(python3 "$here/control/version.py")' in text
    assert "-X thaw.dev/thaw/go/internal/version.Version=$thaw_version" in text
    go = (REPO / "go/internal/version/version.go").read_text()
    assert 'var Version = "unknown"' in go


def test_every_image_reference_in_deploy_is_this_versions_image():
    """The manifests and the chart are YAML, not generated: they are copies,
    checked here (and again by ci/release.sh)."""
    refs = set()
    for f in sorted((REPO / "deploy").rglob("*")):
        if f.is_file() and f.suffix in (".yaml", ".yml", ".tpl", "") and f.name != "install.sh":
            refs |= set(re.findall(r"ghcr\.io/thaw-dev/thaw:([^\s\"']+)", f.read_text(errors="replace")))
    assert refs == {version.VERSION}, refs
    assert "thaw:0." not in (REPO / "deploy/Containerfile").read_text()   # derives its tag, names none


def test_the_helm_chart_names_this_version_once_there_is_one():
    chart = REPO / "deploy/helm/thaw/Chart.yaml"
    if not chart.exists():
        assert "deploy/helm/thaw" in (REPO / "ci/release.sh").read_text()   # the place kept for it (issue 29)
        return
    doc = yaml.safe_load(chart.read_text())
    assert str(doc["appVersion"]) == version.VERSION and str(doc["version"]) == version.VERSION


def test_no_other_file_writes_the_version_down():
    """A grep for the version string outside control/version.py, the manifests
    (checked above) and dated records."""
    hits = subprocess.run(["git", "grep", "-n", "-F", f'"{version.VERSION}"', "--", ".", ":!bench/results",
                           ":!go/go.sum", ":!go/go.mod", ":!control/version.py", ":!docs/notes"],
                          cwd=REPO, capture_output=True, text=True).stdout.splitlines()
    assert hits == []


def test_thaw_version_prints_version_pin_and_tuple_line(tmp_path, monkeypatch):
    from control.cli.main import main, version_lines
    from control import config
    r = CliRunner().invoke(main, ["--version"])
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert lines[0] == f"thaw {version.VERSION} ({version.DISTRIBUTION})"
    assert lines[1] == f"runsc pin: {config.RUNSC_VERSION_LABEL}"
    assert lines[2].startswith("compatibility tuple: ")
    # Where it cannot be computed, the line says why; the version is still printed.
    missing = version_lines(lambda: config.load(overrides={"runsc.path": str(tmp_path / "none")}, environ={}))
    assert missing[2] == f"compatibility tuple: not computed on this node: no runsc at {tmp_path / 'none'} (runsc.path)"
    bad = version_lines(lambda: config.load(environ={"THAW_RUNSC_TIMEOUT_S": "0"}))
    assert bad[0].startswith("thaw ") and "config runsc.timeout_s" in bad[2]


def test_thaw_version_hash_is_the_tuple_thawd_publishes_under(tmp_path):
    """With a runsc that answers, the hash is compat.node_tuple's (what doctor prints and thawd serves)."""
    from control import config
    from control.cli.main import version_lines
    from control.node import compat
    from nvproxy.gpu import NodeGpus
    fake = tmp_path / "runsc"
    fake.write_text("#!/bin/sh\ncase \"$*\" in *--version*) echo \"runsc version thaw-gvisor-160fafc42237\";;"
                    " *cpu-features*) echo sse4_2,avx2;; esac\n")
    fake.chmod(0o755)
    s = config.load(overrides={"runsc.path": str(fake), "node.gpu": "no"}, environ={})
    import nvproxy.gpu
    orig = nvproxy.gpu.probe
    nvproxy.gpu.probe = lambda *a, **k: NodeGpus()
    try:
        lines = version_lines(lambda: s)
        want = compat.node_tuple(s).hash()
    finally:
        nvproxy.gpu.probe = orig
    assert lines[2] == f"compatibility tuple: {want} (runsc {fake})"


def test_the_daemonset_yaml_parses_with_the_image():
    docs = list(yaml.safe_load_all((REPO / "deploy/kubernetes/40-daemonset.yaml").read_text()))
    pod = docs[0]["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {version.image_ref()}


def test_release_directory_is_named_after_the_version():
    text = (REPO / "ci/release.sh").read_text()
    assert "name=thaw-$version" in text and "version=$(python3 control/version.py)" in text
    assert "release: setup\n\t@bash ci/release.sh\n" in (REPO / "Makefile").read_text()
