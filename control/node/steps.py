"""The steps `thaw provision` plans and applies (control/node/provision.py lists them
for a node): write a file, make a directory, a symlink, containerd's imports line,
a command, a skip, the CDI spec. Each inspects the tree and plans what it would do
(create / update / none / skip / run); apply makes it so, atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from control.errors import ThawError
from control.files import write_file_atomic
from control.node import containerd_config as cc
from nvproxy import cdi
from nvproxy.gpu import NodeGpus

# The CDI spec provision writes when no spec defines nvidia.com/gpu: in the
# static directory (cdi.CDI_DIRS[0]), which outlives a reboot (/var/run does not).
CDI_SPEC = cdi.CDI_DIRS[0] / "thaw-nvidia.json"

CREATE, UPDATE, NONE, SKIP, RUN = "create", "update", "none", "skip", "run"


@dataclass
class Plan:
    step: str
    target: str
    action: str                # create | update | none | skip | run
    detail: str = ""
    warning: bool = False      # a skip the operator should know about
    error: str = ""            # the step cannot be planned: provision changes nothing, doctor fails it
    result: str = ""           # after apply: created | updated | unchanged | skipped | ran

    def to_dict(self) -> dict:
        return asdict(self)


class Layout:
    """Maps the node's paths into the tree being provisioned."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def host(self, path: Path) -> Path:
        if not path.is_absolute():
            raise ThawError(f"{path}: expected an absolute path")
        return self.root / path.relative_to("/")


# -- steps ------------------------------------------------------------------------

class Step:
    name = ""

    def plan(self, earlier: list[Plan]) -> Plan:
        raise NotImplementedError

    def apply(self, plan: Plan) -> None:
        raise NotImplementedError


class WriteFile(Step):
    """A file with given content (or a copy of `source`) and mode."""

    def __init__(self, name: str, layout: Layout, dest: Path, mode: int, *, content: str | None = None,
                 source: Path | None = None, only_if_absent: bool = False, compare: bool = True) -> None:
        self.name, self.dest, self.mode = name, dest, mode
        self.target = layout.host(dest)
        self.content = content.encode() if content is not None else None
        self.source = source
        self.only_if_absent = only_if_absent
        self.compare = compare

    def plan(self, earlier: list[Plan]) -> Plan:
        t = self.target
        mode = f"{self.mode:04o}"
        if not t.exists() and not t.is_symlink():
            if self.content is None and (self.source is None or not self.source.is_file()):
                return Plan(self.name, str(t), CREATE, f"missing, and no source {self.source} to install from")
            return Plan(self.name, str(t), CREATE, f"mode {mode}")
        if not t.is_file() or t.is_symlink():
            return Plan(self.name, str(t), UPDATE, "not a regular file: replaced")
        if self.only_if_absent:
            return Plan(self.name, str(t), NONE, "exists; left as it is")
        if self.compare and not self._same_content():
            return Plan(self.name, str(t), UPDATE, "content differs")
        have = t.stat().st_mode & 0o7777
        if have != self.mode:
            return Plan(self.name, str(t), UPDATE, f"mode {have:04o} -> {mode}")
        return Plan(self.name, str(t), NONE, f"up to date, mode {mode}")

    def _same_content(self) -> bool:
        if self.content is not None:
            return self.target.read_bytes() == self.content
        if self.source is None or not self.source.is_file():
            return True     # nothing to compare with: the installed copy stays
        if self.source.stat().st_size != self.target.stat().st_size:
            return False
        return _sha256(self.source) == _sha256(self.target)

    def apply(self, plan: Plan) -> None:
        if plan.action == UPDATE and plan.detail.startswith("mode "):
            os.chmod(self.target, self.mode)
            return
        if self.content is None and (self.source is None or not self.source.is_file()):
            raise ThawError(f"no source to install {self.target} from: {self.source} is missing")
        write_atomic(self.target, self.mode, data=self.content, source=self.source)


class MakeDir(Step):
    def __init__(self, name: str, layout: Layout, dest: Path, mode: int) -> None:
        self.name, self.mode = name, mode
        self.target = layout.host(dest)

    def plan(self, earlier: list[Plan]) -> Plan:
        mode = f"{self.mode:04o}"
        if not self.target.is_dir():
            return Plan(self.name, str(self.target), CREATE, f"directory, mode {mode}")
        have = self.target.stat().st_mode & 0o7777
        if have != self.mode:
            return Plan(self.name, str(self.target), UPDATE, f"mode {have:04o} -> {mode}")
        return Plan(self.name, str(self.target), NONE, f"exists, mode {mode}")

    def apply(self, plan: Plan) -> None:
        self.target.mkdir(parents=True, exist_ok=True)
        os.chmod(self.target, self.mode)


class Symlink(Step):
    """What `systemctl enable` does: a symlink in the target's .wants directory."""

    def __init__(self, name: str, layout: Layout, link: Path, points_to: Path) -> None:
        self.name, self.points_to = name, points_to
        self.target = layout.host(link)

    def plan(self, earlier: list[Plan]) -> Plan:
        want = str(self.points_to)
        if self.target.is_symlink():
            have = os.readlink(self.target)
            if have == want:
                return Plan(self.name, str(self.target), NONE, f"-> {want}")
            return Plan(self.name, str(self.target), UPDATE, f"-> {have} becomes -> {want}")
        if self.target.exists():
            return Plan(self.name, str(self.target), UPDATE, f"a file, replaced by a link -> {want}")
        return Plan(self.name, str(self.target), CREATE, f"-> {want}")

    def apply(self, plan: Plan) -> None:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.target.with_name(f".{self.target.name}.partial-{os.getpid()}")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(self.points_to, tmp)
        os.replace(tmp, self.target)


class ContainerdImports(Step):
    """Make the main containerd config import the drop-in directory (one line)."""

    name = "containerd-imports"

    def __init__(self, layout: Layout, config: Path, dropin_dir: Path) -> None:
        self.config, self.dropin_dir = config, dropin_dir
        self.target = layout.host(config)
        self.edit: cc.ImportsEdit | None = None

    def plan(self, earlier: list[Plan]) -> Plan:
        text = self.target.read_text() if self.target.is_file() else None
        self.edit = cc.ensure_import(text, self.config, self.dropin_dir)
        if self.edit.text is None:
            return Plan(self.name, str(self.target), NONE, self.edit.reason)
        action = CREATE if text is None else UPDATE
        detail = self.edit.reason + ("" if text is None else f"; backup {self.target.name}.thaw-backup")
        return Plan(self.name, str(self.target), action, detail)

    def apply(self, plan: Plan) -> None:
        assert self.edit is not None and self.edit.text is not None
        mode = 0o644
        if self.target.is_file():
            st = self.target.stat()
            mode = st.st_mode & 0o7777
            backup = _free_name(self.target.with_name(self.target.name + ".thaw-backup"))
            shutil.copy2(self.target, backup)
            plan.detail += f" (backup: {backup})"
        write_atomic(self.target, mode, data=self.edit.text.encode())


class Command(Step):
    """A command on the live node, run only when `when(earlier)` says so."""

    def __init__(self, name: str, argv: list[str], when: Callable[[list[Plan]], tuple[bool, str]]) -> None:
        self.name, self.argv, self.when = name, argv, when

    def plan(self, earlier: list[Plan]) -> Plan:
        run, why = self.when(earlier)
        return Plan(self.name, " ".join(self.argv), RUN if run else SKIP, why)

    def apply(self, plan: Plan) -> None:
        proc = subprocess.run(self.argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ThawError(f"`{' '.join(self.argv)}` exited {proc.returncode}: {tail[0]}")


class Skip(Step):
    def __init__(self, name: str, target: str, reason: str, warning: bool = True) -> None:
        self.name, self.target, self.reason, self.warning = name, target, reason, warning

    def plan(self, earlier: list[Plan]) -> Plan:
        return Plan(self.name, self.target, SKIP, self.reason, warning=self.warning)

    def apply(self, plan: Plan) -> None:  # pragma: no cover - skips are never applied
        pass


class CdiSpec(Step):
    """The node's CDI spec for its GPUs (nvproxy/cdi.py): left alone when a spec
    in the CDI directories other than ours defines nvidia.com/gpu (the NVIDIA
    container toolkit's, say); else ours, generated from the GPUs and the
    driver files on this node and kept in step with them.

    `generate` is nvproxy.cdi.generate (a seam for tests: its driver
    directories and device-node test)."""

    name = "cdi spec"

    def __init__(self, layout: Layout, gpus: NodeGpus,
                 generate: Callable[[NodeGpus], dict] = cdi.generate) -> None:
        self.layout, self.gpus, self.generate = layout, gpus, generate
        self.target = layout.host(CDI_SPEC)
        self.doc: dict | None = None

    def plan(self, earlier: list[Plan]) -> Plan:
        t = str(self.target)
        try:
            reg = cdi.load_dirs([self.layout.host(d) for d in cdi.CDI_DIRS], exclude=[self.target])
        except ThawError as e:
            why = f"cannot read the CDI specs already there: {e}"
            return Plan(self.name, t, SKIP, why, warning=True, error=why)
        theirs = [s.path for s in reg.specs if s.kind == cdi.NVIDIA_KIND]
        if theirs:
            return Plan(self.name, theirs[-1], SKIP, f"{cdi.NVIDIA_KIND} spec exists: {theirs[-1]}")
        try:
            self.doc = self.generate(self.gpus)
        except ThawError as e:
            why = f"cannot generate a CDI spec: {e}"
            return Plan(self.name, t, SKIP, why, warning=True, error=why)
        if not self.target.exists():
            return Plan(self.name, t, CREATE, "generated from this node's GPUs and driver files, mode 0644")
        try:
            same = json.loads(self.target.read_text()) == self.doc
        except (OSError, ValueError):
            same = False
        if not same:
            return Plan(self.name, t, UPDATE, "differs from this node's GPUs and driver files")
        have = self.target.stat().st_mode & 0o7777
        if have != 0o644:
            return Plan(self.name, t, UPDATE, f"mode {have:04o} -> 0644")
        return Plan(self.name, t, NONE, "up to date, mode 0644")

    def apply(self, plan: Plan) -> None:
        assert self.doc is not None
        cdi.write_spec(self.doc, self.target.parent, self.target.name, mode=0o644)


def write_atomic(path: Path, mode: int, *, data: bytes | None = None, source: Path | None = None) -> None:
    """Write `data` (or copy `source`) to `path` durably: control.files.write_file_atomic, then
    the directory fsynced so that the rename survives a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def fill(f) -> None:
        if data is not None:
            f.write(data)
        else:
            assert source is not None
            with open(source, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)
    write_file_atomic(path, fill, mode, durable_rename=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _free_name(path: Path) -> Path:
    n, candidate = 1, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate
