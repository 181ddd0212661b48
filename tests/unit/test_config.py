"""control.config: precedence and validation; every error names its key."""
from __future__ import annotations

import re
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
    ('[cache]\nbudget_bytes = true\n', "cache.budget_bytes", "size in bytes"),
    ('[cache]\nbudget_bytes = [1]\n', "cache.budget_bytes", "size in bytes"),
    ('[runsc]\ntimeout_s = "soon"\n', "runsc.timeout_s", "number"),
    ('[checkpoint]\nrestore_background = "sometimes"\n', "checkpoint.restore_background", "boolean"),
    ('[store]\nbucket = ["a", "b"]\n', "store.bucket", "string"),
    ('[node]\ngpu = "maybe"\n', "node.gpu", "one of auto, yes, no"),
    ('[cache]\ndir = "relative/cache"\n', "cache.dir", "absolute path"),
    ('[containerd]\nruntime_handler = "Runsc_Thaw"\n', "containerd.runtime_handler", "DNS label"),
    ('[containerd]\nrestart_command = 5\n', "containerd.restart_command", "list of strings"),
    ('[runsc]\ntimeout_s = -1\n', "runsc.timeout_s", "expected 1 .. 86400, got -1"),
    ('[store]\nworkers = "4k"\n', "store.workers", "expected an integer"),
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
    ({"THAW_STORE_FETCHER": ""}, "store.fetcher"),   # once "fetch in-process": thaw-fetch is the one engine
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


def test_markdown_table_lists_every_key():
    table = config.markdown_table()
    for k in config.KEYS:
        assert f"| `{k.name}` | `{k.env}` | {k.type_doc} |" in table
    assert "| seconds, 0.5 .. 60 | `4.0` |" in table          # thawd.prepare_timeout_s
    assert "| size, a power of two, 4k .. 16m | `\"256k\"` |" in table


def test_defaults_roundtrip_through_toml(tmp_path):
    """render_toml writes what the loader reads back (seed configs, the stand-in's file)."""
    s = config.load(environ={}, default_file=tmp_path / "absent")
    s2 = load(tmp_path, config.render_toml(config.values(s)))
    assert s2 == s


# A valid value other than the default, per kind, as the environment spells it.
def _other_value(k: config.Key) -> tuple[str, object]:
    if k.range is not None:
        lo, hi = k.range
        x = hi if k.default != hi else lo
        if k.kind is config.POW2_SIZE:
            x = 1 << (int(x).bit_length() - 1)
        x = int(x) if k.kind.type is int else float(x)
        return str(x), x
    samples = {
        config.BOOL: ("false" if k.default else "true", not k.default),
        config.STR: ("other", "other"),
        config.PATH: ("/other/path", Path("/other/path")),
        config.ABS_PATH: ("/other/path", Path("/other/path")),
        config.OPT_PATH: ("/other/path", Path("/other/path")),
        config.WORDS: ("a b", ("a", "b")),
        config.DNS_LABEL: ("other-handler", "other-handler"),
        config.IPV4: ("10.0.0.9", "10.0.0.9"),
        config.IPV4_SLOTS: ("10.9.0.0/24", "10.9.0.0/24"),
        config.SOCKET: ("unix:///other/containerd.sock", "/other/containerd.sock"),
        config.TENANT_MAP: ("k8s:team-a=a, ctr:ci=b", config.Pairs([("ctr:ci", "b"), ("k8s:team-a", "a")])),
    }
    if k.kind.name.startswith("one of "):
        other = next(c for c in k.kind.name[len("one of "):].split(", ") if c != k.default)
        return other, other
    return samples[k.kind]


@pytest.mark.parametrize("k", config.KEYS, ids=lambda k: k.name)
def test_each_env_variable_sets_its_key_and_only_it(tmp_path, k):
    raw, want = _other_value(k)
    assert k.env == "THAW_" + k.name.replace(".", "_").upper()
    s = load(tmp_path, env={k.env: raw})
    assert getattr(s, k.field) == want
    assert getattr(s, k.field) != k.default
    base = load(tmp_path)
    assert [kk.name for kk, v in config.values(s) if v != getattr(base, kk.field)] == [k.name]


NUMERIC = [k for k in config.KEYS if k.kind.numeric]


def test_every_numeric_key_has_a_range_its_default_is_in():
    assert NUMERIC, "the table has numeric keys"
    for k in NUMERIC:
        lo, hi = k.range
        assert lo <= k.default <= hi, k.name
    with pytest.raises(TypeError):
        config.Key("x.count", config.INT, 1, "no range")


@pytest.mark.parametrize("k", NUMERIC, ids=lambda k: k.name)
@pytest.mark.parametrize("side", ["below", "above"])
def test_numbers_outside_their_range_name_key_and_source(tmp_path, k, side):
    lo, hi = k.range
    x = lo - 1 if side == "below" else hi * 2
    x = int(x) if k.kind.type is int else x
    with pytest.raises(ConfigError) as e:
        load(tmp_path, env={k.env: str(x)})
    assert e.value.key == k.name and f"(from env {k.env})" in str(e.value)
    sec, name = k.name.split(".", 1)
    with pytest.raises(ConfigError) as e:
        load(tmp_path, f"[{sec}]\n{name} = {x}\n")
    assert e.value.key == k.name and "config.toml" in str(e.value)
    # The range's ends are accepted.
    for end in k.range:
        end = int(end) if k.kind.type is int else end
        assert getattr(load(tmp_path, env={k.env: str(end)}), k.field) == end


def test_negative_prepare_timeout_is_refused(tmp_path):
    # It used to be accepted and meant "never restore".
    with pytest.raises(ConfigError) as e:
        load(tmp_path, "[thawd]\nprepare_timeout_s = -3\n")
    assert str(e.value).startswith("config thawd.prepare_timeout_s: expected 0.5 .. 60, got -3 (from file ")


@pytest.mark.parametrize("subnet, words", [
    ("banana", "expected an IPv4 network"),
    ("10.213.0.0/31", "/30 or larger"),
    ("10.213.0.1/16", "host bits set"),
    ("fd00::/64", "expected an IPv4 network"),
    ("", "expected an IPv4 network"),
])
def test_network_subnet_must_hold_30_slots(tmp_path, subnet, words):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, env={"THAW_NETWORK_SUBNET": subnet})
    assert e.value.key == "network.subnet" and words in str(e.value)
    assert "(from env THAW_NETWORK_SUBNET)" in str(e.value)


def test_network_subnet_accepts_a_30_and_normalises(tmp_path):
    assert load(tmp_path, env={"THAW_NETWORK_SUBNET": " 10.1.2.4/30 "}).network_subnet == "10.1.2.4/30"


@pytest.mark.parametrize("old, new", sorted(config.RENAMED.items()))
def test_renamed_keys_say_where_they_went(tmp_path, old, new):
    sec, name = old.split(".", 1)
    with pytest.raises(ConfigError) as e:
        load(tmp_path, f"[{sec}]\n{name} = 5\n")
    assert e.value.key == old and f"renamed to {new}" in str(e.value)
    old_env = "THAW_" + old.replace(".", "_").upper()
    with pytest.raises(ConfigError) as e:
        load(tmp_path, env={old_env: "5"})
    assert e.value.key == old and config.key(new).env in str(e.value)


def test_thaw_config_shows_every_key_with_its_source_applied(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from control.cli.main import main
    f = tmp_path / "c.toml"
    f.write_text('[thawd]\nsocket = "/srv/thawd.sock"\n')
    for k in config.KEYS:
        monkeypatch.delenv(k.env, raising=False)
    monkeypatch.setenv("THAW_THAWD_WORKERS", "3")
    r = CliRunner().invoke(main, ["--config", str(f), "config", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["key"]: row for row in json.loads(r.output)}
    assert list(rows) == [k.name for k in config.KEYS]
    assert rows["thawd.socket"] == {"key": "thawd.socket", "env": "THAW_THAWD_SOCKET", "value": "/srv/thawd.sock"}
    assert rows["thawd.workers"]["value"] == 3
    assert rows["store.credentials_file"]["value"] is None
    assert rows["containerd.restart_command"]["value"] == ["systemctl", "restart", "containerd"]
    r = CliRunner().invoke(main, ["--config", str(f), "config"], env={"THAW_THAWD_WORKERS": "0"})
    assert r.exit_code == 78 and "config thawd.workers: expected 1 .. 256" in r.output


def test_health_flags_are_checked_against_the_key(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from control.cli.main import main
    for k in config.KEYS:
        monkeypatch.delenv(k.env, raising=False)
    r = CliRunner().invoke(main, ["--config", "/dev/null", "health", "x", "--timeout", "-1"])
    assert r.exit_code == 78 and "config thawd.health_timeout_s: expected 0.5 .. 3600" in r.output
    assert "(from command line)" in r.output


def test_runsc_label_twins_agree():
    """GVISOR_COMMIT, go/go.mod's gVisor pseudo-version and ci/build-go.sh's
    label (`thaw-gvisor-${version##*-}`) name the same commit."""
    gomod = (config.REPO_ROOT / "go" / "go.mod").read_text()
    version = re.search(r"^\s*gvisor\.dev/gvisor (v\S+)", gomod, re.M).group(1)
    assert version.rsplit("-", 1)[1] == config.GVISOR_COMMIT
    assert config.RUNSC_VERSION_LABEL == "thaw-gvisor-" + config.GVISOR_COMMIT
    assert 'label="thaw-gvisor-${gvisor_version##*-}"' in (config.REPO_ROOT / "ci/build-go.sh").read_text()


# -- THAW_* variables that name no key (issue 33 item 5) ----------------------------------

@pytest.mark.parametrize("var, key, near", [
    ("THAW_STORE_ENDPONT", "store.endpont", "store.endpoint"),     # misspelt key of a known section
    ("THAW_CACHE_BUDGET", "cache.budget", "cache.budget_bytes"),
    ("THAW_NOSUCH_THING", "THAW_NOSUCH_THING", None),              # no section: named as it was spelt
])
def test_unknown_env_is_refused_as_an_unknown_file_key_is(tmp_path, var, key, near):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, env={var: "x"})
    assert e.value.key == key
    assert str(e.value).startswith(f"config {key}: unknown key in env {var}")
    assert (f"did you mean {near}?" in str(e.value)) == (near is not None)
    # The same words as for the file (only the place differs).
    if "." in key:
        sec, name = key.split(".", 1)
        with pytest.raises(ConfigError) as f:
            load(tmp_path, f"[{sec}]\n{name} = 1\n")
        assert str(f.value).replace(str(tmp_path / "config.toml"), "env " + var) == str(e.value)


def test_thaw_variables_that_are_not_settings_are_accepted(tmp_path):
    s = load(tmp_path, env={v: "1" for v in config.ENV_NOT_KEYS if v != "THAW_CONFIG"})
    assert s == load(tmp_path)


def test_every_thaw_variable_the_repository_spells_is_a_key_or_listed():
    import subprocess
    from tests.conftest import REPO
    out = subprocess.run(["git", "grep", "-ohE", r"THAW_[A-Z0-9_]*[A-Z0-9]", "--", ".",
                          ":!tests/unit/test_config.py"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    known = {k.env for k in config.KEYS} | set(config.ENV_NOT_KEYS)
    renamed = {"THAW_" + old.replace(".", "_").upper() for old in config.RENAMED}
    # Spelt only as what they are not: a prefix match in tests (THAW_STORE), the stand-in's
    # test of old names (THAW_SOCKET, THAW_STANDIN_STATE), the renamed THAW_HEALTH_* in the docs,
    # the prefixes THAW_NODE_*/THAW_SPEED_* and the refused example in docs/configuration.md,
    # the Go test's own switches.
    not_variables = {"THAW_STORE", "THAW_HEALTH", "THAW_NODE", "THAW_SPEED", "THAW_CACHE_BUDGET", "THAW_SOCKET", "THAW_STANDIN_STATE", "THAW_CTRINFO_TEST_AS_MAIN",
                     "THAW_CTRINFO_TEST_CONTAINERD"}
    stray = sorted(set(out) - known - renamed - not_variables)
    assert not stray, f"THAW_* names that are neither a key's env nor in config.ENV_NOT_KEYS: {stray}"
