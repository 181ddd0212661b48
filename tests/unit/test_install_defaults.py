"""The binary keys' defaults follow where thaw runs from (control/config.py
Install): a checkout's build/, a release install's <prefix>/bin, else /opt/thaw/bin."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from control import config
from control.errors import ConfigError
from tests.conftest import REPO

BINARY_KEYS = ("runsc.path", "pack.chunker", "store.fetcher", "store.gofer", "containerd.info")


def test_a_checkout_uses_its_build_directory(tmp_path):
    i = config.install_of(REPO, str(tmp_path / "venv"))
    assert i == config.Install("checkout", Path("/opt/thaw"), REPO / "build", REPO / "build")
    assert config.INSTALL.kind == "checkout"   # these tests run from one
    for name in BINARY_KEYS:
        assert config.key(name).default.parent == REPO / "build", name


def test_a_release_install_uses_its_prefix(tmp_path):
    site = tmp_path / "site-packages"          # an installed wheel: no go/go.mod beside control/
    site.mkdir()
    venv = tmp_path / "srv/thaw/releases/9.9.9/venv"
    venv.mkdir(parents=True)
    (venv / config.RELEASE_MARKER).write_text(json.dumps({"prefix": "/srv/thaw", "version": "9.9.9"}))
    i = config.install_of(site, str(venv))
    assert i.kind == "release" and i.prefix == Path("/srv/thaw") and i.bin_dir == Path("/srv/thaw/bin")
    assert i.source_bin == tmp_path / "srv/thaw/releases/9.9.9/bin"


def test_anything_else_names_opt_thaw_and_has_no_provision_source(tmp_path):
    i = config.install_of(tmp_path, "/usr")
    assert i == config.Install("other", Path("/opt/thaw"), Path("/opt/thaw/bin"), None)


def test_an_unreadable_marker_is_a_config_error_naming_it(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / config.RELEASE_MARKER).write_text("{not json")
    i = config.install_of(tmp_path, str(venv))
    assert i.kind == "other" and str(venv / config.RELEASE_MARKER) in i.error
    monkeypatch.setattr(config, "INSTALL", i)
    with pytest.raises(ConfigError, match="node.install_dir: .*thaw-release.json"):
        config.load(environ={}, default_file=tmp_path / "absent")


def test_the_docs_table_shows_bin_not_this_checkouts_path():
    table = config.markdown_table()
    assert "`<bin>/runsc`" in table and str(REPO) not in table
    assert '| `node.install_dir` | `THAW_NODE_INSTALL_DIR` | absolute path | `"/opt/thaw"` |' in table


def test_the_install_marker_name_has_its_twin_in_install_sh():
    text = (REPO / "deploy/install.sh").read_text()
    assert f"RELEASE_MARKER={config.RELEASE_MARKER}" in text
    from control.version import DISTRIBUTION
    assert f"DISTRIBUTION={DISTRIBUTION}" in text
