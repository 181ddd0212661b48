"""`thaw uninstall` (control/node/uninstall.py) on a temp tree after provision's
step engine wrote it, and containerd_config.undo_import, the edit's inverse."""
from __future__ import annotations

from pathlib import Path

import pytest

from control import config
from control.errors import PreconditionError, UserError
from control.node import containerd_config as cc
from control.node import provision as prov
from control.node import uninstall as un

CONFIG = Path("/etc/containerd/config.toml")
DROPIN = Path("/etc/containerd/conf.d")


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file and link (directories provision made above its own, such as
    /etc/systemd/system, exist on a node already and stay)."""
    return {str(p.relative_to(root)): f"-> {p.readlink()}" if p.is_symlink() else p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_symlink() or not p.is_dir()}


THAWS_DIRS = ("etc/containerd/conf.d", "etc/thaw", "opt/thaw", "var/lib/thaw", "var/log/thaw")


def _provision(root: Path, src: Path) -> config.Settings:
    settings = config.load(environ={}, default_file=root / "etc/thaw/config.toml")
    opts = prov.Options(source_dir=src, root=root, thaw_command=("/opt/thaw/venv/bin/thaw",))
    todo = prov.steps(settings, opts, gpu=False)
    plans: list[prov.Plan] = []
    for s in todo:
        plans.append(s.plan(plans))
    prov.apply(prov.Report([], plans, {}), todo)
    return settings


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "build"
    d.mkdir()
    for name, _ in prov.BINARIES:
        (d / name).write_bytes(f"#!/bin/sh\n# {name}\n".encode())
    return d


@pytest.mark.parametrize("original", [
    None,                                                       # provision writes the whole file
    'version = 3\n\n[debug]\n  level = "info"\n',               # no imports: a line is inserted
    'version = 2\nimports = ["/etc/other/*.toml"]\n',           # an imports that does not cover it
    'imports = [\n  "/etc/a/*.toml",\n]\nversion = 3\n',        # a multi-line imports, rewritten as one line
])
def test_uninstall_gives_back_the_tree_provision_found(tmp_path, src, original):
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    if original is not None:
        (root / "etc/containerd/config.toml").write_text(original)
    before = _snapshot(root)
    settings = _provision(root, src)
    assert (root / "etc/containerd/conf.d/thaw.toml").is_file() and (root / "opt/thaw/bin/runsc").is_file()
    plans = un.uninstall(settings, un.Options(root=root, purge=True))
    assert un.removed_anything(plans)
    assert _snapshot(root) == before, {p.step: (p.action, p.detail) for p in plans}
    assert [d for d in THAWS_DIRS if (root / d).exists()] == []
    # A second run has nothing left to do.
    again = un.uninstall(settings, un.Options(root=root, purge=True))
    assert not un.removed_anything(again)


def test_uninstall_keeps_config_state_and_logs_without_purge(tmp_path, src):
    root = tmp_path / "root"
    settings = _provision(root, src)
    un.uninstall(settings, un.Options(root=root))
    assert (root / "etc/thaw/config.toml").is_file()
    assert (root / "var/lib/thaw/cache").is_dir() and (root / "var/log/thaw").is_dir()
    assert not (root / "opt/thaw/bin").exists() and not (root / "etc/systemd/system/thawd.service").exists()
    assert not (root / "etc/containerd/config.toml").exists()   # provision wrote it: gone
    assert not (root / "etc/containerd/conf.d").exists()


def test_uninstall_refuses_while_sandboxes_are_on_the_node(tmp_path, src):
    root = tmp_path / "root"
    settings = _provision(root, src)
    ns = root / "run/containerd/runsc/k8s.io"
    ns.mkdir(parents=True)
    (ns / "web_sandbox:web.state").write_text("{}")
    with pytest.raises(PreconditionError, match=r"containerd container k8s.io/web.*--force"):
        un.uninstall(settings, un.Options(root=root))
    assert (root / "opt/thaw/bin/runsc").is_file()   # nothing was changed
    un.uninstall(settings, un.Options(root=root, force=True))
    assert not (root / "opt/thaw/bin/runsc").exists()


def test_dry_run_changes_nothing(tmp_path, src):
    root = tmp_path / "root"
    settings = _provision(root, src)
    before = _snapshot(root)
    plans = un.uninstall(settings, un.Options(root=root, dry_run=True))
    assert _snapshot(root) == before
    assert {p.step: p.action for p in plans}["containerd config"] == un.REMOVE


def test_undo_after_the_user_edited_the_config_takes_only_thaws_line_out():
    original = 'version = 3\n\n[debug]\n  level = "info"\n'
    edited = cc.ensure_import(original, CONFIG, DROPIN).text + '\n[metrics]\n  address = "127.0.0.1:1338"\n'
    undo = cc.undo_import(edited, CONFIG, DROPIN, backups=[(Path("config.toml.thaw-backup"), original)])
    assert undo.action == "write" and undo.backup is None     # the backup no longer matches
    assert undo.text == original + '\n[metrics]\n  address = "127.0.0.1:1338"\n'
    extended = cc.ensure_import('imports = ["/etc/a/*.toml"]\n', CONFIG, DROPIN).text + "# later\n"
    assert cc.undo_import(extended, CONFIG, DROPIN).text == 'imports = ["/etc/a/*.toml"]\n# later\n'


def test_undo_without_thaws_import_leaves_the_file_alone():
    assert cc.undo_import('version = 3\n', CONFIG, DROPIN).action == "none"
    assert cc.undo_import(None, CONFIG, DROPIN).action == "none"


def test_undo_refuses_an_import_it_did_not_mark():
    text = f'version = 3\nimports = ["{cc.import_pattern(DROPIN)}"]\n'   # the user's own line, no MARK
    with pytest.raises(UserError, match="by hand"):
        cc.undo_import(text, CONFIG, DROPIN)
