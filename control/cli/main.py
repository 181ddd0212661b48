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

import logging
import sys

import click

from control import config as configmod
from control.cli import images, node, sandbox, thawd
from control.cli.common import Context, handle_errors, json_option


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
    rows = [{"key": k.name, "env": k.env, "value": configmod.json_value(v)}
            for k, v in configmod.values(obj.settings)]
    obj.emit(rows, lambda r: "\n".join(f"{x['key']:<32} {x['value']!s:<40} ({x['env']})" for x in r))


for _area in (sandbox, thawd, node, images):
    for _cmd in _area.COMMANDS:
        main.add_command(_cmd)

if __name__ == "__main__":
    main()
