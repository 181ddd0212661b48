"""Pods (control/thawd/pods.py) given small fakes of the parts it uses instead of a
daemon: the preparer that leases an image, the restorer that undoes a restore,
the automatic checkpoint, the quarantine. The container records are the real
ones, the runsc it calls is a fake that records its argv (test_pods.FAKE_RUNSC)."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from control import config
from control.lifecycle import pod as podmod
from control.thawd.containers import Containers, Decision, RuntimeRef, State
from control.thawd.metrics import Metrics
from control.thawd.podtables import hint_of
from control.thawd.pods import RESTORING, Pods
from tests.unit.test_pod import identity, lookup, member, sandbox
from tests.unit.test_pods import FAKE_RUNSC, FakePodIdentities


class FakeLease:
    streamed, hit = False, True

    def __init__(self, path: Path) -> None:
        self.path, self.released = path, False

    def env(self) -> dict:
        return {}

    def verdict(self, wait_s: float = 0):
        return None

    def describe(self, holder: str) -> None:   # Restorable: who holds it (`thaw evict`)
        self.holder = holder

    def release(self) -> None:
        self.released = True


class FakePreparer:
    """claim_image: every key has an image under `images`."""

    def __init__(self, containers: Containers, images: Path) -> None:
        self.containers, self.images, self.claimed = containers, images, []

    def claim_image(self, rt: RuntimeRef, spec: dict, key: str, t0=None) -> Decision:
        self.claimed.append(key)
        self.containers.claim(rt, FakeLease(self.images / key))
        self.containers.decide(rt, State.RESTORE, key)
        return Decision(True, "image-ready", key, str(self.images / key), 10.0)

    def restore_deadline_s(self, spec: dict) -> float:
        return 10.0

    def prepare_spec(self, rt: RuntimeRef, spec: dict, *, visible_devices: bool = False) -> None:
        pass   # CPU containers: nothing to mount


class FakeRestorer:
    def __init__(self) -> None:
        self.undone: list[tuple[str, str]] = []

    def undo_restore(self, h, rt, key, reason, quarantine=True) -> None:
        self.undone.append((rt.container_id, reason))

    def count_stream(self, lease) -> None:
        pass


class FakeAutoCheckpointer:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def maybe(self, key: str, job, what: str = "", pod=None) -> None:
        self.asked.append(key)


class FakeQuarantine:
    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []

    def reason(self, key: str):
        return None

    def failed(self, key: str, reason: str) -> bool:
        self.failures.append((key, reason))
        return False

    def succeeded(self, key: str) -> None:
        pass


@pytest.fixture
def parts(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    runsc = tmp_path / "bin" / "runsc"
    runsc.parent.mkdir()
    runsc.write_text(FAKE_RUNSC)
    runsc.chmod(runsc.stat().st_mode | stat.S_IEXEC)
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_RUNSC_PATH": str(runsc)},
                    config_file=tmp_path / "empty.toml")
    ids = FakePodIdentities()
    containers = Containers(s, Metrics(), ids.container, ids.sandbox)
    pods = Pods(s, tmp_path / "state" / "thawd", containers, FakePreparer(containers, tmp_path / "images"),
                FakeRestorer(), FakeAutoCheckpointer(), FakeQuarantine(), Metrics())
    return pods, tmp_path


def rt_of(tmp: Path, cid: str, spec: dict, pods: Pods | None = None) -> RuntimeRef:
    """A container the shim created, whose record its create began (as Thawd.prepare_restore does)."""
    b = tmp / "bundles" / cid
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(spec))
    r = RuntimeRef.validate(cid, str(b), "/run/test-root", ["--root=/run/test-root"])
    if pods is not None:
        pods.containers.begin(r)
    return r


def members_of(pods: Pods, tmp: Path, sid: str, names=("app", "sidecar")) -> dict[str, tuple[RuntimeRef, dict]]:
    out = {}
    for name in names:
        m = member(name)
        m["annotations"]["io.kubernetes.cri.sandbox-id"] = sid
        out[name] = (rt_of(tmp, f"{sid}-{name}", m, pods), m)
    return out


def test_a_cold_pod_asks_for_its_checkpoint_once_assembled_and_started(parts):
    pods, tmp = parts
    box_spec = sandbox(uid="uid-1")
    box = rt_of(tmp, "s1", box_spec, pods)
    d = pods.prepare_sandbox(box, box_spec)
    assert not d.restore and d.reason.startswith("no-image") and pods.preparer.claimed == []
    ms = members_of(pods, tmp, "s1")
    for r, spec in ms.values():
        assert pods.prepare_member(r, spec).reason.startswith("pod-cold")
    for r, spec in ms.values():
        pods.cold_started(r, spec)
    table = pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0]
    assert table.key == podmod.key(lookup(sandbox(), ["app", "sidecar"]),
                                      {n: identity(member(n)) for n in ("app", "sidecar")})
    assert pods.autocheckpoint.asked == [table.key]


def test_the_next_pod_leases_the_tables_image_and_a_differing_member_fails_it(parts):
    pods, tmp = parts
    test_a_cold_pod_asks_for_its_checkpoint_once_assembled_and_started(parts)
    key = pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key
    box_spec = sandbox(uid="uid-2")
    box = rt_of(tmp, "s2", box_spec, pods)
    d = pods.prepare_sandbox(box, box_spec)
    assert d.restore and pods.preparer.claimed == [key] and pods.pod_of(box, box_spec).state == RESTORING
    other = member("app", image="thaw.dev/web:2")
    other["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    dm = pods.prepare_member(rt_of(tmp, "s2-app", other, pods), other)
    assert not dm.restore and dm.reason.startswith("pod-failed: container-mismatch")
    assert pods.containers.lease_of(box) is None, "the failed pod's image lease went"
    assert pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), hint_of(box_spec))[0] is None, \
        "this node picks the table no more for pods of that version"
    assert "delete --force s2" in (tmp / "bin" / "argv.log").read_text(), "its sandbox was removed"
