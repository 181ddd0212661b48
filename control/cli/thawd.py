"""`thaw serve` (thawd) and its client commands: `thaw stats`, `thaw evict`."""
from __future__ import annotations

import click

from control.cli.common import Context, handle_errors, json_option, needs_root


@click.command("serve")
@click.option("--socket", "socket_path", default=None, help="Unix socket [thawd.socket].")
@click.pass_obj
@handle_errors
@needs_root("thawd runs runsc and owns the node cache")
def serve_cmd(obj: Context, socket_path: str | None) -> None:
    """Run thawd: the node daemon the runsc stand-in asks at create/start/delete."""
    from control import logfields
    from control.thawd import server as daemon
    from control.images.source import ImageSource
    logfields.configure(obj.verbose, json_lines=True, daemon=True)   # -v: info (the default), -vv: debug
    obj.override("thawd.socket", socket_path)  # validated like the config key (an absolute path)
    s = obj.settings
    # One thawd per node, before anything is touched: a second one exits here
    # (exit 69) and leaves the first one's socket and sandboxes alone.
    daemon.lock_node(s)
    daemon.prepare_socket(s.thawd_socket)
    # What a crashed thaw left of the sandboxes it runs itself (netns, gate
    # rules, records whose owner died) goes first, as after a node reboot.
    import logging

    from control.lifecycle.sandbox import Sandboxes
    for row in Sandboxes(s).recover():
        logging.getLogger("thawd").info("recovered sandbox leftovers: %s", row, extra=logfields.fields(**{
            k: v for k, v in (row.items() if isinstance(row, dict) else ()) if k in ("id", "state", "removed")}))
    images = ImageSource(s)
    daemon.serve(s, images, images.node.hash(), verbose=obj.verbose)


@click.command("stats")
@click.option("--decisions", "last", type=click.IntRange(min=0), default=None,
              help="Also the last N decisions: did each container restore or start cold, and why "
                   "(default 20 with --container).")
@click.option("--container", default="", help="Only this container's decisions (its containerd id).")
@json_option
@click.pass_obj
@handle_errors
def stats_cmd(obj: Context, last: int | None, container: str) -> None:
    """thawd's counters and cache entries (with quarantine reasons); with --decisions, its
    last decisions."""
    import time as _time

    from control.thawd.client import Client
    if last is None:
        last = 20 if container else 0
    with Client(obj.settings) as c:
        data = c.stats(decisions=last, container=container)

    def human(d: dict) -> str:
        if last:
            return "\n".join(
                f"{_time.strftime('%H:%M:%S', _time.localtime(r['time']))} {r['container']:<24} "
                f"{r['decision']:<15} {r['key']:<40} {r['reason']}" + (f" ({r['seconds']:.3f} s)" if r["seconds"] else "")
                for r in d["decisions"]) or f"no decisions{' for ' + container if container else ''} yet"
        lines = [f"{k:<48} {v:g}" for k, v in sorted(d["counters"].items())]
        lines += [f"{e['key']:<48} {e['bytes'] / 1e6:9.1f} MB  {e['state']:<11} leases={e['leases']} {e['reason']}"
                  for e in d["entries"]]
        return "\n".join(lines) or "(nothing yet)"
    obj.emit(data, human)


@click.command("evict")
@click.argument("key")
@json_option
@click.pass_obj
@handle_errors
def evict_cmd(obj: Context, key: str) -> None:
    """Evict KEY's local cache entries through thawd and lift its quarantine."""
    from control.thawd.client import Client
    with Client(obj.settings) as c:
        r = c.evict_why(key)
    said = "evicted" if r["evicted"] else "not evicted"
    obj.emit({"key": key, **r}, f"{key}: {said}" + (f": {r['reason']}" if r["reason"] else ""))


COMMANDS = [serve_cmd, stats_cmd, evict_cmd]
