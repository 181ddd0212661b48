"""Which room answers a request of the containerd door (control/thawd/roles.py), with
fakes of the rooms that record what they were asked: a pod's pause or app container
goes to the pods, a lone container to the preparer, restorer and automatic checkpoint;
create's decision is logged with its fields and counted once, whatever the role; a
pod's cold start is an Event on it. The container records and the metrics table are real."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from control import config
from control.errors import UserError
from control.thawd.containers import Containers, Decision, RuntimeRef, State
from control.thawd.metrics import Metrics
from control.thawd.roles import Roles
from tests.unit.test_pod import member, sandbox

LONE = {"thaw.dev/workload": "web"}


class Recorder:
    """A room that records each call (its name, then the container id of the first
    RuntimeRef it got, else its string arguments) and answers `answers[name]`."""

    def __init__(self, calls: list, answers: dict) -> None:
        self.calls, self.answers = calls, answers

    def __getattr__(self, name: str):
        def call(*args, **kw):
            rt = next((a for a in args if isinstance(a, RuntimeRef)), None)
            self.calls.append((name, rt.container_id) if rt else (name, *(a for a in args if isinstance(a, str))))
            return self.answers.get(name)
        return call


class ColdEvents:
    """control/thawd/events.py's Events as Roles uses it: the cold starts it posts."""

    def __init__(self) -> None:
        self.cold_starts: list = []

    def cold(self, pod, reason: str) -> None:
        self.cold_starts.append((pod, reason))


@pytest.fixture
def roles(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state")}, config_file=tmp_path / "empty.toml")
    metrics = Metrics()
    containers = Containers(s, metrics, identify=None, identify_sandbox=None)
    calls: list = []
    answers = {"prepare_sandbox": Decision(True, "image-ready", "t.web.pod-key", "/img", 10.0),
               "prepare_member": Decision(False, "pod-cold: no-image", "t.web.pod"),
               "lone": Decision(False, "no-image", "t.web.0123456789abcdef"),
               "restore_member": (True, "registered", 0.1), "restore_sandbox": (True, "sandbox registered", 0.1)}
    rooms = {n: Recorder(calls, answers) for n in ("preparer", "restorer", "autocheckpoint", "pods", "parking")}
    r = Roles(containers, rooms["preparer"], rooms["restorer"], rooms["autocheckpoint"], rooms["pods"],
              rooms["parking"], metrics, ColdEvents())
    r.calls, r.tmp, r.answers = calls, tmp_path, answers
    return r


def rt_of(tmp: Path, cid: str, spec: dict) -> RuntimeRef:
    b = tmp / "bundles" / cid
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(spec))
    return RuntimeRef.validate(cid, str(b), "/run/r", ["--root=/run/r"])


def test_create_goes_to_the_room_of_the_containers_role_and_is_counted_once(roles, caplog):
    caplog.set_level(logging.INFO, logger="thawd")
    from runsc_hooks import spec as specmod
    box = rt_of(roles.tmp, "s1", sandbox())
    app = rt_of(roles.tmp, "s1-app", member("app"))
    lone = rt_of(roles.tmp, "c1", specmod.command_spec(["/x"], rootfs="r", annotations=LONE))
    plain = rt_of(roles.tmp, "c2", specmod.command_spec(["/x"], rootfs="r"))
    assert roles.prepare(box, "null,pipe,pipe").restore
    assert roles.prepare(app).reason.startswith("pod-cold")
    assert roles.prepare(lone).reason == "no-image"
    assert roles.prepare(plain).reason == "not-opted-in"
    assert [c[:2] for c in roles.calls] == [("prepare_sandbox", "s1"), ("prepare_member", "s1-app"), ("lone", "c1")]
    assert roles.containers.stdio_of(box) == "null,pipe,pipe" and roles.containers.state_of(plain) == State.PREPARING
    c = roles.metrics.counters()
    assert c.get("thaw_restore_decisions_total") == 1
    assert c.get('thaw_cold_decisions_total{reason="pod-cold"}') == 1 and \
        c.get('thaw_cold_decisions_total{reason="no-image"}') == 1 and \
        c.get('thaw_cold_decisions_total{reason="not-opted-in"}') == 1
    lines = {r.fields["container"]: r.fields for r in caplog.records if r.getMessage().startswith("prepare ")}
    assert lines["s1"] == {"container": "s1", "key": "t.web.pod-key", "tenant": "t", "decision": "restore",
                           "reason": "image-ready"}
    assert lines["c2"] == {"container": "c2", "decision": "cold", "reason": "not-opted-in"}


def test_start_goes_to_the_room_of_the_containers_role(roles):
    box = rt_of(roles.tmp, "s1", sandbox())
    app = rt_of(roles.tmp, "s1-app", member("app"))
    assert roles.restore(box)[0] and roles.restore(app, subcontainer_restored=True)[0]
    lone = rt_of(roles.tmp, "c1", sandbox(ann={}) | {"annotations": LONE})
    roles.restore(lone)
    assert [c[:2] for c in roles.calls] == [("restore_sandbox", "s1"), ("restore_member", "s1-app"), ("lone", "c1")]
    # A pod's app container restores only after its own runsc restore, and only it says so.
    with pytest.raises(UserError, match="subcontainer_restored"):
        roles.restore(app)
    with pytest.raises(UserError, match="subcontainer_restored"):
        roles.restore(lone, subcontainer_restored=True)


def test_a_pods_cold_start_is_an_event_on_the_pod_whether_decided_at_create_or_after_a_failed_restore(roles):
    from control.lifecycle.pod import PodRef
    box = rt_of(roles.tmp, "s1", sandbox(ann={"io.kubernetes.cri.sandbox-namespace": "ns1",
                                              "thaw.dev/workload": "web", "thaw.dev/ready": "tcp:80"}))
    roles.answers["prepare_sandbox"] = Decision(False, "no-image: none yet", "t.web.pod")
    roles.answers["restore_sandbox"] = (False, "runsc restore: exit status 1", 0.2)
    assert not roles.prepare(box).restore
    assert not roles.restore(box)[0]
    ref = PodRef("ns1", "web-0", "uid-1")
    assert roles.events.cold_starts == [(ref, "no-image: none yet"),
                                        (ref, "the sandbox's restore failed: runsc restore: exit status 1")]
    lone = rt_of(roles.tmp, "c1", specmod_lone())
    roles.prepare(lone)
    assert len(roles.events.cold_starts) == 2, "a lone container has no pod to post on"


def specmod_lone() -> dict:
    from runsc_hooks import spec as specmod
    return specmod.command_spec(["/x"], rootfs="r", annotations=LONE)


def test_a_start_whose_bundle_cannot_be_read_ends_its_lone_decision(roles):
    gone = RuntimeRef.validate("c9", str(roles.tmp / "nowhere"), "/run/r", [])
    roles.restore(gone)
    assert roles.calls == [("lone", "c9")], "the lone room records the outcome, with why"


def test_outcomes_go_to_the_room_of_the_containers_role(roles):
    box = rt_of(roles.tmp, "s1", sandbox())
    lone = rt_of(roles.tmp, "c1", sandbox(ann={}) | {"annotations": LONE})
    roles.report(box, "COLD_STARTED", "no-image")
    roles.report(lone, "RESTORE_FAILED", "runsc create: exit status 1", key="k1")
    roles.report(lone, "COLD_STARTED", "no-image", key="k1")
    assert [c[:2] for c in roles.calls] == [("outcome", "s1"), ("failed", "c1"), ("cold_started", "c1")]
    with pytest.raises(UserError, match="RESTORED"):
        roles.report(lone, "RESTORED", "")   # thawd records restores itself, in Restore


def test_release_takes_the_record_the_pod_membership_and_an_adopted_sandbox(roles):
    rt = rt_of(roles.tmp, "c1", member("app"))
    roles.containers.recover_adoption(rt, "thaw-parked-1")
    assert roles.release("c1", "/run/r") is False   # it held no image lease
    assert roles.calls == [("forget", "/run/r", "c1"), ("release", "thaw-parked-1", "c1")]
    assert roles.containers.get(rt) is None
