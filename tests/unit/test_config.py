"""control.config: precedence and validation; every error names its key."""
from __future__ import annotations

from pathlib import Path

import pytest

from control import config
from control.errors import ConfigError


def load(tmp_path: Path, toml: str | None = None, env: dict | None = None, overrides: dict | None = None):
    f = None
    if toml is not None:
        f = tmp_path / "config.toml"
        f.write_text(toml)
    return config.load(overrides, environ=env or {}, config_file=f, default_file=tmp_path / "absent.toml")


def test_defaults_without_file_or_env(tmp_path):
    s = load(tmp_path)
    assert s.runtime_handler == "runsc-thaw"
    assert s.install_dir == Path("/opt/thaw")
    assert s.containerd_runsc_root == Path("/run/containerd/runsc")
    assert s.cache_budget_bytes == 100 << 30


def test_precedence_cli_over_env_over_file(tmp_path):
    toml = '[store]\nbucket = "from-file"\nregion = "file-region"\n[node]\nmachine_type = "file"\n'
    env = {"THAW_STORE_BUCKET": "from-env", "THAW_NODE_MACHINE_TYPE": "env"}
    s = load(tmp_path, toml, env, {"store.bucket": "from-cli", "node.machine_type": None})
    assert s.store_bucket == "from-cli"      # CLI beats env and file
    assert s.machine_type == "env"           # None override is ignored; env beats file
    assert s.store_region == "file-region"   # file beats default


def test_default_file_is_read_when_present(tmp_path):
    (tmp_path / "etc.toml").write_text('[node]\ngpu = "no"\n')
    s = config.load(environ={}, default_file=tmp_path / "etc.toml")
    assert s.gpu == "no"


def test_thaw_config_env_names_the_file(tmp_path):
    (tmp_path / "c.toml").write_text('[node]\ngpu = "yes"\n')
    s = config.load(environ={"THAW_CONFIG": str(tmp_path / "c.toml")}, default_file=tmp_path / "absent")
    assert s.gpu == "yes"


def test_sizes_accept_suffixes(tmp_path):
    s = load(tmp_path, '[cache]\nbudget_bytes = "1.5g"\nmin_free_bytes = 1024\n')
    assert s.cache_budget_bytes == int(1.5 * (1 << 30))
    assert s.cache_min_free_bytes == 1024


@pytest.mark.parametrize("toml, key", [
    ('[cache]\nbudget = "1g"\n', "cache.budget"),           # unknown key in a known section
    ('[nosuch]\nthing = 1\n', "nosuch.thing"),               # unknown section
    ('top = 1\n', "top"),                                     # not inside a table
])
def test_unknown_key_in_file(tmp_path, toml, key):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, toml)
    assert e.value.key == key
    assert key in str(e.value)


@pytest.mark.parametrize("toml, key, words", [
    ('[cache]\nbudget_bytes = true\n', "cache.budget_bytes", "integer"),
    ('[cache]\nbudget_bytes = [1]\n', "cache.budget_bytes", "integer"),
    ('[runsc]\ntimeout_s = "soon"\n', "runsc.timeout_s", "number"),
    ('[checkpoint]\nrestore_background = "sometimes"\n', "checkpoint.restore_background", "boolean"),
    ('[store]\nbucket = ["a", "b"]\n', "store.bucket", "string"),
    ('[node]\ngpu = "maybe"\n', "node.gpu", "one of auto, yes, no"),
    ('[cache]\ndir = "relative/cache"\n', "cache.dir", "absolute path"),
    ('[containerd]\nruntime_handler = "Runsc_Thaw"\n', "containerd.runtime_handler", "DNS label"),
    ('[containerd]\nrestart_command = 5\n', "containerd.restart_command", "list of strings"),
    ('[runsc]\ntimeout_s = -1\n', "runsc.timeout_s", "> 0"),
])
def test_bad_type_in_file_names_key_and_file(tmp_path, toml, key, words):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, toml)
    msg = str(e.value)
    assert e.value.key == key
    assert msg.startswith(f"config {key}: ")
    assert words in msg
    assert "config.toml" in msg                      # where the value came from


@pytest.mark.parametrize("env, key", [
    ({"THAW_CACHE_BUDGET_BYTES": "lots"}, "cache.budget_bytes"),
    ({"THAW_RUNSC_PLATFORM": "firecracker"}, "runsc.platform"),
    ({"THAW_CHECKPOINT_RESTORE_BACKGROUND": "2"}, "checkpoint.restore_background"),
    ({"THAW_RUNSC_TIMEOUT_S": "nan"}, "runsc.timeout_s"),
    ({"THAW_NODE_INSTALL_DIR": "opt/thaw"}, "node.install_dir"),
    ({"THAW_THAWD_SOCKET": ""}, "thawd.socket"),
])
def test_bad_env_value_names_key_and_variable(tmp_path, env, key):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, env=env)
    assert e.value.key == key
    assert f"env {next(iter(env))}" in str(e.value)


def test_env_beats_bad_file_value_only_when_file_is_valid(tmp_path):
    # A bad file value is an error even if env would override it: the file is validated as a whole.
    with pytest.raises(ConfigError):
        load(tmp_path, '[node]\ngpu = "maybe"\n', {"THAW_NODE_GPU": "no"})


def test_unknown_override_key(tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, overrides={"runsc.nope": "x"})
    assert e.value.key == "runsc.nope"


def test_missing_and_invalid_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(environ={}, config_file=tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[cache\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(environ={}, config_file=tmp_path / "bad.toml")


def test_every_key_has_help_and_env_name():
    for key, env, _default in config.keys():
        kind, help_ = config.describe(key)
        assert help_, f"{key} has no help line in config._HELP"
        assert kind != "value", f"{key}'s parser has no .kind"
        assert env == "THAW_" + key.replace(".", "_").upper()
    assert set(config._HELP) == set(config._KEYS)


def test_markdown_table_lists_every_key():
    table = config.markdown_table()
    for key, env, _ in config.keys():
        assert f"| `{key}` | `{env}` |" in table


def test_defaults_roundtrip_through_toml(tmp_path):
    """render_value writes what the loader reads back (seed configs, docs)."""
    s = config.load(environ={}, default_file=tmp_path / "absent")
    lines, section = [], None
    for key, _, _ in config.keys():
        sec, name = key.split(".", 1)
        if sec != section:
            lines.append(f"[{sec}]")
            section = sec
        lines.append(f"{name} = {config.render_value(getattr(s, config.field_name(key)))}")
    s2 = load(tmp_path, "\n".join(lines) + "\n")
    assert s2 == s


def test_runsc_label_twin_matches_go_mod():
    gomod = (config.REPO_ROOT / "go" / "go.mod").read_text()
    assert f"-{config.GVISOR_COMMIT}" in gomod
