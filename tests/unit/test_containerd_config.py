"""control.node.containerd_config: generated TOML and the one-line imports edit."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from control import config
from control.node import containerd_config as cc
from control.errors import ConfigError, UserError

MAIN = Path("/etc/containerd/config.toml")
DROPINS = Path("/etc/containerd/conf.d")


def settings(tmp_path: Path, **env: str) -> config.Settings:
    return config.load(environ=env, default_file=tmp_path / "absent")


# -- runsc.toml ------------------------------------------------------------------

def test_runsc_toml_keys_are_the_shims(tmp_path):
    text = cc.runsc_toml(settings(tmp_path), Path("/opt/thaw/bin/thaw-runsc"))
    data = tomllib.loads(text)
    # gvisor pkg/shim/v1/runsc/options.go Options toml tags.
    assert data == {
        "binary_name": "/opt/thaw/bin/thaw-runsc",
        "root": "/run/containerd/runsc",
        "log_path": "/var/log/thaw/shim/",
        "runsc_config": {"platform": "systrap"},
    }


def test_runsc_toml_gpu_and_flags(tmp_path):
    s = settings(tmp_path, THAW_RUNSC_FLAGS="--net-raw --overlay2=none -debug",
                 THAW_RUNSC_PLATFORM="kvm", THAW_NODE_LOG_DIR="/logs")
    data = tomllib.loads(cc.runsc_toml(s, Path("/x/runsc"), gpu=True, root=Path("/r"), log_level="debug"))
    assert data["runsc_config"] == {"platform": "kvm", "nvproxy": "true", "net-raw": "true",
                                    "overlay2": "none", "debug": "true"}
    assert data["root"] == "/r"
    assert data["log_path"] == "/logs/shim/"
    assert data["log_level"] == "debug"


@pytest.mark.parametrize("flags", ["--root=/x", "--log=/tmp/l", "not-a-flag", "--Bad=1"])
def test_runsc_flags_rejected(tmp_path, flags):
    with pytest.raises(ConfigError) as e:
        cc.runsc_config_flags(settings(tmp_path, THAW_RUNSC_FLAGS=flags), gpu=False)
    assert e.value.key == "runsc.flags"


def test_strings_are_escaped(tmp_path):
    text = cc.runsc_toml(settings(tmp_path), Path('/odd "dir"\\with\ttab/runsc'))
    assert tomllib.loads(text)["binary_name"] == '/odd "dir"\\with\ttab/runsc'


# -- the drop-in -------------------------------------------------------------------

def test_dropin_structure():
    text = cc.containerd_dropin("runsc-thaw", Path("/opt/thaw/bin/containerd-shim-runsc-v1"),
                                Path("/etc/thaw/runsc.toml"))
    data = tomllib.loads(text)
    assert data["version"] == 3
    assert cc.runtimes_in(data) == {"runsc-thaw": {
        "runtime_type": "io.containerd.runsc.v1",
        "runtime_path": "/opt/thaw/bin/containerd-shim-runsc-v1",
        "pod_annotations": ["thaw.dev/*", "dev.gvisor.*"],
        "options": {"TypeUrl": "io.containerd.runsc.v1.options", "ConfigPath": "/etc/thaw/runsc.toml"},
    }}
    assert set(data) == {"version", "plugins"}      # nothing but the handler


def test_dropin_without_shim_path_relies_on_path():
    data = tomllib.loads(cc.containerd_dropin("h", None, Path("/r.toml")))
    assert "runtime_path" not in cc.runtimes_in(data)["h"]


def test_private_containerd_config():
    text = cc.private_containerd_config(Path("/t/root"), Path("/t/state"), Path("/t/c.sock"),
                                        handler="runsc-thaw", shim_path=Path("/b/shim"),
                                        runsc_toml_path=Path("/t/runsc.toml"),
                                        disabled_plugins=["io.containerd.snapshotter.v1.btrfs"])
    data = tomllib.loads(text)
    assert data["root"] == "/t/root" and data["state"] == "/t/state"
    assert data["imports"] == []
    assert data["grpc"]["address"] == "/t/c.sock"
    assert data["ttrpc"]["address"] == "/t/c.sock.ttrpc"
    assert data["disabled_plugins"] == ["io.containerd.snapshotter.v1.btrfs"]
    assert cc.runtimes_in(data)["runsc-thaw"]["options"]["ConfigPath"] == "/t/runsc.toml"
    with pytest.raises(UserError):
        cc.private_containerd_config(Path("/r"), Path("/s"), Path("/c"), handler="h")


# -- imports -------------------------------------------------------------------------

@pytest.mark.parametrize("imports, covered", [
    (["/etc/containerd/conf.d/*.toml"], True),
    (["conf.d/*.toml"], True),                           # relative to the main config's directory
    (["./conf.d/../conf.d/*.toml"], True),
    (["/etc/containerd/conf.d/thaw.toml"], True),        # literal
    (["/etc/containerd/conf.d/*"], True),
    (["/etc/containerd/*.toml"], False),                 # '*' does not cross '/'
    (["/etc/containerd/conf.d/*.conf"], False),
    (["/etc/containerd/other.d/*.toml"], False),
    ([], False),
])
def test_imports_cover(imports, covered):
    assert cc.imports_cover(imports, MAIN, DROPINS / "thaw.toml") is covered


def test_no_main_config_gets_a_minimal_one():
    edit = cc.ensure_import(None, MAIN, DROPINS)
    data = tomllib.loads(edit.text)
    assert data == {"version": 3, "imports": ["/etc/containerd/conf.d/*.toml"]}


USER_CONFIG = '''# my containerd
version = 3
root = "/var/lib/containerd"

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    SystemdCgroup = true
'''


def _added(before: str, after: str) -> list[str]:
    """Lines of `after` not in `before`, asserting nothing of `before` was lost or reordered."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    extra = [line for line in b if line not in a]
    assert [line for line in b if line in a] == a
    return extra


def test_missing_imports_adds_one_line_after_version():
    edit = cc.ensure_import(USER_CONFIG, MAIN, DROPINS)
    assert _added(USER_CONFIG, edit.text) == [
        'imports = ["/etc/containerd/conf.d/*.toml"]  # added by thaw provision\n']
    assert edit.text.splitlines()[2].startswith("imports = ")     # right after `version = 3`
    assert tomllib.loads(edit.text) == dict(tomllib.loads(USER_CONFIG), imports=["/etc/containerd/conf.d/*.toml"])


def test_missing_imports_without_version_goes_first():
    text = '[plugins."io.containerd.grpc.v1.cri"]\n  x = 1\n'
    edit = cc.ensure_import(text, MAIN, DROPINS)
    assert edit.text == 'imports = ["/etc/containerd/conf.d/*.toml"]  # added by thaw provision\n' + text


def test_version_inside_a_table_is_not_used():
    text = '[plugins.foo]\nversion = 2\n'
    edit = cc.ensure_import(text, MAIN, DROPINS)
    assert tomllib.loads(edit.text)["imports"] == ["/etc/containerd/conf.d/*.toml"]
    assert tomllib.loads(edit.text)["plugins"] == {"foo": {"version": 2}}


def test_file_without_trailing_newline():
    text = 'version = 2'
    edit = cc.ensure_import(text, MAIN, DROPINS)
    assert tomllib.loads(edit.text) == {"version": 2, "imports": ["/etc/containerd/conf.d/*.toml"]}


def test_imports_not_covering_are_extended_in_place():
    text = USER_CONFIG.replace('root = "/var/lib/containerd"\n',
                               'imports = ["/etc/containerd/extra.toml"]\nroot = "/var/lib/containerd"\n')
    edit = cc.ensure_import(text, MAIN, DROPINS)
    before, after = text.splitlines(), edit.text.splitlines()
    assert len(before) == len(after)
    changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert changed == [('imports = ["/etc/containerd/extra.toml"]',
                        'imports = ["/etc/containerd/extra.toml", "/etc/containerd/conf.d/*.toml"]'
                        '  # added by thaw provision')]


def test_multiline_imports_become_one_line():
    text = 'version = 3\nimports = [\n  "/a.toml",  # first\n  "/b.toml",\n]\nroot = "/r"\n'
    edit = cc.ensure_import(text, MAIN, DROPINS)
    assert edit.text == ('version = 3\nimports = ["/a.toml", "/b.toml", "/etc/containerd/conf.d/*.toml"]'
                         '  # added by thaw provision\nroot = "/r"\n')


def test_covered_imports_leave_the_file_alone():
    text = USER_CONFIG.replace("version = 3\n", 'version = 3\nimports = ["conf.d/*.toml"]\n')
    edit = cc.ensure_import(text, MAIN, DROPINS)
    assert edit.text is None


def test_invalid_toml_is_not_touched():
    with pytest.raises(UserError, match="not valid TOML"):
        cc.ensure_import("version = \n[[", MAIN, DROPINS)


def test_imports_of_wrong_type_is_refused():
    with pytest.raises(UserError, match="not a list of strings"):
        cc.ensure_import('imports = "conf.d/*.toml"\n', MAIN, DROPINS)
