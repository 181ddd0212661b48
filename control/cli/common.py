"""What every `thaw` command shares: the Context (settings and output mode),
--json, and the one place an error becomes ONE line on stderr and its exit
code (control.errors.EXIT_STATUSES documents every code).

`fail` is that place: a ThawError keeps its class's code; an OSError thaw did
not expect is named by its errno (permission denied: 69, no space: 4, any
other: 1); anything else is a bug (70), whose traceback -vv prints.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

import click

from control import config as configmod
from control.errors import (EXIT_INTERNAL, NoSpace, PreconditionError, ThawError, UserError, exit_code)

log = logging.getLogger("thaw")


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


def as_thaw_error(e: BaseException) -> tuple[ThawError, int]:
    """The ThawError an exception stands for, and its exit code."""
    if isinstance(e, ThawError):
        return e, exit_code(e)
    if isinstance(e, OSError):
        where = e.filename or ""
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            hint = " (run as root)" if os.geteuid() != 0 and e.errno != errno.EROFS else ""
            err: ThawError = PreconditionError(f"{e.strerror.lower()}: {where}{hint}", path=str(where))
        elif e.errno in (errno.ENOSPC, errno.EDQUOT):
            err = NoSpace(f"no space left on the file system of {where or 'a file thaw writes'}", path=str(where))
        elif e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG):
            err = UserError(f"{e.strerror.lower()}: {where}", path=str(where))
        else:
            err = ThawError(f"{e.strerror or e}: {where}".rstrip(": "), errno=e.errno)
        return err, exit_code(err)
    return ThawError(f"internal error (a bug in thaw): {type(e).__name__}: {e}"), EXIT_INTERNAL


def one_line(text: str) -> str:
    """A message as one line: inner line breaks become '; '."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def fail(e: BaseException) -> NoReturn:
    """Report `e` as one line on stderr (and its fields as JSON with --json); exit with its code."""
    err, code = as_thaw_error(e)
    if code == EXIT_INTERNAL:
        log.debug("the traceback of the internal error", exc_info=e)
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_object(Context) if ctx is not None else None
    if obj is not None and obj.json:
        click.echo(json.dumps(err.to_dict(), indent=2, default=str))
    click.echo(f"thaw: error: {one_line(err)}", err=True)
    sys.exit(code)


def handle_errors(f: Callable) -> Callable:
    """Turn any exception into one line on stderr (or JSON) and its exit code."""
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt, click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - the one place every error becomes a line and a code
            fail(e)
    return wrapper


def needs_root(why: str) -> Callable:
    """The command needs root: as any other user it says so in one line (exit 69)
    before it reads or creates anything."""
    def deco(f: Callable) -> Callable:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if os.geteuid() != 0:
                name = click.get_current_context().command_path
                raise PreconditionError(f"`{name}` needs root: {why}")
            return f(*args, **kwargs)
        return wrapper
    return deco
