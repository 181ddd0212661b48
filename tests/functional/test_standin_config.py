"""The Go stand-in reads the keys it shares with thawd exactly as control/config.py
does: same file, same env, same precedence, same defaults and ranges. The
built thaw-runsc-hooks prints its view (`thaw-runsc-hooks thaw-config`) and
it is compared with config.load() of the same file and environment."""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from control import config
from control.errors import ConfigError
from control.node import provision

from tests.conftest import BUILD

HOOKS = BUILD / "thaw-runsc-hooks"
STANDIN_KEYS = [k for k in config.KEYS if k.standin]


def go_view(env: dict[str, str], cwd: Path | None = None) -> tuple[int, dict]:
    # Never the checkout as working directory: a binary that opened a refused
    # relative path (a stale build did: relative/path in the repo) writes there.
    assert HOOKS.is_file(), f"{HOOKS} is not built: run `make setup`"
    with tempfile.TemporaryDirectory(prefix="go-view-") as tmp:
        p = subprocess.run([str(HOOKS), "thaw-config"], capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin", **env}, cwd=cwd or tmp)
    return p.returncode, json.loads(p.stdout)


def python_view(env: dict[str, str]) -> dict:
    s = config.load(environ=env)
    return {k.name: config.json_value(getattr(s, k.field)) for k in STANDIN_KEYS}


def same(env: dict[str, str]) -> dict:
    rc, go = go_view(env)
    assert rc == 0, go
    assert go["keys"] == python_view(env)
    return go


def test_the_stand_in_reads_the_keys_declared_for_it():
    _, go = go_view({"THAW_CONFIG": "/dev/null"})
    assert sorted(go["keys"]) == sorted(k.name for k in STANDIN_KEYS)
    assert {"thawd.socket", "thawd.prepare_timeout_s", "standin.state_dir", "standin.log"} <= set(go["keys"])


def test_defaults_agree(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    go = same({"THAW_CONFIG": str(empty)})
    assert go["keys"]["thawd.socket"] == "/run/thaw/thawd.sock"
    assert go["file"] == str(empty)
    # create's deadline: thawd's wait plus the stand-in's slack (go/internal/standin prepareSlack, 1 s).
    assert go["prepare_deadline_s"] == config.key("thawd.prepare_timeout_s").default + 1
    # Without THAW_REAL_RUNSC the stand-in runs the runsc beside it: the build's, runsc.path's default.
    assert go["real_runsc"] == str(BUILD / "runsc")


def test_file_values_agree(tmp_path):
    f = tmp_path / "node.toml"
    f.write_text('[thawd]\nsocket = "/srv/thaw/d.sock"\nprepare_timeout_s = 2\nhealth_timeout_s = "12.5"\n'
                 'metrics_addr = ""\n[standin]\nstate_dir = "/srv/thaw/standin"\nlog = "/srv/log/standin.log"\n'
                 '[store]\nbucket = "b"\n')
    go = same({"THAW_CONFIG": str(f)})
    assert go["keys"]["thawd.socket"] == "/srv/thaw/d.sock"
    assert go["prepare_deadline_s"] == 3.0


def test_env_beats_file_in_both(tmp_path):
    f = tmp_path / "node.toml"
    f.write_text('[thawd]\nsocket = "/file/d.sock"\nprepare_timeout_s = 2\n')
    go = same({"THAW_CONFIG": str(f), "THAW_THAWD_SOCKET": "/env/d.sock", "THAW_THAWD_PREPARE_TIMEOUT_S": "7",
               "THAW_STANDIN_LOG": "/env/standin.log"})
    assert go["keys"]["thawd.socket"] == "/env/d.sock" and go["keys"]["thawd.prepare_timeout_s"] == 7


def test_a_provisioned_node_with_another_socket(tmp_path):
    """The issue this fixes: provision seeds a changed thawd.socket into the
    node's config file, and the stand-in (run by containerd with none of
    provision's environment) must dial that socket, not its own default."""
    s = config.load(environ={"THAW_THAWD_SOCKET": "/run/thaw-b/thawd.sock", "THAW_STANDIN_STATE_DIR": "/run/b"},
                    config_file=Path("/dev/null"))
    seeded = tmp_path / "config.toml"
    seeded.write_text(provision.seed_config(s))
    go = same({"THAW_CONFIG": str(seeded)})
    assert go["keys"]["thawd.socket"] == "/run/thaw-b/thawd.sock"
    assert go["keys"]["standin.state_dir"] == "/run/b"


BAD = []
for _k in STANDIN_KEYS:
    if _k.range:
        BAD += [(_k, str(_k.range[0] - 1)), (_k, str(_k.range[1] + 1)), (_k, "soon")]
    else:
        BAD += [(_k, "relative/path"), (_k, "")]


@pytest.mark.parametrize("k, raw", BAD, ids=[f"{k.name}={raw!r}" for k, raw in BAD])
@pytest.mark.parametrize("where", ["env", "file"])
def test_both_refuse_the_same_bad_values_naming_key_and_source(tmp_path, k, raw, where):
    f = tmp_path / "node.toml"
    env = {"THAW_CONFIG": str(f)}
    if where == "env":
        f.write_text("")
        env[k.env] = raw
        source = f"(from env {k.env})"
    else:
        sec, name = k.name.split(".", 1)
        f.write_text(f"[{sec}]\n{name} = {json.dumps(raw)}\n")
        source = f"(from file {f})"
    with pytest.raises(ConfigError) as e:
        config.load(environ=env)
    assert e.value.key == k.name and source in str(e.value)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    rc, go = go_view(env, cwd)
    assert rc == 78, go
    assert not list(cwd.iterdir()), "the refused value was opened anyway"
    assert go["error"].startswith(f"config {k.name}: ") and source in go["error"], go["error"]
    # The stand-in keeps going on the default (and starts containers cold, standin.go create).
    default = config.json_value(k.default)
    assert go["keys"][k.name] == default


def test_missing_config_file_is_an_error_in_both(tmp_path):
    env = {"THAW_CONFIG": str(tmp_path / "absent.toml")}
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(environ=env)
    rc, go = go_view(env)
    assert rc == 78 and "does not exist" in go["error"]


def test_unknown_names_are_refused_by_thaw_and_ignored_by_the_stand_in_in_file_and_env(tmp_path):
    """Each treats a THAW_* variable that names no key as it treats an unknown key in
    the file (issue 33): thaw refuses both (ConfigError naming it); the stand-in reads
    only its own keys and ignores both, since refusing would start every container cold."""
    f = tmp_path / "c.toml"
    f.write_text("[thawd]\nsockett = \"/x.sock\"\n")
    with pytest.raises(ConfigError, match=r"config thawd.sockett: unknown key in .*c.toml"):
        config.load(environ={"THAW_CONFIG": str(f)})
    rc, go = go_view({"THAW_CONFIG": str(f)})
    assert rc == 0 and "error" not in go, go
    f.write_text("")
    env = {"THAW_CONFIG": str(f), "THAW_SOCKET": "/old/name.sock", "THAW_STANDIN_STATE": "/old"}
    with pytest.raises(ConfigError, match="config THAW_SOCKET: unknown key in env THAW_SOCKET"):
        config.load(environ=env)
    rc, go = go_view(env)
    assert rc == 0 and "error" not in go, go
    assert go["keys"] == python_view({"THAW_CONFIG": str(f)})

