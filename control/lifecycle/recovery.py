"""What crashed thaw processes left of the CLI's sandboxes, and undoing it (kill -9 of
`thaw restore`, a node crash): a record in a transitional state whose owner is gone,
a record whose runsc container is gone, network objects no record names. Used by
control/lifecycle/sandbox.py (its get() settles a dead owner's record on sight)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from control.config import Settings
from control.files import Owner
from control.lifecycle.engine import status as _status
from control.lifecycle.records import TRANSITIONAL, Record, State, runsc_id
from control.logfields import fields
from runsc_hooks import gate as gatemod
from runsc_hooks import network as netmod

log = logging.getLogger("control.lifecycle.sandbox")

# runsc subcommands that may still be working on a container after the thaw
# process that started them died (they are not killed with their parent).
_RUNSC_BUSY = ("create", "restore", "checkpoint", "start")
# How long a command that finds a dead owner's record waits for that owner's runsc children
# (a runsc restore outlives a killed `thaw restore` briefly) before leaving it to `recover`.
REAP_WAIT_S = 5.0


def reap(sb, rec: Record) -> Record | None:
    """`rec`, unless its owner died in a transitional state: then what it left is undone
    now and None is returned (a checkpoint whose sandbox runs on goes back to running).
    Issue 30: a streamed restore killed mid-way left a `restoring` record, and its id and
    address, until someone ran `thaw sandbox-gc`. A record runsc still works on (a child
    of the dead owner, for up to REAP_WAIT_S) is left to `recover`."""
    if rec.state not in TRANSITIONAL:
        return rec
    owner = Owner.from_dict(rec.owner)
    if owner is not None and owner.alive():
        return rec
    if not _wait_runsc_idle(sb.settings, runsc_id(rec.id), REAP_WAIT_S):
        return rec
    r = sb.runsc("sandbox" if rec.net else "none", rec.nvproxy)
    status = _status(r, runsc_id(rec.id))
    if status.startswith("unknown"):
        return rec
    why = f"{rec.state.value} by pid {(rec.owner or {}).get('pid')}, which is gone"
    if rec.state is State.CHECKPOINTING and status == "running":
        if rec.net:
            gatemod.open(rec.id, "checkpoint abandoned, the sandbox runs on")
        rec.owner = None
        sb._move(rec, State.RUNNING)
        log.warning("sandbox %s was %s: resumed", rec.id, why)
        return rec
    log.warning("sandbox %s was %s: removed what it left", rec.id, why)
    sb._undo(r, rec)
    return None


def recover(sb, orphans: bool = False, prefix: str = "") -> list[dict]:
    """Remove what crashed thaw processes left behind (after kill -9, a node crash):

    - a sandbox in a transitional state whose owner process is gone: removed
      (a checkpoint whose sandbox still runs goes back to running, gate open);
    - a running or stopped record whose runsc container is gone (runsc knows
      no such id): removed. A container runsc cannot answer about is left
      alone: only proof that it is gone removes a record and its network;
    - with `orphans`, thaw network objects (netns, veth, nftables rules) of
      sandbox names this node has no record of (only names starting with
      `prefix`, when given: other thaw instances may share the node).

    Returns one {"id", "action", "reason"} per thing done. Idempotent.
    """
    r = sb.runsc()
    actions = []
    for rec in sb.list_records(reap=False):   # each one named in what it did
        if rec.state in TRANSITIONAL:
            owner = Owner.from_dict(rec.owner)
            if owner is not None and owner.alive():
                continue
            reason = f"{rec.state.value} by pid {(rec.owner or {}).get('pid')}, which is gone"
            _wait_runsc_idle(sb.settings, runsc_id(rec.id))  # runsc children outlive a killed owner
        else:
            reason = ""
        status = _status(r, runsc_id(rec.id))
        if status.startswith("unknown"):
            log.warning("recover: leaving %s alone: runsc cannot tell its state (%s)", rec.id, status,
                        extra=fields(container=rec.id, reason=str(status)))
            continue
        if rec.state in (State.RUNNING, State.STOPPED) and status in ("running", "paused", "stopped"):
            continue
        if rec.state is State.CHECKPOINTING and status == "running":
            if rec.net:
                gatemod.open(rec.id, "recover: checkpoint abandoned, the sandbox runs on")
            rec.owner = None
            sb._move(rec, State.RUNNING)
            actions.append({"id": rec.id, "action": "resumed", "reason": reason})
            continue
        reason = reason or f"{rec.state.value} but its runsc container is {status}"
        sb._undo(sb.runsc("sandbox" if rec.net else "none"), rec)
        actions.append({"id": rec.id, "action": "removed", "reason": reason})
    if orphans:
        keep = {rec.id for rec in sb.list_records()}
        for what in netmod.cleanup_leftovers(keep, prefix):
            actions.append({"id": what, "action": "removed", "reason": "no sandbox record on this node"})
    for a in actions:
        log.info("recover: %s %s (%s)", a["action"], a["id"], a["reason"],
                 extra=fields(container=a["id"], decision=a["action"], reason=a["reason"]))
    return actions


def _wait_runsc_idle(settings: Settings, sid: str, timeout_s: float | None = None) -> bool:
    """Wait (bounded) until no runsc create/restore/checkpoint for `sid` runs under our root;
    False if one still does."""
    deadline = time.monotonic() + (settings.runsc_timeout_s if timeout_s is None else timeout_s)
    root_flag = f"--root={settings.runsc_root}"
    while time.monotonic() < deadline:
        busy = False
        for p in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                argv = p.read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv if a]
            if len(words) > 2 and words[0] == str(settings.runsc_path) and root_flag in words \
                    and words[-1] == sid and any(w in _RUNSC_BUSY for w in words[1:-1]):
                busy = True
                break
        if not busy:
            return True
        time.sleep(0.05)
    waited = settings.runsc_timeout_s if timeout_s is None else timeout_s
    log.warning("runsc is still working on %s after %.0fs", sid, waited, extra=fields(container=sid, duration_s=waited))
    return False
