"""The configuration tables in the docs, and the stand-in's key table, are generated from control/config.py."""
from __future__ import annotations

import importlib.util

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("update_config_docs", REPO / "ci/update-config-docs.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)


def test_config_tables_are_up_to_date():
    for f in gen.FILES:
        text = f.read_text()
        assert gen.render(text) == text, f"{f} is stale: run `python3 ci/update-config-docs.py`"


def test_standin_key_table_is_up_to_date():
    """The Go stand-in's keys, defaults and ranges are generated from control/config.py."""
    assert gen.GO_KEYS.read_text() == gen.go_keys(), f"{gen.GO_KEYS} is stale: run `python3 ci/update-config-docs.py`"
    for k in (k for k in gen.config.KEYS if k.standin):
        assert f'{{Name: "{k.name}", Env: "{k.env}",' in gen.GO_KEYS.read_text()


def test_thaw_config_markdown_prints_the_table():
    from click.testing import CliRunner

    from control import config
    from control.cli.main import main
    r = CliRunner().invoke(main, ["config", "--markdown"])
    assert r.exit_code == 0, r.output
    assert r.output == config.markdown_table()


def test_every_exit_status_is_documented_in_the_readme_and_the_help():
    from click.testing import CliRunner

    from control.cli.main import main
    from control.errors import EXIT_CODE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_STATUSES
    documented = {code for code, _ in EXIT_STATUSES}
    assert {code for _, code in EXIT_CODE} | {0, EXIT_INTERNAL, EXIT_INTERRUPTED} <= documented
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    for code, _ in EXIT_STATUSES:
        assert f"\n| {code} |" in section, f"exit status {code} is not in README's command-line section"
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0
    for code, text in EXIT_STATUSES:
        assert f"{code:>3}  {text.split()[0]}" in r.output, code
