"""thawd's pods (control/thawd/pods.py) given small fakes of the parts it uses, not a
daemon: the preparer that leases an image and prepares a container's spec, the
restorer that undoes a restore and counts a stream, the automatic checkpoint, the
quarantine. The container records (control/thawd/containers.py, with a fake of
containerd's identities), the metrics table, bundles, specs and the pod tables are
real; the runsc the engine runs is a fake that records its argv (FAKE_RUNSC).

What the real parts do with a pod's container is their own tests': the spec a
pod's container gets (tests/unit/test_prepare.py), the checkpoint of a GPU pod's
sandbox (tests/unit/test_autocheckpoint.py), the role routing
(tests/unit/test_roles.py); a pod under containerd's CRI with real runsc is
tests/integration/test_cri_restore.py's."""
from __future__ import annotations

import json
import logging
import stat
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from control import config
from control.errors import IdentityError, IntegrityError, NoSpace, UserError
from control.lifecycle import pod as podmod
from control.lifecycle.workload import workload_of
from control.thawd.containers import Containers, Decision, RuntimeRef, State
from control.thawd.ctrinfo import Identity
from control.thawd.metrics import Metrics
from control.thawd.podtables import hint_of
from control.thawd.pods import Pods
from control.thawd.standin import Standin
from runsc_hooks import spec as specmod
from tests.unit.test_pod import POD_ANN, TENANT, digest, identity, lookup, member, sandbox

FAKE_RUNSC = """#!/bin/sh
echo "$@${GVISOR_SIDECAR_BINARIES_DIR:+ sidecars=$GVISOR_SIDECAR_BINARIES_DIR}" >> "$(dirname "$0")/argv.log"
case " $* " in
  *" state "*) echo '{"id": "x", "status": "running", "pid": 1, "bundle": "/b"}' ;;
  *" restore "*) [ -e "$(dirname "$0")/fail-restore" ] && exit 1 ;;
esac
exit 0
"""


class FakePodIdentities:
    """containerd's records as ctrinfo tells them: every pod in TENANT, a member's
    image digest by its image name (test_pod.digest); `fail[container id]` raises."""

    def __init__(self) -> None:
        self.fail: dict[str, IdentityError] = {}

    def container(self, rt: RuntimeRef) -> Identity:
        if rt.container_id in self.fail:
            raise self.fail[rt.container_id]
        spec = specmod.Bundle(rt.bundle).load()
        if podmod.role(spec) == podmod.SANDBOX:   # as ctrinfo.identify: the CRI plugin records no digest
            raise IdentityError("no-image-digest", "the CRI plugin recorded no image digest for this container")
        return Identity(TENANT, digest(spec), "test")

    def sandbox(self, rt: RuntimeRef) -> Identity:
        if rt.container_id in self.fail:
            raise self.fail[rt.container_id]
        return Identity(TENANT, "", "test sandbox")


class FakeLease:
    """A leased image (control/images/source.py Restorable) from the cache."""
    streamed, hit = False, True

    def __init__(self, path: Path) -> None:
        self.path, self.released = path, False

    def env(self) -> dict:
        return {}

    def verdict(self, wait_s: float = 0):
        return None

    def describe(self, holder: str) -> None:
        self.holder = holder

    def release(self) -> None:
        self.released = True


class FakeStream(FakeLease):
    """A streamed image: the sidecar directory runsc takes thaw-gofer from, and how the
    stream ended (`error` None: installed)."""
    streamed, hit = True, False

    def __init__(self, path: Path, error=None) -> None:
        super().__init__(path)
        self.error = error

    def env(self) -> dict:
        return {"GVISOR_SIDECAR_BINARIES_DIR": str(self.path.parent / "sidecars")}

    def verdict(self, wait_s: float = 0):
        return self.error


class FakePreparer:
    """control/thawd/prepare.py's part in a pod: `claim_image` leases a key's image when
    `available` holds the key (a FakeLease, or what `lease_for` makes), else answers
    cold as claim_image does; `prepare_spec` records whom it prepared and raises
    what `spec_errors[container id]` holds."""

    def __init__(self, containers: Containers, images: Path) -> None:
        self.containers, self.images = containers, images
        self.available: set[str] = set()
        self.lease_for = lambda key: FakeLease(images / key)
        self.claimed: list[str] = []
        self.leases: list[FakeLease] = []
        self.specs: list[tuple[str, bool]] = []
        self.spec_errors: dict[str, Exception] = {}

    def claim_image(self, rt: RuntimeRef, spec: dict, key: str, t0=None) -> Decision:
        self.claimed.append(key)
        if key not in self.available:
            self.containers.decide(rt, State.COLD, key, reason="no-image")
            return Decision(False, "no-image", key)
        lease = self.lease_for(key)
        self.leases.append(lease)
        self.containers.claim(rt, lease)
        self.containers.decide(rt, State.RESTORE, key)
        return Decision(True, "image-ready", key, str(lease.path), 10.0)

    def restore_deadline_s(self, spec: dict, image=None) -> float:
        return 10.0

    def prepare_spec(self, rt: RuntimeRef, spec: dict, *, visible_devices: bool = False) -> None:
        self.specs.append((rt.container_id, visible_devices))
        if rt.container_id in self.spec_errors:
            raise self.spec_errors[rt.container_id]


class FakeRestorer:
    def __init__(self) -> None:
        self.undone: list[tuple[str, str, bool]] = []
        self.streams: list = []

    def undo_restore(self, h, rt, key, reason, quarantine=True) -> None:
        self.undone.append((rt.container_id, reason, quarantine))

    def count_stream(self, lease) -> None:
        self.streams.append(lease)


class FakeAutoCheckpointer:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.checkpoints: list[dict] = []

    def maybe(self, key: str, job, what: str = "", pod=None) -> None:
        self.asked.append(key)

    def checkpoint(self, rt, leave_running=True, key=None, hooks_rt=None, members=None) -> dict:
        self.checkpoints.append({"id": rt.container_id, "key": key, "hooks_on": hooks_rt.container_id,
                                 "members": {n: m.container_id for n, m in (members or {}).items()}})
        return {"workload_key": key, "published": True}


class FakeQuarantine:
    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []
        self.successes: list[str] = []

    def reason(self, key: str):
        return None

    def failed(self, key: str, reason: str) -> bool:
        self.failures.append((key, reason))
        return False

    def succeeded(self, key: str) -> None:
        self.successes.append(key)


@pytest.fixture
def env(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    runsc = tmp_path / "bin" / "runsc"
    runsc.parent.mkdir()
    runsc.write_text(FAKE_RUNSC)
    runsc.chmod(runsc.stat().st_mode | stat.S_IEXEC)
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_RUNSC_PATH": str(runsc)},
                    config_file=tmp_path / "empty.toml")
    ids, metrics = FakePodIdentities(), Metrics()
    containers = Containers(s, metrics, ids.container, ids.sandbox)
    pods = Pods(s, tmp_path / "state" / "thawd", containers, FakePreparer(containers, tmp_path / "images"),
                FakeRestorer(), FakeAutoCheckpointer(), FakeQuarantine(), metrics)
    yield SimpleNamespace(pods=pods, tmp=tmp_path, ids=ids, metrics=metrics, preparer=pods.preparer,
                          restorer=pods.restorer, autocheckpoint=pods.autocheckpoint, quarantine=pods.quarantine,
                          argv=tmp_path / "bin" / "argv.log")
    containers.close()


def rt_of(tmp: Path, cid: str, spec: dict) -> RuntimeRef:
    b = tmp / "bundles" / cid
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(spec))
    return RuntimeRef.validate(cid, str(b), "/run/test-root", ["--root=/run/test-root"])


def box_spec(sid: str, uid: str, ann: dict | None = None) -> dict:
    sp = sandbox(ann, uid=uid)
    sp["annotations"]["io.kubernetes.cri.sandbox-id"] = sid
    return sp


def member_of(sid: str, name: str, **kw) -> dict:
    m = member(name, **kw)
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = sid
    return m


def create(e, cid: str, spec: dict) -> tuple[RuntimeRef, Decision]:
    """A pod's container created, as control/thawd/roles.py hands it to Pods: its record
    begins, then its pod decides."""
    rt = rt_of(e.tmp, cid, spec)
    e.pods.containers.begin(rt)
    if podmod.role(spec) == podmod.SANDBOX:
        return rt, e.pods.prepare_sandbox(rt, spec)
    return rt, e.pods.prepare_member(rt, spec)


def started_cold(e, rt: RuntimeRef, spec: dict, reason: str = "") -> None:
    e.pods.outcome(rt, spec, "COLD_STARTED", reason)


def cold_pod(e, sid: str = "s1", uid: str = "uid-1", images=("thaw.dev/web:1",) * 2) -> dict:
    """A pod the kubelet starts cold: pause, app, sidecar (create, then start, each)."""
    spec = box_spec(sid, uid)
    box, d = create(e, sid, spec)
    decisions = {"sandbox": d}
    started_cold(e, box, spec, d.reason)
    for name, image in zip(("app", "sidecar"), images):
        m = member_of(sid, name, image=image)
        r, decisions[name] = create(e, f"{sid}-{name}", m)
        started_cold(e, r, m, decisions[name].reason)
    return decisions


def table_key(e, names=("app", "sidecar")) -> str:
    return e.pods.tables.pick(lookup(sandbox(), list(names)), "")[0].key


def restoring_pod(e, sid: str = "s2", uid: str = "uid-2") -> tuple[RuntimeRef, str]:
    """After a cold pod of the workload: its image is there, and the next sandbox restores it."""
    cold_pod(e)
    key = table_key(e)
    e.preparer.available.add(key)
    box, d = create(e, sid, box_spec(sid, uid))
    assert d.restore and d.key == key, d
    return box, key


def test_a_cold_pod_is_keyed_by_its_containers_and_checkpointed_once_all_started(env):
    d = cold_pod(env)
    assert not d["sandbox"].restore and d["sandbox"].reason.startswith("no-image") and env.preparer.claimed == []
    assert [d[n].reason.split(":")[0] for n in ("app", "sidecar")] == ["pod-cold", "pod-cold"]
    lk = lookup(sandbox(), ["app", "sidecar"])
    table = env.pods.tables.pick(lk, "")[0]
    assert table.key == podmod.key(lk, {n: identity(member(n)) for n in ("app", "sidecar")})
    assert env.autocheckpoint.asked == [table.key]   # once, after the last declared container started
    assert env.metrics.counters().get("thaw_cold_starts_total") == 3


def test_a_pod_whose_identity_cannot_be_told_starts_cold_and_is_never_keyed(env):
    """The sandbox's tenant or a member's image digest unknown (ctrinfo): that pod is
    cold with the reason, gets no table, and is never checkpointed."""
    env.ids.fail["s1"] = IdentityError("identity-unknown", "containerd did not answer")
    d = cold_pod(env)
    assert not d["sandbox"].restore and d["sandbox"].reason.startswith("identity-unknown: containerd did not")
    assert all(d[n].reason.startswith("pod-cold: identity-unknown") for n in ("app", "sidecar"))
    assert env.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0] is None
    assert env.autocheckpoint.asked == []
    env.ids.fail = {"s2-sidecar": IdentityError("no-image-digest", "no digest recorded")}
    d = cold_pod(env, sid="s2", uid="uid-2")
    assert d["app"].reason.startswith("pod-cold: no-image") and d["sidecar"].reason.startswith(
        "pod-cold: no-image-digest: no digest recorded (container 'sidecar')")
    assert env.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0] is None
    assert env.autocheckpoint.asked == []


def test_a_member_whose_identity_cannot_be_told_fails_a_restoring_pod(env):
    restoring_pod(env)
    env.ids.fail["s2-app"] = IdentityError("image-moved", "the tag moved")
    _, d = create(env, "s2-app", member_of("s2", "app"))
    assert not d.restore and d.reason.startswith("pod-failed: image-moved: the tag moved (container 'app')")


def test_the_next_pod_restores_with_the_image_of_its_container_set(env):
    box, key = restoring_pod(env)
    assert env.preparer.claimed == [key] and env.pods.pod_of(box, box_spec("s2", "uid-2")).state == "restoring"
    for name in ("app", "sidecar"):
        _, dm = create(env, f"s2-{name}", member_of("s2", name))
        assert dm.restore and dm.key == key and dm.image_path == str(env.tmp / "images" / key), dm
    # Its GPUs and CUDA helper (the preparer's) come before its identity, for every app container.
    assert [s for s in env.preparer.specs if s[0].startswith("s2-")] == [("s2-app", True), ("s2-sidecar", True)]


def restored_pod(e, lease_for=None) -> tuple[RuntimeRef, str, dict]:
    """A pod restored whole: its sandbox's `runsc restore` (thawd's), then each app
    container's (the stand-in's) registered with Restore."""
    cold_pod(e)
    key = table_key(e)
    e.preparer.available.add(key)
    if lease_for is not None:
        e.preparer.lease_for = lease_for
    spec = box_spec("s2", "uid-2")
    box, d = create(e, "s2", spec)
    assert d.restore
    ok, detail, _ = e.pods.restore_sandbox(box)
    assert ok, detail
    members = {}
    for name in ("app", "sidecar"):
        m = member_of("s2", name)
        rt, dm = create(e, f"s2-{name}", m)
        assert dm.restore
        members[name] = (rt, m)
    return box, key, members


def test_a_pod_whose_image_streams_restores_through_thaw_gofer(env):
    """store.stream for a pod (issue 18): the sandbox's `runsc restore`, the only one
    that reads the image, gets thaw-gofer's sidecar directory and --background, as a
    lone container's; the members' restores are the stand-in's. The stream is counted
    once the pod is restored."""
    box, key, members = restored_pod(env, lambda k: FakeStream(env.tmp / "images" / k))
    [line] = [x for x in env.argv.read_text().splitlines() if " restore " in f" {x} "]
    images = env.tmp / "images"
    assert line.endswith(f"--image-path={images / key} --detach --background s2 sidecars={images / 'sidecars'}"), line
    rt, m = members["app"]
    ok, detail, _ = env.pods.restore_member(rt, m)
    assert ok and detail.startswith("registered") and env.restorer.streams == []
    rt, m = members["sidecar"]
    ok, detail, _ = env.pods.restore_member(rt, m)
    assert ok, detail
    assert env.restorer.streams == env.preparer.leases and len(env.preparer.leases) == 1
    assert env.metrics.counters().get("thaw_restores_total") == 1 and env.quarantine.successes == [key]


def test_a_restored_pod_observes_its_workloads_restore_histogram(env):
    """issue 33: a pod's restore is in thaw_restore_seconds by workload, as a lone
    container's (control/thawd/restore.py _restored)."""
    box, key, members = restored_pod(env)
    for rt, m in members.values():
        assert env.pods.restore_member(rt, m)[0]
    series = [x for x in env.metrics.render().splitlines() if x.startswith("thaw_restore_seconds_count{")]
    assert series == [f'thaw_restore_seconds_count{{workload="{workload_of(key)}"}} 1.0'], series


def test_a_pods_decision_lines_carry_their_facts_as_fields(env, caplog):
    """issue 33: which image a pod restores, and why a pod is removed (it starts cold in
    its next sandbox), are lines whose container, key, decision and reason are fields."""
    caplog.set_level(logging.INFO, logger="thawd")
    box, key = restoring_pod(env)
    _, d = create(env, "s2-app", member_of("s2", "app", image="thaw.dev/web:2"))
    assert not d.restore

    [restores] = [r.fields for r in caplog.records if r.getMessage().startswith("pod s2 ")
                  and f": restores {key} " in r.getMessage()]
    assert restores["container"] == "s2" and restores["key"] == key and restores["decision"] == "restore"
    assert restores["reason"] == "pod table from the node"
    [failed] = [r.fields for r in caplog.records if "removing its sandbox" in r.getMessage()]
    assert failed["container"] == "s2" and failed["key"] == key and failed["decision"] == "pod-failed"
    assert failed["reason"].startswith("container-mismatch: container 'app' differs")


@pytest.mark.parametrize("where", ["sandbox", "last-container", "assembly-timeout"])
@pytest.mark.parametrize("error, counted", [
    (NoSpace("no space left in the cache file system /c for image 'k' (9 bytes)", path="/c"), False),
    (IntegrityError("store", "ab" * 32, "bytes at packs/p1 offset 7 hash to cd..."), True)])
def test_a_pod_whose_stream_failed_says_why(env, where, error, counted):
    """The stream failed, so the gofer failed the sentry's reads and runsc failed the
    restore: the sandbox's (thawd's `runsc restore`: the pod starts cold) or the last
    container's (the stand-in's: the pod is removed); or the pod's assembly timed out
    after it failed. The reason is the stream's, and it counts towards quarantine only
    when the store served wrong bytes, as for a lone container."""
    cold_pod(env)
    key = table_key(env)
    env.preparer.available.add(key)
    env.preparer.lease_for = lambda k: FakeStream(env.tmp / "images" / k, error)
    spec = box_spec("s2", "uid-2")
    box, d = create(env, "s2", spec)
    assert d.restore
    if where == "sandbox":
        (env.tmp / "bin" / "fail-restore").touch()
        ok, reason, _ = env.pods.restore_sandbox(box)
        assert not ok and env.pods.pod_of(box, spec).state == "cold"
        assert env.restorer.undone == [("s2", reason, counted)], "undone, counted as the stream's failure says"
    else:
        assert env.pods.restore_sandbox(box)[0]
        members = {n: member_of("s2", n) for n in ("app", "sidecar")}
        rts = {n: create(env, f"s2-{n}", m)[0] for n, m in members.items()}
        p = env.pods.pod_of(box, spec)
        if where == "assembly-timeout":
            env.pods._assembly_deadline(p, 120)   # what the timer calls once thawd.pod_assembly_timeout_s passed
        else:
            env.pods.outcome(rts["sidecar"], members["sidecar"], "RESTORE_FAILED", "runsc restore: exit status 128")
        assert p.state == "failed" and "delete --force s2" in env.argv.read_text()
        reason = p.reason
        assert bool(env.quarantine.failures) is counted
        assert env.preparer.leases[0].released and env.pods.containers.lease_of(box) is None
    assert reason.startswith(f"{type(error).__name__}: the image's stream failed: "), reason


def test_a_container_that_differs_fails_the_pod_and_its_next_sandbox_starts_cold(env):
    box, key = restoring_pod(env)
    _, d = create(env, "s2-sidecar", member_of("s2", "sidecar", image="thaw.dev/web:2"))
    assert not d.restore and d.reason.startswith("pod-failed: container-mismatch: container 'sidecar' differs")
    assert "workload key" in d.reason
    assert "delete --force s2" in env.argv.read_text()   # the sandbox is removed
    assert env.preparer.leases[0].released and env.pods.containers.lease_of(box) is None, "its lease went"
    lk = lookup(sandbox(), ["app", "sidecar"])
    assert env.pods.tables.pick(lk, hint_of(sandbox()))[0] is None, "this node picks that set no more for its version"
    # The kubelet's next sandbox for that pod (same uid) starts cold, and says why.
    _, again = create(env, "s3", box_spec("s3", "uid-2"))
    assert not again.restore and again.reason.startswith("pod-failed-before")
    assert env.metrics.counters().get('thaw_fallbacks_total{reason="container-mismatch"}') == 1


def test_a_container_the_image_does_not_hold_fails_the_pod(env):
    restoring_pod(env)
    _, d = create(env, "s2-other", member_of("s2", "other"))
    assert d.reason.startswith("pod-failed: container-mismatch: container 'other' is not one of the image's")


def test_another_declared_set_is_another_lookup_and_starts_cold(env):
    cold_pod(env)
    env.preparer.available.add(table_key(env))
    ann = {k: v for k, v in POD_ANN.items() if "sidecar" not in k} | {"thaw.dev/ready.other": "running"}
    _, d = create(env, "s2", box_spec("s2", "uid-2", ann))
    assert not d.restore and d.reason.startswith("no-image")


def test_a_container_recreated_in_a_running_pod_starts_cold(env):
    cold_pod(env)
    _, d = create(env, "s1-app-1", member_of("s1", "app"))   # the kubelet's restart of a container that exited
    assert not d.restore and d.reason.startswith("pod-running")
    assert len(env.autocheckpoint.asked) == 1


def test_undeclared_containers_and_pods_declaring_none_are_not_checkpointed(env):
    _, d = create(env, "s1", box_spec("s1", "uid-1", {"thaw.dev/workload": "web"}))
    assert not d.restore and d.reason.startswith("no-declared-containers")
    cold_pod(env, sid="s2")
    m = member_of("s2", "extra")
    r, _ = create(env, "s2-extra", m)
    started_cold(env, r, m)
    assert len(env.autocheckpoint.asked) == 1   # the one of the complete pod, before the extra container came


def test_a_single_container_pod_with_a_pod_wide_probe_is_the_same_path(env):
    """thaw.dev/ready alone (deploy/kubernetes/examples/pod.yaml): the pod's one
    container, named when the kubelet creates it."""
    ann = {"thaw.dev/workload": "llm", "thaw.dev/ready": "file:/tmp/ready"}

    def run(sid, uid):
        d = [create(env, sid, box_spec(sid, uid, ann))[1]]
        m = member_of(sid, "server", ann=ann)
        r, dm = create(env, f"{sid}-server", m)
        d.append(dm)
        started_cold(env, r, m, dm.reason)
        return d

    cold = run("s1", "u1")
    assert [x.restore for x in cold] == [False, False] and len(env.autocheckpoint.asked) == 1
    env.preparer.available.add(env.autocheckpoint.asked[0])
    warm = run("s2", "u2")
    assert [x.restore for x in warm] == [True, True] and warm[1].key == env.autocheckpoint.asked[0]


def test_a_pod_stopped_while_restoring_is_removed_and_a_running_one_is_not(env):
    restoring_pod(env)
    m = member_of("s2", "app")
    app, d = create(env, "s2-app", m)
    assert d.restore
    env.pods.outcome(app, m, "RESTORE_FAILED", "stopped-while-restoring: kill: exit status 128")
    assert "delete --force s2" in env.argv.read_text()
    # A restored pod's failed kill (say, of a container that already exited) is runsc's business.
    env.pods._get("/run/test-root", "s1").state = "restored"
    m1 = member_of("s1", "app")
    before = env.argv.read_text()
    env.pods.outcome(rt_of(env.tmp, "s1-app-x", m1), m1, "RESTORE_FAILED",
                     "stopped-while-restoring: kill: exit status 1")
    assert env.argv.read_text() == before


def test_a_pause_container_whose_create_failed_leaves_its_pod_cold(env):
    """The stand-in could not even try the sandbox's restore (its create failed): the
    pod is cold, the record ends cold-fallback, and nothing is removed."""
    box, key = restoring_pod(env)
    spec = box_spec("s2", "uid-2")
    env.pods.outcome(box, spec, "RESTORE_FAILED", "runsc create: exit status 1")
    p = env.pods.pod_of(box, spec)
    assert p.state == "cold" and p.reason == "restore could not be tried: runsc create: exit status 1"
    assert env.pods.containers.state_of(box) == State.COLD_FALLBACK
    assert not env.argv.exists(), "no runsc ran: nothing is removed"


def _standin_process(tmp: Path, cid: str, decision: str):
    """A process named like the stand-in (argv[0]) and its marker saying `decision`."""
    marker = tmp / f"marker-{cid}.json"
    marker.write_text(json.dumps({"id": cid, "decision": decision}))
    p = subprocess.Popen(["bash", "-c", "exec -a thaw-runsc-hooks sleep 30"])
    for _ in range(200):   # until bash has exec'ed
        if Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"thaw-runsc-hooks"):
            break
        time.sleep(0.01)
    s = Standin.validate(p.pid, str(marker))
    s.observe()   # as control/thawd/roles.py does first: its identity, while it surely lives
    return p, s


def test_a_pod_whose_standin_dies_before_committing_its_start_is_removed(env):
    """The stand-in kill safety (issue 14) for pods: a pod container's stand-in that
    exits having committed its start keeps the pod; one killed after thawd's answer,
    before its commit, is a start containerd reports failed: thawd removes the pod."""
    box, key = restoring_pod(env)
    procs = []
    try:
        p, s = _standin_process(env.tmp, "s2", "restored")        # the pause container's, committed
        procs.append(p)
        ok, detail, _ = env.pods.restore_sandbox(box, standin=s)
        assert ok, detail
        m = member_of("s2", "app")
        app, d = create(env, "s2-app", m)
        assert d.restore
        p, s = _standin_process(env.tmp, "s2-app", "restore")     # the app's, killed before its commit
        procs.append(p)
        ok, detail, _ = env.pods.restore_member(app, m, standin=s)
        assert ok, detail
        procs[0].kill()
        time.sleep(0.3)
        assert "delete --force s2" not in env.argv.read_text()    # the committed one kept the pod
        p.kill()
        for _ in range(100):
            if "delete --force s2" in env.argv.read_text():
                break
            time.sleep(0.05)
        assert "delete --force s2" in env.argv.read_text()
        assert env.pods._get("/run/test-root", "s2").state == "failed"
        assert env.quarantine.failures == [], "not the image's fault"
    finally:
        for p in procs:
            p.kill()
            p.wait()


# -- GPU containers in pods (issue 28) ------------------------------------------------

def gpu_member(name: str, sid: str = "s2", minors=(0,)) -> dict:
    """An app container holding the GPUs of `minors` (as containerd's CDI injection leaves them)."""
    m = member_of(sid, name)
    m.setdefault("linux", {})["devices"] = [
        {"path": p, "type": "c", "major": 195, "minor": n}
        for p, n in [("/dev/nvidiactl", 255), *((f"/dev/nvidia{i}", i) for i in minors)]]
    return m


def test_a_gpu_pod_is_checkpointed_with_its_gpu_containers_named(env, monkeypatch):
    """The pause container's checkpoint names the GPU containers (runsc runs the CUDA
    helper in each CUDA process's own container), the CPU sidecar goes along, and the
    profile's hooks run against the pod's first container."""
    from control.lifecycle.engine import Engine
    monkeypatch.setattr(Engine, "check", lambda self, h, probes, policy=None: type(
        "R", (), {"healthy": True, "summary": lambda s: "ok"})())
    spec = box_spec("s2", "uid-2")
    box, d = create(env, "s2", spec)
    started_cold(env, box, spec, d.reason)
    for cid, m in (("s2-app", gpu_member("app")), ("s2-sidecar", member_of("s2", "sidecar"))):
        r, _ = create(env, cid, m)
        started_cold(env, r, m)
    [key] = env.autocheckpoint.asked
    res = env.pods._auto_checkpoint(env.pods.pod_of(box, spec))
    assert res["published"]
    assert env.autocheckpoint.checkpoints == [{"id": "s2", "key": key, "hooks_on": "s2-app",
                                               "members": {"app": "s2-app", "sidecar": "s2-sidecar"}}]


def test_a_spec_the_preparer_refuses_keeps_a_cold_pod_cold_and_fails_a_restoring_one(env):
    """The preparer's ThawError for an app container (a NVIDIA_VISIBLE_DEVICES value
    that names no GPU of this node: tests/unit/test_prepare.py) makes a cold pod
    unkeyed, and a restoring pod cannot take that container: it fails."""
    env.preparer.spec_errors["s1-sidecar"] = UserError("NVIDIA_VISIBLE_DEVICES='gpu-one' names no GPU")
    d = cold_pod(env)
    assert d["sidecar"].reason == "pod-cold: spec: container 'sidecar': NVIDIA_VISIBLE_DEVICES='gpu-one' names " \
                                  "no GPU"
    assert env.autocheckpoint.asked == [], "a pod whose spec thaw cannot prepare is never checkpointed"
    env.preparer.spec_errors = {}
    cold_pod(env, sid="s2", uid="uid-2")
    env.preparer.available.add(table_key(env))
    assert create(env, "s3", box_spec("s3", "uid-3"))[1].restore
    env.preparer.spec_errors["s3-app"] = UserError("NVIDIA_VISIBLE_DEVICES='gpu-one' names no GPU")
    _, d = create(env, "s3-app", member_of("s3", "app"))
    assert not d.restore and d.reason.startswith("pod-failed: spec: container 'app': NVIDIA_VISIBLE_DEVICES")


def saved_gpu_image(e, key: str, minors=(0,)) -> Path:
    """The image a cold GPU pod left under `key` (FakePreparer leases images/<key>): its
    thaw.json as autocheckpoint writes a pod's, the app container saved holding `minors`."""
    from control.lifecycle import image_meta
    image = e.tmp / "images" / key
    image.mkdir(parents=True)
    specs = {"app": gpu_member("app", sid="s1", minors=minors), "sidecar": member_of("s1", "sidecar")}
    image_meta.write(image, image_meta.DOOR_CONTAINERD, box_spec("s1", "uid-1"), {"checkpoint.img": 1},
                     image_meta.pod_gpu_needs(specs), 0.1, containers=specs)
    return image


def gpu_pod_saved(e) -> str:
    spec = box_spec("s1", "uid-1")
    box, d = create(e, "s1", spec)
    started_cold(e, box, spec, d.reason)
    create(e, "s1-app", gpu_member("app", sid="s1"))
    create(e, "s1-sidecar", member_of("s1", "sidecar"))
    key = table_key(e)
    saved_gpu_image(e, key)
    e.preparer.available.add(key)
    return key


def test_a_gpu_pod_saved_on_gpu_0_restores_into_a_container_given_gpu_1(env):
    """runsc pairs saved and new GPUs by minor, whatever their numbers: the GPU index is no
    part of a container's identity; the GPUs it holds now are judged as a lone container's."""
    key = gpu_pod_saved(env)
    assert create(env, "s2", box_spec("s2", "uid-2"))[1].restore
    for cid, spec in (("s2-app", gpu_member("app", minors=(1,))), ("s2-sidecar", member_of("s2", "sidecar"))):
        _, d = create(env, cid, spec)
        assert d.restore and d.key == key, (cid, d)


def test_a_restoring_pod_whose_gpu_container_holds_another_gpu_count_fails_with_that_reason(env):
    gpu_pod_saved(env)
    assert create(env, "s2", box_spec("s2", "uid-2"))[1].restore
    _, d = create(env, "s2-app", gpu_member("app", minors=(0, 1)))
    assert not d.restore and "\n" not in d.reason
    assert d.reason == ("pod-failed: container-mismatch: container 'app': spec field linux.devices: the checkpoint "
                        "has 1 GPU(s) (/dev/nvidia0), this restore assigns 2 (/dev/nvidia0, /dev/nvidia1)"), d.reason
    _, again = create(env, "s3", box_spec("s3", "uid-2"))
    assert not again.restore and again.reason.startswith("pod-failed-before") and "2 (/dev/nvidia0" in again.reason


# -- init containers (issue 28) ---------------------------------------------------------

def init_pod(e, sid: str, uid: str, init_image: str = "thaw.dev/init:1") -> dict:
    """A pod the kubelet starts with an init container before its app and sidecar: the
    init container is created, started, and deleted (CRI deletes an exited task) first."""
    spec = box_spec(sid, uid)
    box, d = create(e, sid, spec)
    decisions = {"sandbox": d}
    started_cold(e, box, spec, d.reason)
    m = member_of(sid, "fetch", image=init_image)
    r, decisions["fetch"] = create(e, f"{sid}-fetch", m)
    if not decisions["fetch"].satisfied:
        started_cold(e, r, m, decisions["fetch"].reason)
    e.pods.forget(str(r.runsc_root), r.container_id)                # it exited: CRI deleted its task
    e.pods.containers.release(r)
    for name in ("app", "sidecar"):
        mm = member_of(sid, name)
        rr, decisions[name] = create(e, f"{sid}-{name}", mm)
        if not decisions[name].restore:
            started_cold(e, rr, mm, decisions[name].reason)
    return decisions


def test_a_pod_with_an_init_container_is_checkpointed_and_its_init_container_is_in_the_key(env):
    init_pod(env, "s1", "uid-1")
    table = env.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0]
    assert sorted(table.containers) == ["app", "sidecar"] and sorted(table.init) == ["fetch"]
    assert env.autocheckpoint.asked == [table.key], "an init container that ended does not keep the pod from it"
    other_init = member("fetch", image="thaw.dev/init:2")
    assert table.key != podmod.key(table.lookup, {**table.containers, "init/fetch": identity(other_init)})


def test_a_restoring_pod_answers_its_init_containers_as_done(env):
    init_pod(env, "s1", "uid-1")
    env.preparer.available.add(table_key(env))
    d = init_pod(env, "s2", "uid-2")
    assert d["sandbox"].restore
    assert d["fetch"].satisfied and not d["fetch"].restore and d["fetch"].reason.startswith("init-satisfied")
    assert d["app"].restore and d["sidecar"].restore, "the app containers restore after it"


def test_a_restoring_pod_whose_init_container_changed_fails_and_starts_again_cold(env):
    init_pod(env, "s1", "uid-1")
    env.preparer.available.add(table_key(env))
    d = init_pod(env, "s2", "uid-2", init_image="thaw.dev/init:2")
    assert not d["fetch"].satisfied and d["fetch"].reason.startswith("pod-failed: container-mismatch: init container")
    _, again = create(env, "s3", box_spec("s3", "uid-2"))
    assert not again.restore and again.reason.startswith("pod-failed-before")
