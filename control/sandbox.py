"""Sandboxes thaw runs directly: run, checkpoint, restore, list, delete.

The lifecycle is an explicit state enum with one transition table; asking for
an illegal transition is a user error (InvalidTransition), and every
operation that fails half-way undoes what it did (runsc container, netns,
bundle, record), so a failed restore leaves nothing behind.

Records live in <state_dir>/sandboxes/<id>.json, bundles in
<state_dir>/bundles/<id>/. A checkpoint image is a directory holding runsc's
files plus `thaw.json` (the spec, the sandbox address, file sizes, timings);
it is written under a `.partial-` name and renamed into place last.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from control.config import Settings
from control.errors import (AlreadyExists, ImageError, InvalidTransition, NotFound, PreconditionError,
                            RunscError, ThawError, UserError)
from runsc_hooks import network as netmod
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import (IMAGE_FILES, CheckpointOptions, CreateOptions, GlobalOptions, RestoreOptions,
                               Runsc)

log = logging.getLogger(__name__)

IMAGE_META = "thaw.json"
IMAGE_META_VERSION = 1
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class State(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    RESTORING = "restoring"
    STOPPED = "stopped"
    DELETED = "deleted"


# The one table of allowed transitions (None: the sandbox does not exist yet).
TRANSITIONS: dict[State | None, frozenset[State]] = {
    None: frozenset({State.CREATED, State.RESTORING}),
    State.CREATED: frozenset({State.RUNNING, State.DELETED}),
    State.RUNNING: frozenset({State.CHECKPOINTING, State.STOPPED, State.DELETED}),
    State.CHECKPOINTING: frozenset({State.RUNNING, State.STOPPED, State.DELETED}),
    State.RESTORING: frozenset({State.RUNNING, State.DELETED}),
    State.STOPPED: frozenset({State.DELETED}),
    State.DELETED: frozenset(),
}


def check_transition(sid: str, current: State | None, wanted: State) -> None:
    if wanted not in TRANSITIONS[current]:
        raise InvalidTransition(sid, current.value if current else "absent", wanted.value)


def validate_id(sid: str) -> str:
    if not _ID_RE.match(sid or ""):
        raise UserError(f"sandbox id {sid!r} is invalid: use 1-128 letters, digits, '_', '.', '-' "
                        "(starting with a letter or digit)", id=sid)
    return sid


@dataclass
class Record:
    id: str
    state: State
    bundle: str
    net: dict | None = None
    created_at: float = field(default_factory=time.time)
    restored_from: str | None = None

    def to_dict(self) -> dict:
        return {"id": self.id, "state": self.state.value, "bundle": self.bundle, "net": self.net,
                "created_at": self.created_at, "restored_from": self.restored_from}

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        return cls(id=d["id"], state=State(d["state"]), bundle=d["bundle"], net=d.get("net"),
                   created_at=d.get("created_at", 0.0), restored_from=d.get("restored_from"))


@dataclass(frozen=True)
class CheckpointResult:
    image: Path
    seconds: float
    image_bytes: int


@dataclass(frozen=True)
class RestoreResult:
    id: str
    seconds: float
    sandbox_ip: str | None


class Sandboxes:
    """thaw's own sandboxes on this node (one runsc root, one state dir)."""

    def __init__(self, settings: Settings, debug_log: bool = False) -> None:
        self.settings = settings
        self.records_dir = settings.state_dir / "sandboxes"
        self.bundles_dir = settings.state_dir / "bundles"
        self.debug_log = debug_log

    # -- plumbing --------------------------------------------------------------

    def runsc(self, network: str = "sandbox", nvproxy: bool = False) -> Runsc:
        s = self.settings
        if os.geteuid() != 0:
            raise PreconditionError("thaw needs root: runsc refuses create and restore with --rootless")
        if not s.runsc_available:
            raise PreconditionError(f"runsc not found at {s.runsc_path}: run `make setup` or set "
                                    "runsc.path / THAW_RUNSC_PATH", path=str(s.runsc_path))
        opts = GlobalOptions(root=s.runsc_root, platform=s.runsc_platform, network=network, nvproxy=nvproxy,
                             debug_log=(s.log_dir / "%ID%" / "%COMMAND%.log") if self.debug_log else None,
                             extra=s.runsc_flags)
        return Runsc(s.runsc_path, opts, s.runsc_timeout_s)

    def _record_path(self, sid: str) -> Path:
        return self.records_dir / f"{sid}.json"

    def get(self, sid: str) -> Record | None:
        try:
            return Record.from_dict(json.loads(self._record_path(sid).read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError) as e:
            raise ThawError(f"sandbox record {self._record_path(sid)} is corrupt: {e}") from None

    def _save(self, rec: Record) -> None:
        self.records_dir.mkdir(parents=True, exist_ok=True)
        specmod.write_json_atomic(self._record_path(rec.id), rec.to_dict())

    def _move(self, rec: Record, wanted: State) -> None:
        check_transition(rec.id, rec.state, wanted)
        rec.state = wanted
        if wanted is State.DELETED:
            self._record_path(rec.id).unlink(missing_ok=True)
        else:
            self._save(rec)

    def _allocate_address(self) -> tuple[str, str, int]:
        used = netmod.addresses_in_use()
        for rec in self.list_records():
            if rec.net:
                used.add(rec.net["host_ip"])
        slot = 0
        while True:
            host_ip, sandbox_ip, plen = netmod.slot_addresses(self.settings.network_subnet, slot)
            if host_ip not in used:
                return host_ip, sandbox_ip, plen
            slot += 1

    def list_records(self) -> list[Record]:
        if not self.records_dir.is_dir():
            return []
        out = []
        for p in sorted(self.records_dir.glob("*.json")):
            rec = self.get(p.stem)
            if rec:
                out.append(rec)
        return out

    # -- operations -------------------------------------------------------------

    def run(self, sid: str, spec: dict, network: bool = True, nvproxy: bool = False) -> Record:
        """Create and start a sandbox from `spec` (its netns is replaced by thaw's)."""
        validate_id(sid)
        specmod.validate(spec)
        r = self.runsc("sandbox" if network else "none", nvproxy)
        if self.get(sid) is not None or r.exists(sid):
            raise AlreadyExists("sandbox", sid, "delete it first or pick another id")
        check_transition(sid, None, State.CREATED)
        bundle = specmod.Bundle(self.bundles_dir / sid)
        rec = Record(id=sid, state=State.CREATED, bundle=str(bundle.path))
        try:
            net = None
            if network:
                net = netmod.plumb(sid, *self._allocate_address())
                rec.net = net.to_dict()
            bundle.write(specmod.with_netns(spec, net.netns_path if net else None))
            self._save(rec)
            r.create(sid, CreateOptions(bundle=bundle.path, pid_file=bundle.path / "init.pid"))
            r.start(sid)
            self._move(rec, State.RUNNING)
        except BaseException:
            self._undo(r, rec)
            raise
        return rec

    def checkpoint(self, sid: str, out: Path, leave_running: bool = False,
                   cuda_checkpoint_path: str | None = None) -> CheckpointResult:
        """Save sandbox `sid` into the new directory `out` (atomically: all or nothing)."""
        rec = self._require(sid)
        out = Path(out)
        if out.exists():
            raise AlreadyExists("image directory", str(out), "checkpoint writes a new directory")
        if not out.parent.is_dir():
            raise NotFound("directory", str(out.parent), "the image directory's parent must exist")
        r = self.runsc("sandbox" if rec.net else "none")
        r.state(sid)  # NotFound if runsc lost it
        spec = specmod.Bundle(Path(rec.bundle)).load()
        self._move(rec, State.CHECKPOINTING)
        partial = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
        t0 = time.monotonic()
        try:
            r.checkpoint(sid, CheckpointOptions(image_path=partial, leave_running=leave_running,
                                                compression=self.settings.checkpoint_compression,
                                                cuda_checkpoint_path=cuda_checkpoint_path))
            sizes = {}
            for p in partial.iterdir():
                _fsync_file(p)  # durable before the rename makes the image visible
                sizes[p.name] = p.stat().st_size
            seconds = time.monotonic() - t0
            meta = {"version": IMAGE_META_VERSION, "sandbox": sid, "spec": spec, "net": rec.net,
                    "files": sizes, "runsc_version": r.version(), "platform": self.settings.runsc_platform,
                    "network": "sandbox" if rec.net else "none", "nvproxy": r.options.nvproxy,
                    "checkpoint_s": seconds, "created_at": time.time()}
            specmod.write_json_atomic(partial / IMAGE_META, meta)
            _fsync_dir(partial)
            os.rename(partial, out)
            _fsync_dir(out.parent)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            # A failed save leaves the sandbox running (runsc resumes it).
            self._move(rec, State.RUNNING if _running(r, sid) else State.STOPPED)
            raise
        if leave_running:
            self._move(rec, State.RUNNING)
        else:
            self._move(rec, State.STOPPED)
            self.delete(sid, force=True)
        return CheckpointResult(out, seconds, sum(sizes.values()))

    def restore(self, image: Path, sid: str) -> RestoreResult:
        """Restore the image directory `image` as a new sandbox `sid`."""
        validate_id(sid)
        meta = read_image(Path(image))
        r = self.runsc(meta["network"], meta.get("nvproxy", False))
        if self.get(sid) is not None or r.exists(sid):
            raise AlreadyExists("sandbox", sid, "restore creates a new sandbox")
        check_transition(sid, None, State.RESTORING)
        bundle = specmod.Bundle(self.bundles_dir / sid)
        rec = Record(id=sid, state=State.RESTORING, bundle=str(bundle.path), restored_from=str(image))
        t0 = time.monotonic()
        try:
            net = None
            saved = meta.get("net")
            if saved:
                # Same address as at checkpoint: restored listeners and routes stay valid.
                if saved["host_ip"] in {x["host_ip"] for x in (q.net for q in self.list_records()) if x}:
                    raise UserError(f"sandbox address {saved['sandbox_ip']} of this image is in use by another "
                                    "sandbox on this node; delete it first", address=saved["sandbox_ip"])
                net = netmod.plumb(sid, saved["host_ip"], saved["sandbox_ip"], saved["prefixlen"])
                rec.net = net.to_dict()
            bundle.write(specmod.with_netns(meta["spec"], net.netns_path if net else None))
            self._save(rec)
            r.restore(sid, RestoreOptions(image_path=Path(image), create=CreateOptions(
                bundle=bundle.path, pid_file=bundle.path / "init.pid"), detach=True,
                background=self.settings.restore_background))
            self._move(rec, State.RUNNING)
        except BaseException:
            self._undo(r, rec)
            raise
        return RestoreResult(sid, time.monotonic() - t0, net.sandbox_ip if net else None)

    def delete(self, sid: str, force: bool = False) -> None:
        rec = self.get(sid)
        r = self.runsc("sandbox" if (rec is None or rec.net) else "none")
        if rec is None and not r.exists(sid):
            raise NotFound("sandbox", sid)
        if rec is not None and rec.state is State.RUNNING and not force:
            raise UserError(f"sandbox {sid!r} is running; use --force to kill and delete it", id=sid)
        self._undo(r, rec or Record(id=sid, state=State.STOPPED, bundle=str(self.bundles_dir / sid)))

    def ps(self) -> list[dict]:
        """Records joined with runsc's view (runsc may know sandboxes thaw does not)."""
        r = self.runsc()
        live = {c.id: c for c in r.list()}
        rows = []
        for rec in self.list_records():
            c = live.pop(rec.id, None)
            rows.append({"id": rec.id, "state": rec.state.value, "runsc_status": c.status if c else "absent",
                         "pid": c.pid if c else 0, "address": (rec.net or {}).get("sandbox_ip"),
                         "restored_from": rec.restored_from, "created_at": rec.created_at})
        for c in live.values():
            rows.append({"id": c.id, "state": "unmanaged", "runsc_status": c.status, "pid": c.pid,
                         "address": None, "restored_from": None, "created_at": None})
        return rows

    def address(self, sid: str) -> str:
        rec = self._require(sid)
        if not rec.net:
            raise UserError(f"sandbox {sid!r} has no network")
        return rec.net["sandbox_ip"]

    # -- helpers ----------------------------------------------------------------

    def _require(self, sid: str) -> Record:
        rec = self.get(sid)
        if rec is None:
            raise NotFound("sandbox", sid, "`thaw ps` lists the sandboxes thaw manages")
        return rec

    def _undo(self, r: Runsc, rec: Record) -> None:
        """Remove every trace of `rec`: runsc container, netns, bundle, record."""
        try:
            if r.exists(rec.id):
                r.delete(rec.id, force=True)
        except ThawError as e:
            log.warning("runsc delete %s during cleanup: %s", rec.id, e)
        if rec.net or (netmod.NETNS_DIR / netmod.netns_name(rec.id)).exists():
            netmod.unplumb(rec.id)
        shutil.rmtree(self.bundles_dir / rec.id, ignore_errors=True)
        self._record_path(rec.id).unlink(missing_ok=True)


def read_image(image: Path) -> dict:
    """Validate a checkpoint image directory; return its thaw.json."""
    if not image.is_dir():
        raise ImageError(str(image), "no such directory")
    try:
        meta = json.loads((image / IMAGE_META).read_text())
    except FileNotFoundError:
        raise ImageError(str(image), f"{IMAGE_META} is missing (not written by `thaw checkpoint`?)") from None
    except ValueError as e:
        raise ImageError(str(image), f"{IMAGE_META} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("version") != IMAGE_META_VERSION:
        raise ImageError(str(image), f"{IMAGE_META} has unknown version {meta.get('version') if isinstance(meta, dict) else meta!r}")
    files = meta.get("files")
    if not isinstance(files, dict) or "checkpoint.img" not in files:
        raise ImageError(str(image), f"{IMAGE_META} field files must list checkpoint.img")
    for name, size in files.items():
        if name not in IMAGE_FILES:
            raise ImageError(str(image), f"{IMAGE_META} lists unexpected file {name!r}")
        p = image / name
        if not p.is_file():
            raise ImageError(str(image), f"{name} is missing")
        actual = p.stat().st_size
        if actual != size:
            raise ImageError(str(image), f"{name} is {actual} bytes, {size} were written (truncated or altered)")
    specmod.validate(meta.get("spec"), f"{image / IMAGE_META}:spec")
    if meta.get("network") not in ("sandbox", "none"):
        raise ImageError(str(image), f"{IMAGE_META} field network must be sandbox or none")
    return meta


def _running(r: Runsc, sid: str) -> bool:
    try:
        return r.state(sid).status == "running"
    except (NotFound, RunscError):
        return False


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
