"""What a CLI sandbox is doing now, read from its record, its monitor (control/
lifecycle/logs.py) and runsc: `thaw ps`'s rows, whether its workload has exited
and with what status, its log files, its address. Only reads: every change of a
sandbox is control/lifecycle/sandbox.py's, whose `Sandboxes` (`sb` here) calls
these for its ps, logs, watch, gone, exit_of and address."""

from __future__ import annotations

import time
from typing import Callable

from control.errors import NotFound, UserError
from control.lifecycle import logs as logsmod
from control.lifecycle.engine import status as engine_status
from control.lifecycle.records import State, runsc_id, validate_id
from runsc_hooks import gate as gatemod


def watch(sb, sid: str, seconds: float, poll_s: float = 0.05) -> logsmod.Exit | None:
    """Watch a just-started workload for `seconds`: its exit status when it
    exits meanwhile (its monitor saw it, or runsc has it stopped), else None."""
    rec = sb.require(sid)
    logs = logsmod.SandboxLogs.of(sb.settings, sid)
    deadline = time.monotonic() + seconds
    while True:
        ex = logs.exit()
        if ex is not None:
            return ex
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    if seconds > 0 and sb.gone(sid):   # runsc saw it first: the monitor writes it in a moment
        return logsmod.settled_exit(logs, rec.monitor) or logsmod.Exit(None, time.time(), "no monitor saw it")
    return None


def rows(sb) -> list[dict]:
    """Records joined with runsc's view (runsc may know sandboxes thaw does not).
    A record whose workload exited shows as stopped, whatever the record said."""
    r = sb.runsc()
    live = {c.id: c for c in r.list()}
    closed = set(gatemod.closed_gates())
    out = []
    for rec in sb.list_records():
        c = live.pop(runsc_id(rec.id), None)
        state = rec.state.value
        logs = logsmod.SandboxLogs.of(sb.settings, rec.id)
        ex = logs.exit()
        if rec.state is State.RUNNING and (c is None or c.status == "stopped" or ex is not None):
            state = State.STOPPED.value
            if ex is None:   # runsc saw the exit first; the monitor writes it in a moment
                ex = logsmod.settled_exit(logs, rec.monitor)
        stopped = state == State.STOPPED.value
        out.append({"id": rec.id, "state": state, "runsc_status": c.status if c else "absent",
                    "pid": c.pid if c else 0, "address": (rec.net or {}).get("sandbox_ip"),
                    "ports": (rec.net or {}).get("ports", []),
                    "gate": ("closed" if rec.id in closed else "open") if rec.net else None,
                    "healthy": rec.health.get("healthy") if rec.health else None,
                    "exit_status": ex.status if (ex and stopped) else None,
                    "exit": (ex.describe() if ex else "exit status unknown (no monitor saw it)")
                    if stopped else None,
                    "gpus": rec.gpus, "restored_from": rec.restored_from, "created_at": rec.created_at})
    for c in live.values():
        out.append({"id": c.id, "state": "unmanaged", "runsc_status": c.status, "pid": c.pid,
                    "address": None, "ports": [], "gate": None, "healthy": None, "exit_status": None,
                    "exit": None, "gpus": [], "restored_from": None, "created_at": None})
    return out


def logs(sb, sid: str) -> tuple[logsmod.SandboxLogs, Callable[[], bool]]:
    """Sandbox `sid`'s log files, and whether its monitor still writes them."""
    validate_id(sid)
    rec = sb.get(sid)
    files = logsmod.SandboxLogs.of(sb.settings, sid)
    if rec is None and not files.dir.is_dir():
        raise NotFound("sandbox", sid, "`thaw ps` lists the sandboxes thaw manages")
    if rec is not None and rec.monitor is None:
        raise NotFound("log of sandbox", sid, "it was started by a thaw without sandbox logs")
    return files, lambda: logsmod.monitor_alive(rec.monitor if rec else None)


def gone(sb, sid: str) -> bool:
    """The workload has exited: its monitor saw it (runsc's own view lags that,
    see Handle.exited), or runsc says so, or its container is gone."""
    rec = sb.require(sid)
    if logsmod.SandboxLogs.of(sb.settings, sid).exit() is not None:
        return True
    return engine_status(sb.runsc("sandbox" if rec.net else "none"), runsc_id(sid)) in ("stopped", "absent")


def exit_of(sb, sid: str) -> logsmod.Exit | None:
    """The workload's exit status, once its monitor saw it exit (for a workload
    runsc already calls gone, the monitor is given a moment to write it)."""
    rec = sb.get(sid)
    return logsmod.settled_exit(logsmod.SandboxLogs.of(sb.settings, sid), rec.monitor if rec else None)


def address(sb, sid: str) -> str:
    rec = sb.require(sid)
    if not rec.net:
        raise UserError(f"sandbox {sid!r} has no network")
    return rec.net["sandbox_ip"]
