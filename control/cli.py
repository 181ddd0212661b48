"""The `thaw` command line: a thin layer over the modules that do the work.

Each command parses its options and calls one function; errors from the
ThawError tree become one clear line on stderr (or a JSON object with
--json) and the exit code from control.errors.EXIT_CODE. Commands live in
per-area modules (listed in COMMAND_MODULES) that expose `COMMANDS`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable

import click

from control import config as configmod
from control.errors import ThawError, exit_code

# Modules that contribute commands; each has a list `COMMANDS` of click commands.
# One per line, so branches that add one merge cleanly.
COMMAND_MODULES = (
    "control.sandbox_cli",
    "control.daemon_cli",
    "control.provision_cli",
    "control.store_cli",
    "control.bench_cli",
    "control.gpu_bench_cli",
    "control.health_cli",
)


class Context:
    """What every command gets: settings (flags > env > file > defaults) and output mode."""

    def __init__(self, overrides: dict[str, Any], json_out: bool, verbose: int,
                 config_file: str | None = None) -> None:
        self._overrides = overrides
        self._config_file = config_file
        self.json = json_out
        self.verbose = verbose
        self._settings: configmod.Settings | None = None

    def override(self, key: str, value: Any) -> None:
        """Set a setting from a subcommand's option (before settings are first read)."""
        if value is not None:
            self._overrides[key] = value
            self._settings = None

    @property
    def settings(self) -> configmod.Settings:
        if self._settings is None:
            self._settings = configmod.load(self._overrides,
                                            config_file=Path(self._config_file) if self._config_file else None)
        return self._settings

    def settings_under(self, root: Path) -> configmod.Settings:
        """Settings for the node tree at `root` (`--root DIR`): the file is
        --config, else $THAW_CONFIG, else DIR/etc/thaw/config.toml if present."""
        if root == Path("/"):
            return self.settings
        return configmod.load(self._overrides,
                              config_file=Path(self._config_file) if self._config_file else None,
                              default_file=root / configmod.DEFAULT_CONFIG_FILE.relative_to("/"))

    def emit(self, data: Any, human: Callable[[Any], str] | str | None = None) -> None:
        """Print `data` as JSON with --json, else its human rendering."""
        if self.json:
            click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
        elif human is not None:
            click.echo(human(data) if callable(human) else human)


def json_option(f: Callable) -> Callable:
    """--json on a subcommand (same as the global flag)."""
    @click.option("--json", "json_out", is_flag=True, help="Print the result as JSON.")
    @functools.wraps(f)
    def wrapper(*args: Any, json_out: bool, **kwargs: Any) -> Any:
        ctx = click.get_current_context().find_object(Context)
        if json_out and ctx is not None:
            ctx.json = True
        return f(*args, **kwargs)
    return wrapper


def handle_errors(f: Callable) -> Callable:
    """Turn a ThawError into one line on stderr (or JSON) and its exit code."""
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except ThawError as e:
            ctx = click.get_current_context().find_object(Context)
            if ctx is not None and ctx.json:
                click.echo(json.dumps(e.to_dict(), indent=2, default=str))
            click.echo(f"thaw: error: {e}", err=True)
            sys.exit(exit_code(e))
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (default: $THAW_CONFIG, else /etc/thaw/config.toml).")
@click.option("--runsc", "runsc_path", default=None, help="The real runsc binary [runsc.path].")
@click.option("--root", "runsc_root", default=None, help="runsc state directory [runsc.root].")
@click.option("--json", "json_out", is_flag=True, help="Print results as JSON.")
@click.option("-v", "--verbose", count=True, help="More logging (-vv: debug).")
@click.pass_context
def main(ctx: click.Context, config_file: str | None, runsc_path: str | None, runsc_root: str | None,
         json_out: bool, verbose: int) -> None:
    """thaw: start GPU containers warm by restoring checkpointed gVisor sandboxes."""
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    ctx.obj = Context({"runsc.path": runsc_path, "runsc.root": runsc_root}, json_out, verbose, config_file)


@main.command("config")
@click.option("--markdown", is_flag=True, help="Print the table of every key, its env name and default "
              "(docs/configuration.md) instead of the effective settings.")
@json_option
@click.pass_obj
@handle_errors
def config_cmd(obj: Context, markdown: bool) -> None:
    """Show the effective settings (validated), each key with its env name."""
    if markdown:
        click.echo(configmod.markdown_table(), nl=False)
        return
    s = obj.settings
    rows = []
    for key, env, _default in configmod.keys():
        field = configmod._KEYS[key][0]
        value = getattr(s, field)
        rows.append({"key": key, "env": env, "value": list(value) if isinstance(value, tuple) else str(value)
                     if not isinstance(value, (int, float, bool)) else value})
    obj.emit(rows, lambda r: "\n".join(f"{x['key']:<32} {x['value']!s:<40} ({x['env']})" for x in r))


# Each module lists top-level commands in COMMANDS and `thaw bench`
# subcommands in BENCH_COMMANDS (the bench group itself is in bench_cli).
for _name in COMMAND_MODULES:
    _mod = importlib.import_module(_name)
    for _cmd in getattr(_mod, "COMMANDS", ()):
        main.add_command(_cmd)
for _name in COMMAND_MODULES:
    for _cmd in getattr(importlib.import_module(_name), "BENCH_COMMANDS", ()):
        main.commands["bench"].add_command(_cmd)

if __name__ == "__main__":
    main()
