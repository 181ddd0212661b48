"""The `thaw` command line: a thin layer over the modules that do the work.

Each command parses its options and calls one function; errors from the
ThawError tree become one clear line on stderr (or a JSON object with
--json) and the exit code from control.errors.EXIT_CODE (control/cli/common.py).
Commands live in one module per area (control/cli/<area>.py), registered
below by plain import. Those modules import heavy libraries (boto3, grpc,
pyroute2, pynvml) inside the commands that use them, so `thaw --help` and
`thaw restore` do not pay for what they do not run.
"""

from __future__ import annotations

import sys

import click

from control import config as configmod
from control import logfields
from control.cli import images, node, sandbox, thawd
from control.cli.common import Context, fail, handle_errors, json_option, one_line
from control.errors import EXIT_INTERRUPTED, EXIT_STATUSES, ThawError
from control.version import DISTRIBUTION, VERSION


def _exit_statuses() -> str:
    return "Exit status:\n\n\b\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_STATUSES)


class ThawGroup(click.Group):
    """click's group, with every error of its own (an unknown command or
    option, a missing argument) as ONE line and the documented code, like
    thaw's own errors: click's usage text would be 3-4 lines."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:   # the caller handles click's exceptions itself (click's contract)
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name or "thaw", complete_var, standalone_mode=False, **extra)
        except click.UsageError as e:
            hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            click.echo(f"thaw: error: {one_line(e.format_message()).rstrip('.')}{hint}", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"thaw: error: {one_line(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except (click.Abort, KeyboardInterrupt):
            click.echo("thaw: error: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001 - outside any command (e.g. while parsing): still one line
            fail(e)
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def version_lines(settings_of=configmod.load) -> list[str]:
    """`thaw --version`: thaw's version, the runsc version label it pins, and
    this node's compatibility-tuple hash (control/node/compat.py node_tuple: what
    images are published under and matched against). When the tuple cannot be
    computed here (no runsc at runsc.path, a bad config, a failing NVML), that
    line says why instead: the version itself is always printed."""
    lines = [f"thaw {VERSION} ({DISTRIBUTION})", f"runsc pin: {configmod.RUNSC_VERSION_LABEL}"]
    try:
        from control.node.compat import node_tuple
        settings = settings_of()
        if not settings.runsc_available:
            raise ThawError(f"no runsc at {settings.runsc_path} (runsc.path)")
        t = node_tuple(settings)
        label = "" if t.runsc_version == configmod.RUNSC_VERSION_LABEL else \
            f"; its runsc says {t.runsc_version}, not the pin: images restore only where that matches"
        lines.append(f"compatibility tuple: {t.hash()} (runsc {settings.runsc_path}{label})")
    except (ThawError, OSError) as e:
        lines.append(f"compatibility tuple: not computed on this node: {one_line(e)}")
    return lines


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo("\n".join(version_lines()))
    ctx.exit(0)


@click.group(cls=ThawGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_exit_statuses())
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print thaw's version, its runsc pin and this node's compatibility-tuple hash.")
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
    logfields.configure(verbose)   # `thaw serve` switches to JSON lines at its own default level
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
    rows = [{"key": k.name, "env": k.env, "value": configmod.json_value(v)}
            for k, v in configmod.values(obj.settings)]
    obj.emit(rows, lambda r: "\n".join(f"{x['key']:<32} {x['value']!s:<40} ({x['env']})" for x in r))


for _area in (sandbox, thawd, node, images):
    for _cmd in _area.COMMANDS:
        main.add_command(_cmd)

if __name__ == "__main__":
    main()
