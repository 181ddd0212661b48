from pathlib import Path

import pytest

from control import config
from control.errors import ConfigError


def test_defaults_with_empty_file_and_no_env(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={}, config_file=tmp_path / "empty.toml")
    assert s.runsc_platform == "systrap"
    assert s.runsc_path == config.REPO_ROOT / "build" / "runsc"


def test_precedence_cli_over_env_over_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[runsc]\nplatform = "ptrace"\nroot = "/from/file"\n[cache]\nbudget_bytes = "2G"\n')
    s = config.load(environ={"THAW_RUNSC_ROOT": "/from/env"}, config_file=f)
    assert s.runsc_platform == "ptrace"
    assert s.runsc_root == Path("/from/env")
    assert s.cache_budget_bytes == 2 << 30
    s = config.load({"runsc.root": "/from/cli"}, environ={"THAW_RUNSC_ROOT": "/from/env"}, config_file=f)
    assert s.runsc_root == Path("/from/cli")


def test_thaw_config_env_names_the_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[node]\nmachine_type = "h200-sxm"\n')
    assert config.load(environ={"THAW_CONFIG": str(f)}).machine_type == "h200-sxm"


@pytest.mark.parametrize("text, key", [
    ('[runsc]\nbogus = 1\n', "runsc.bogus"),
    ('[runsc]\nplatform = "qemu"\n', "runsc.platform"),
    ('[cache]\nbudget_bytes = "lots"\n', "cache.budget_bytes"),
    ('[checkpoint]\nrestore_background = "maybe"\n', "checkpoint.restore_background"),
    ('runsc = 3\n', "runsc"),
])
def test_bad_file_values_name_the_key(tmp_path, text, key):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        config.load(environ={}, config_file=f)
    assert e.value.key == key


def test_bad_env_value_names_key_and_source():
    with pytest.raises(ConfigError) as e:
        config.load(environ={"THAW_RUNSC_TIMEOUT_S": "soon"})
    assert e.value.key == "runsc.timeout_s" and "THAW_RUNSC_TIMEOUT_S" in str(e.value)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(environ={}, config_file=tmp_path / "nope.toml")
    (tmp_path / "b.toml").write_text("[runsc\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(environ={}, config_file=tmp_path / "b.toml")


def test_unknown_cli_key():
    with pytest.raises(ConfigError):
        config.load({"nope.key": 1}, environ={})


def test_runsc_label_twin_matches_go_mod():
    gomod = (config.REPO_ROOT / "go" / "go.mod").read_text()
    assert f"-{config.GVISOR_COMMIT}" in gomod
