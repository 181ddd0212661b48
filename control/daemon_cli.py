"""`thaw serve` (thawd) and its client commands: `thaw stats`, `thaw evict`."""
from __future__ import annotations

import click

from control.cli import Context, handle_errors, json_option


@click.command("serve")
@click.option("--socket", "socket_path", default=None, help="Unix socket [thawd.socket].")
@click.pass_obj
@handle_errors
def serve_cmd(obj: Context, socket_path: str | None) -> None:
    """Run thawd: the node daemon the runsc stand-in asks at create/start/delete."""
    from pathlib import Path

    from control import config as configmod
    from control import daemon
    from control.image_source import ImageSource
    s = obj.settings
    if socket_path:
        s = configmod.replace(s, thawd_socket=Path(socket_path))
    # What a crashed thaw left of the sandboxes it runs itself (netns, gate
    # rules, records whose owner died) goes first, as after a node reboot.
    import logging

    from control.sandbox import Sandboxes
    for row in Sandboxes(s).recover():
        logging.getLogger("thawd").info("recovered sandbox leftovers: %s", row)
    images = ImageSource(s)
    daemon.serve(s, images, images.node.hash())


@click.command("stats")
@json_option
@click.pass_obj
@handle_errors
def stats_cmd(obj: Context) -> None:
    """thawd's counters and cache entries (with quarantine reasons)."""
    from control import daemon
    from control.rpc import thawd_pb2 as pb
    stub, ch = daemon.client(obj.settings)
    with ch:
        r = stub.Stats(pb.StatsRequest(), timeout=10)
    data = {"counters": dict(r.counters), "entries": [
        {"key": e.workload_key, "tuple_hash": e.tuple_hash, "bytes": e.bytes, "leases": e.leases,
         "state": e.state, "reason": e.reason} for e in r.entries]}

    def human(d: dict) -> str:
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
    from control import daemon
    from control.rpc import thawd_pb2 as pb
    stub, ch = daemon.client(obj.settings)
    with ch:
        r = stub.Evict(pb.EvictRequest(workload_key=key), timeout=30)
    obj.emit({"key": key, "evicted": r.evicted}, f"{key}: {'evicted' if r.evicted else 'nothing to evict'}")


COMMANDS = [serve_cmd, stats_cmd, evict_cmd]
