"""`thaw health ID`: a sandbox's health check, usable as a readiness probe.

Exit status 0 when every probe passes and the sandbox's gate is open (traffic
reaches it), 1 when not ready (a probe failed, or the gate is still closed), 2
for a bad request (unknown sandbox, bad --probe); --json prints the result
with per-probe attempts and timings.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click

from control.cli import Context, handle_errors, json_option
from control.sandbox import Sandboxes
from runsc_hooks import health as healthmod

EXIT_READY = 0
EXIT_NOT_READY = 1


@dataclass(frozen=True)
class HealthOptions:
    id: str
    probes: tuple[str, ...]       # empty: the sandbox's own probes
    timeout_s: float
    attempt_timeout_s: float


def health(obj: Context, o: HealthOptions) -> dict:
    probes = [healthmod.parse(p) for p in o.probes] or None  # parse at the edge: a bad probe is a UserError
    result, gate_closed = Sandboxes(obj.settings).health(o.id, probes,
                                                         healthmod.Policy(o.timeout_s, o.attempt_timeout_s))
    gate = None if gate_closed is None else ("closed" if gate_closed else "open")
    return {"id": o.id, "ready": result.healthy and gate != "closed", "gate": gate, **result.to_dict()}


def _human(d: dict) -> str:
    lines = [f"{d['id']}: {'ready' if d['ready'] else 'NOT READY'} (healthy: {d['healthy']}, gate: {d['gate'] or '-'}, "
             f"{d['seconds']:.3f}s)"]
    for p in d["probes"]:
        lines.append(f"  {p['probe']:<32} {'ok' if p['ok'] else 'FAILED':<7} {p['attempts']:>3} attempt(s) "
                     f"{p['seconds']:.3f}s  {p['detail']}")
    return "\n".join(lines)


@click.command("health")
@click.argument("sid")
@click.option("--probe", "probes", multiple=True,
              help="running | tcp:PORT | http:PORT/PATH[=STATUS][~BODY] | gpu:PORT/PATH[#FIELD] | exec:CMD "
                   "(repeatable; default: the sandbox's own probes).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.01), default=None,
              help="Deadline of the whole check in seconds [health.timeout_s].")
@click.option("--attempt-timeout", "attempt_timeout_s", type=click.FloatRange(min=0.001), default=None,
              help="Deadline of one probe attempt in seconds [health.attempt_timeout_s].")
@json_option
@click.pass_obj
@handle_errors
def health_cmd(obj: Context, sid: str, probes: tuple[str, ...], timeout_s: float | None,
               attempt_timeout_s: float | None) -> None:
    """Check sandbox SID now; exit 0 only when it is healthy and its gate is open."""
    s = obj.settings
    out = health(obj, HealthOptions(sid, probes, s.health_timeout_s if timeout_s is None else timeout_s,
                                    s.health_attempt_timeout_s if attempt_timeout_s is None else attempt_timeout_s))
    obj.emit(out, _human)
    sys.exit(EXIT_READY if out["ready"] else EXIT_NOT_READY)


COMMANDS = [health_cmd]
