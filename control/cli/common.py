"""What every `thaw` command shares: the Context (settings and output mode),
--json, and the one place a ThawError becomes a line on stderr and an exit code."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from control import config as configmod
from control.errors import ThawError, exit_code


class Context:
    """What every command gets: settings (flags > env > file > defaults) and output mode."""

    def __init__(self, overrides: dict[str, Any], json_out: bool, verbose: int,
                 config_file: str | None = None) -> None:
        self._overrides = overrides
        self._config_file = config_file
        self.json = json_out
        self.verbose = verbose
        self.tenant_request: str | None = None   # the image commands' --tenant
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
