"""thawd's pod decisions (control/thawd/pods.py) with a fake image source and a
fake runsc that records its argv; bundles, specs and the pod tables are real."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from control import config
from control.lifecycle import pod as podmod
from control.thawd.podtables import hint_of
from control.thawd.service import RuntimeRef, Thawd
from runsc_hooks import spec as specmod
from control.errors import IdentityError, IntegrityError, NoSpace
from control.thawd.ctrinfo import Identity
from tests.unit.test_pod import POD_ANN, TENANT, digest, identity, lookup, member, sandbox
from tests.unit.test_service import FakeImages, FakeStream

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


@pytest.fixture
def env(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    runsc = tmp_path / "bin" / "runsc"
    runsc.parent.mkdir()
    runsc.write_text(FAKE_RUNSC)
    runsc.chmod(runsc.stat().st_mode | stat.S_IEXEC)
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_THAWD_PREPARE_TIMEOUT_S": "1",
                             "THAW_RUNSC_PATH": str(runsc)}, config_file=tmp_path / "empty.toml")
    images = FakeImages(tmp_path)
    ids = FakePodIdentities()
    t = Thawd(s, images, identify=ids.container, identify_sandbox=ids.sandbox)
    t.fake_ids = ids
    checkpoints: list[str] = []
    t.autocheckpoint.maybe = lambda key, job, what="", pod=None: checkpoints.append(key)
    yield t, images, tmp_path, checkpoints
    t.close()


def rt_of(tmp: Path, cid: str, spec: dict) -> RuntimeRef:
    b = tmp / "bundles" / cid
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(spec))
    return RuntimeRef.validate(cid, str(b), "/run/test-root", ["--root=/run/test-root"])


def cold_pod(t: Thawd, tmp: Path, sid: str = "s1", uid: str = "uid-1", images=("thaw.dev/web:1",) * 2) -> dict:
    """A pod the kubelet starts cold: pause, app, sidecar (create, start each)."""
    box = rt_of(tmp, sid, sandbox(uid=uid) | {"annotations": {**sandbox(uid=uid)["annotations"],
                                                             "io.kubernetes.cri.sandbox-id": sid}})
    decisions = {"sandbox": t.prepare_restore(box)}
    t.report_outcome(box, "COLD_STARTED", decisions["sandbox"].reason)
    for name, image in zip(("app", "sidecar"), images):
        m = member(name, image=image)
        m["annotations"]["io.kubernetes.cri.sandbox-id"] = sid
        r = rt_of(tmp, f"{sid}-{name}", m)
        decisions[name] = t.prepare_restore(r)
        t.report_outcome(r, "COLD_STARTED", decisions[name].reason)
    return decisions


def test_cold_pod_is_keyed_by_its_containers_and_checkpointed_once_all_started(env):
    t, images, tmp, checkpoints = env
    d = cold_pod(t, tmp)
    assert not d["sandbox"].restore and d["sandbox"].reason.startswith("no-image")
    assert [d[n].reason.split(":")[0] for n in ("app", "sidecar")] == ["pod-cold", "pod-cold"]
    lk = lookup(sandbox(), ["app", "sidecar"])
    table = t.pods.tables.pick(lk, "")[0]
    assert table.key == podmod.key(lk, {n: identity(member(n)) for n in ("app", "sidecar")})
    assert checkpoints == [table.key]  # once, after the last declared container started


def test_a_pod_whose_identity_cannot_be_told_starts_cold_and_is_never_keyed(env):
    """The sandbox's tenant or a member's image digest unknown (ctrinfo): that pod is
    cold with the reason, gets no table, and is never checkpointed."""
    t, images, tmp, checkpoints = env
    t.fake_ids.fail["s1"] = IdentityError("identity-unknown", "containerd did not answer")
    d = cold_pod(t, tmp)
    assert not d["sandbox"].restore and d["sandbox"].reason.startswith("identity-unknown: containerd did not")
    assert all(d[n].reason.startswith("pod-cold: identity-unknown") for n in ("app", "sidecar"))
    assert t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0] is None and checkpoints == []
    t.fake_ids.fail = {"s2-sidecar": IdentityError("no-image-digest", "no digest recorded")}
    d = cold_pod(t, tmp, sid="s2", uid="uid-2")
    assert d["app"].reason.startswith("pod-cold: no-image") and d["sidecar"].reason.startswith(
        "pod-cold: no-image-digest: no digest recorded (container 'sidecar')")
    assert t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0] is None and checkpoints == []


def test_a_member_whose_identity_cannot_be_told_fails_a_restoring_pod(env):
    t, images, tmp, _ = env
    cold_pod(t, tmp)
    images.available[t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key] = True
    box = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    assert t.prepare_restore(box).restore
    t.fake_ids.fail["s2-app"] = IdentityError("image-moved", "the tag moved")
    m = member("app")
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    d = t.prepare_restore(rt_of(tmp, "s2-app", m))
    assert not d.restore and d.reason.startswith("pod-failed: image-moved: the tag moved (container 'app')")


def test_next_pod_restores_with_the_image_of_its_container_set(env):
    t, images, tmp, _ = env
    cold_pod(t, tmp)
    key = t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key
    images.available[key] = True
    box = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    d = t.prepare_restore(box)
    assert d.restore and d.key == key and d.image_path == str(tmp / key)
    for name in ("app", "sidecar"):
        m = member(name)
        m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
        dm = t.prepare_restore(rt_of(tmp, f"s2-{name}", m))
        assert dm.restore and dm.key == key and dm.image_path == str(tmp / key), dm


class PodStream(FakeStream):
    """A Stream as thawd sees it (test_service.FakeStream): the sidecar directory runsc
    takes thaw-gofer from, and how the stream ended (error None: installed)."""

    def env(self) -> dict:
        return {"GVISOR_SIDECAR_BINARIES_DIR": str(self.path.parent / "sidecars")}


def streamed_pod(env, error=None):
    """A cold pod, then a second sandbox of it whose image misses the cache and streams:
    (thawd, tmp, key, the sandbox, its members)."""
    t, images, tmp, _ = env
    cold_pod(t, tmp)
    key = t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key
    images.pull = lambda k: PodStream(tmp / k, error)
    box = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    d = t.prepare_restore(box)
    assert d.restore and d.image_path == str(tmp / key), d
    members = {}
    for name in ("app", "sidecar"):
        m = member(name)
        m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
        members[name] = rt_of(tmp, f"s2-{name}", m)
    return t, tmp, key, box, members


def test_a_pod_whose_image_streams_restores_through_thaw_gofer(env):
    """store.stream for a pod (issue 18): the sandbox's `runsc restore`, the only one
    that reads the image, gets thaw-gofer's sidecar directory and --background, as a
    lone container's; the members' restores are the stand-in's. The stream is counted
    once the pod is restored."""
    t, tmp, key, box, members = streamed_pod(env)
    assert t.metrics.counters().get("thaw_cache_misses_total") == 1
    ok, detail, _ = t.restore(box)
    assert ok, detail
    [line] = [x for x in (tmp / "bin" / "argv.log").read_text().splitlines() if " restore " in f" {x} "]
    assert line.endswith(f"--image-path={tmp / key} --detach --background s2 sidecars={tmp / 'sidecars'}"), line
    for name, rt in members.items():
        assert t.prepare_restore(rt).restore
        assert 'thaw_streams_total{result="installed"}' not in t.metrics.counters()
        ok, detail, _ = t.restore(rt, subcontainer_restored=True)
        assert ok, detail
    c = t.metrics.counters()
    assert c.get('thaw_streams_total{result="installed"}') == 1 and c.get("thaw_restores_total") == 1, c


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
    t, tmp, key, box, members = streamed_pod(env, error)
    t.quarantine.after = 1
    if where == "sandbox":
        (tmp / "bin" / "fail-restore").touch()
        ok, reason, _ = t.restore(box)
        assert not ok and t.pods._get("/run/test-root", "s2").state == "cold"
    else:
        assert t.restore(box)[0]
        for rt in members.values():
            assert t.prepare_restore(rt).restore
        p = t.pods._get("/run/test-root", "s2")
        if where == "assembly-timeout":
            t.pods._assembly_deadline(p, 120)   # what the timer calls once thawd.pod_assembly_timeout_s passed
        else:
            t.report_outcome(members["sidecar"], "RESTORE_FAILED", "runsc restore: exit status 128")
        assert p.state == "failed" and "delete --force s2" in (tmp / "bin" / "argv.log").read_text()
        reason = p.reason
    assert reason.startswith(f"{type(error).__name__}: the image's stream failed: "), reason
    assert (key in t.quarantined()) is counted
    assert t.lease_of(box) is None   # released with the sandbox


def test_a_container_that_differs_fails_the_pod_and_its_next_sandbox_starts_cold(env):
    t, images, tmp, _ = env
    cold_pod(t, tmp)
    lk = lookup(sandbox(), ["app", "sidecar"])
    images.available[t.pods.tables.pick(lk, "")[0].key] = True
    box = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    assert t.prepare_restore(box).restore
    m = member("sidecar", image="thaw.dev/web:2")
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    d = t.prepare_restore(rt_of(tmp, "s2-sidecar", m))
    assert not d.restore and d.reason.startswith("pod-failed: container-mismatch: container 'sidecar' differs")
    assert "workload key" in d.reason
    assert "delete --force s2" in (tmp / "bin" / "argv.log").read_text()   # the sandbox is removed
    assert t.pods.tables.pick(lk, hint_of(sandbox()))[0] is None   # this node picks that set no more for its version
    # The kubelet's next sandbox for that pod (same uid) starts cold, and says why.
    again = t.prepare_restore(rt_of(tmp, "s3", sandbox(uid="uid-2")))
    assert not again.restore and again.reason.startswith("pod-failed-before")


def test_a_container_the_image_does_not_hold_fails_the_pod(env):
    t, images, tmp, _ = env
    cold_pod(t, tmp)
    images.available[t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key] = True
    assert t.prepare_restore(rt_of(tmp, "s2", sandbox(uid="uid-2"))).restore
    m = member("other")
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    d = t.prepare_restore(rt_of(tmp, "s2-other", m))
    assert d.reason.startswith("pod-failed: container-mismatch: container 'other' is not one of the image's")


def test_another_declared_set_is_another_lookup_and_starts_cold(env):
    t, images, tmp, _ = env
    cold_pod(t, tmp)
    images.available[t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key] = True
    ann = {k: v for k, v in POD_ANN.items() if "sidecar" not in k} | {"thaw.dev/ready.other": "running"}
    d = t.prepare_restore(rt_of(tmp, "s2", sandbox(ann, uid="uid-2")))
    assert not d.restore and d.reason.startswith("no-image")


def test_a_container_recreated_in_a_running_pod_starts_cold(env):
    t, images, tmp, checkpoints = env
    cold_pod(t, tmp)
    m = member("app")
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s1"
    d = t.prepare_restore(rt_of(tmp, "s1-app-1", m))  # the kubelet's restart of a container that exited
    assert not d.restore and d.reason.startswith("pod-running")
    assert len(checkpoints) == 1


def test_undeclared_containers_and_pods_declaring_none_are_not_checkpointed(env):
    t, images, tmp, checkpoints = env
    box = rt_of(tmp, "s1", sandbox({"thaw.dev/workload": "web"}))
    d = t.prepare_restore(box)
    assert not d.restore and d.reason.startswith("no-declared-containers")
    cold_pod(t, tmp, sid="s2")
    m = member("extra")
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    r = rt_of(tmp, "s2-extra", m)
    t.prepare_restore(r)
    t.report_outcome(r, "COLD_STARTED", "")
    assert len(checkpoints) == 1   # the one of the complete pod, before the extra container came


def test_a_single_container_pod_with_a_pod_wide_probe_is_the_same_path(env):
    """thaw.dev/ready alone (deploy/kubernetes/examples/pod.yaml): the pod's one
    container, named when the kubelet creates it."""
    t, images, tmp, checkpoints = env
    ann = {"thaw.dev/workload": "llm", "thaw.dev/ready": "file:/tmp/ready"}

    def run(sid, uid):
        d = [t.prepare_restore(rt_of(tmp, sid, sandbox(ann, uid=uid)))]
        m = member("server", ann=ann)
        m["annotations"]["io.kubernetes.cri.sandbox-id"] = sid
        r = rt_of(tmp, f"{sid}-server", m)
        d.append(t.prepare_restore(r))
        t.report_outcome(r, "COLD_STARTED", d[-1].reason)
        return d

    cold = run("s1", "u1")
    assert [x.restore for x in cold] == [False, False] and len(checkpoints) == 1
    images.available[checkpoints[0]] = True
    warm = run("s2", "u2")
    assert [x.restore for x in warm] == [True, True] and warm[1].key == checkpoints[0]


def test_a_pod_stopped_while_restoring_is_removed_and_a_running_one_is_not(env):
    t, images, tmp, _ = env
    cold_pod(t, tmp)
    images.available[t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key] = True
    assert t.prepare_restore(rt_of(tmp, "s2", sandbox(uid="uid-2"))).restore
    m = member("app")
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    app = rt_of(tmp, "s2-app", m)
    assert t.prepare_restore(app).restore
    argv = tmp / "bin" / "argv.log"
    t.report_outcome(app, "RESTORE_FAILED", "stopped-while-restoring: kill: exit status 128")
    assert "delete --force s2" in argv.read_text()
    # A restored pod's failed kill (say, of a container that already exited) is runsc's business.
    t.pods._get("/run/test-root", "s1").state = "restored"
    m1 = member("app")
    m1["annotations"]["io.kubernetes.cri.sandbox-id"] = "s1"
    before = argv.read_text()
    t.report_outcome(rt_of(tmp, "s1-app-x", m1), "RESTORE_FAILED", "stopped-while-restoring: kill: exit status 1")
    assert argv.read_text() == before


def _standin_process(tmp: Path, cid: str, decision: str):
    """A process named like the stand-in (argv[0]) and its marker saying `decision`."""
    import subprocess
    import time

    from control.thawd.service import Standin
    marker = tmp / f"marker-{cid}.json"
    marker.write_text(json.dumps({"id": cid, "decision": decision}))
    p = subprocess.Popen(["bash", "-c", "exec -a thaw-runsc-hooks sleep 30"])
    for _ in range(200):   # until bash has exec'ed
        if Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"thaw-runsc-hooks"):
            break
        time.sleep(0.01)
    return p, Standin.validate(p.pid, str(marker))


def test_a_pod_whose_standin_dies_before_committing_its_start_is_removed(env):
    """The stand-in kill safety (issue 14) for pods: a pod container's stand-in that
    exits having committed its start keeps the pod; one killed after thawd's answer,
    before its commit, is a start containerd reports failed: thawd removes the pod."""
    import time
    t, images, tmp, _ = env
    cold_pod(t, tmp)
    images.available[t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key] = True
    box = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    assert t.prepare_restore(box).restore
    argv = tmp / "bin" / "argv.log"
    procs = []
    try:
        p, s = _standin_process(tmp, "s2", "restored")        # the pause container's, committed
        procs.append(p)
        ok, detail, _ = t.restore(box, standin=s)
        assert ok, detail
        m = member("app")
        m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
        app = rt_of(tmp, "s2-app", m)
        assert t.prepare_restore(app).restore
        p, s = _standin_process(tmp, "s2-app", "restore")     # the app's, killed before its commit
        procs.append(p)
        ok, detail, _ = t.restore(app, standin=s, subcontainer_restored=True)
        assert ok, detail
        procs[0].kill()
        time.sleep(0.3)
        assert "delete --force s2" not in argv.read_text()    # the committed one kept the pod
        p.kill()
        for _ in range(100):
            if "delete --force s2" in argv.read_text():
                break
            time.sleep(0.05)
        assert "delete --force s2" in argv.read_text()
        assert t.pods._get("/run/test-root", "s2").state == "failed"
    finally:
        for p in procs:
            p.kill()
            p.wait()


# -- GPU containers in pods (issue 28) ------------------------------------------------

def gpu_member(name: str, minors=(0,), env: dict | None = None) -> dict:
    """An app container of pod s2 holding the GPUs of `minors` (as containerd's CDI injection leaves them)."""
    m = member(name, env=env)
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    m.setdefault("linux", {})["devices"] = [
        {"path": p, "type": "c", "major": 195, "minor": n}
        for p, n in [("/dev/nvidiactl", 255), *((f"/dev/nvidia{i}", i) for i in minors)]]
    return m


@pytest.fixture
def gpu_env(env):
    """The test pod's thawd with the CUDA helper installed beside its (fake) runsc."""
    t, images, tmp, checkpoints = env
    helper = tmp / "bin" / "thaw-cuda-checkpoint"
    helper.write_text("#!/bin/sh\nexit 0\n")
    helper.chmod(0o755)
    return env


def test_a_gpu_container_of_a_pod_gets_the_cuda_helper_cold_or_restoring(gpu_env):
    from nvproxy import helper
    t, images, tmp, checkpoints = gpu_env
    box = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    t.prepare_restore(box)
    app = rt_of(tmp, "s2-app", gpu_member("app"))
    d = t.prepare_restore(app)
    assert not d.restore and d.reason.startswith("pod-cold")
    saved = specmod.Bundle(app.bundle).load()
    assert any(m["destination"] == helper.HELPER_DIR for m in saved["mounts"]), "config.json names the helper"
    assert (app.bundle / "config.json.thaw-orig").is_file(), "the shim's own config is kept"


def test_a_gpu_pod_is_checkpointed_with_the_helper_named_for_its_gpu_containers(gpu_env, monkeypatch):
    """No longer refused: the pause container's checkpoint names the helper, which
    every GPU container has at the same path (runsc runs it in each CUDA process's
    own container), and the CPU sidecar goes along."""
    from control.lifecycle.engine import Engine, Saved
    t, images, tmp, checkpoints = gpu_env
    asked = {}

    def checkpoint(self, h, out, stop_after=False, timeout_s=None, hooks_on=None, cuda_on=None):
        asked.update(id=h.id, cuda_on=[g.id for g in cuda_on or []])
        out.mkdir()
        return Saved(out, 0.1, {"checkpoint.img": 1}, bool(cuda_on))
    monkeypatch.setattr(Engine, "checkpoint", checkpoint)
    monkeypatch.setattr(Engine, "check", lambda self, h, probes, policy=None: type(
        "R", (), {"healthy": True, "summary": lambda s: "ok"})())
    box = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    t.report_outcome(box, "COLD_STARTED", t.prepare_restore(box).reason)
    members = {"app": rt_of(tmp, "s2-app", gpu_member("app"))}
    side = member("sidecar")
    side["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    members["sidecar"] = rt_of(tmp, "s2-sidecar", side)
    for r in members.values():
        t.prepare_restore(r)
        t.report_outcome(r, "COLD_STARTED", "")
    [key] = checkpoints
    p = t.pods.pod_of(box, specmod.Bundle(box.bundle).load())
    staged = []

    class Staged:
        def __init__(self, path):
            self.path, self.key = path, key

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    images.staged = lambda k: Staged(tmp / "staged")
    images.publish = lambda image: staged.append(image.key) or True
    res = t.pods._auto_checkpoint(p)
    assert res["published"] and staged == [key]
    assert asked == {"id": "s2", "cuda_on": ["s2-app"]}, "the sandbox saved, the GPU container named"


def test_a_restoring_pod_whose_gpu_container_holds_another_gpu_count_fails_with_that_reason(gpu_env):
    t, images, tmp, _ = gpu_env
    box = rt_of(tmp, "s1", sandbox(uid="uid-1"))
    t.report_outcome(box, "COLD_STARTED", t.prepare_restore(box).reason)
    one = gpu_member("app")
    one["annotations"]["io.kubernetes.cri.sandbox-id"] = "s1"
    side = member("sidecar")
    side["annotations"]["io.kubernetes.cri.sandbox-id"] = "s1"
    for r in (rt_of(tmp, "s1-app", one), rt_of(tmp, "s1-sidecar", side)):
        t.prepare_restore(r)
    key = t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key
    images.available[key] = True
    box2 = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    assert t.prepare_restore(box2).restore
    d = t.prepare_restore(rt_of(tmp, "s2-app", gpu_member("app", minors=(0, 1))))
    assert not d.restore and "GPU count 1 (the image's) vs 2 (this container's)" in d.reason, d.reason
    again = t.prepare_restore(rt_of(tmp, "s3", sandbox(uid="uid-2")))
    assert not again.restore and again.reason.startswith("pod-failed-before") and "GPU count" in again.reason


def test_nvidia_visible_devices_become_cdi_devices_of_this_node(gpu_env, monkeypatch):
    """The device plugin's envvar strategy: thaw injects the GPUs it names through
    the node's CDI registry (here a spec file of fake devices), as the NVIDIA
    container runtime would, before the container's identity is taken."""
    from control.lifecycle import gpus as gpumod
    from nvproxy import cdi
    t, images, tmp, _ = gpu_env
    doc = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "containerEdits": {
        "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]},
        "devices": [{"name": str(i), "containerEdits": {"deviceNodes": [
            {"path": f"/dev/nvidia{i}", "type": "c", "major": 195, "minor": i}]}} for i in range(2)]}
    reg = cdi.Registry()
    reg.add(cdi.parse(doc))
    from nvproxy.gpu import NodeGpus
    monkeypatch.setattr(gpumod, "node_devices", lambda: gpumod.Devices(NodeGpus(), reg))
    box = rt_of(tmp, "s2", sandbox(uid="uid-2"))
    t.prepare_restore(box)
    app = rt_of(tmp, "s2-app", member_env("app", {"NVIDIA_VISIBLE_DEVICES": "1"}))
    t.prepare_restore(app)
    devices = [d["path"] for d in specmod.Bundle(app.bundle).load()["linux"]["devices"]]
    assert devices == ["/dev/nvidiactl", "/dev/nvidia1"]
    bad = rt_of(tmp, "s2-sidecar", member_env("sidecar", {"NVIDIA_VISIBLE_DEVICES": "gpu-one"}))
    d = t.prepare_restore(bad)
    assert not d.restore and "NVIDIA_VISIBLE_DEVICES='gpu-one'" in d.reason, d.reason


def member_env(name: str, env: dict) -> dict:
    m = member(name, env=env)
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    return m


# -- init containers (issue 28) ---------------------------------------------------------

def init_pod(t, tmp, sid: str, uid: str, init_image: str = "thaw.dev/init:1"):
    """A pod the kubelet starts with an init container before its app and sidecar: the
    init container is created, started, and deleted (CRI deletes an exited task) first."""
    box = rt_of(tmp, sid, sandbox(uid=uid) | {"annotations": {**sandbox(uid=uid)["annotations"],
                                                             "io.kubernetes.cri.sandbox-id": sid}})
    decisions = {"sandbox": t.prepare_restore(box)}
    t.report_outcome(box, "COLD_STARTED", decisions["sandbox"].reason)
    m = member("fetch", image=init_image)
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = sid
    r = rt_of(tmp, f"{sid}-fetch", m)
    decisions["fetch"] = t.prepare_restore(r)
    if not decisions["fetch"].satisfied:
        t.report_outcome(r, "COLD_STARTED", decisions["fetch"].reason)
    t.release(r.container_id, str(r.runsc_root))                 # it exited: CRI deleted its task
    for name in ("app", "sidecar"):
        mm = member(name)
        mm["annotations"]["io.kubernetes.cri.sandbox-id"] = sid
        rr = rt_of(tmp, f"{sid}-{name}", mm)
        decisions[name] = t.prepare_restore(rr)
        if not decisions[name].restore:
            t.report_outcome(rr, "COLD_STARTED", decisions[name].reason)
    return box, decisions


def test_a_pod_with_an_init_container_is_checkpointed_and_its_init_container_is_in_the_key(env):
    t, images, tmp, checkpoints = env
    init_pod(t, tmp, "s1", "uid-1")
    table = t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0]
    assert sorted(table.containers) == ["app", "sidecar"] and sorted(table.init) == ["fetch"]
    assert checkpoints == [table.key], "an init container that ended does not keep the pod from its checkpoint"
    other_init = member("fetch", image="thaw.dev/init:2")
    assert table.key != podmod.key(table.lookup, {**table.containers, "init/fetch": identity(other_init)})


def test_a_restoring_pod_answers_its_init_containers_as_done(env):
    t, images, tmp, _ = env
    init_pod(t, tmp, "s1", "uid-1")
    images.available[t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key] = True
    box, d = init_pod(t, tmp, "s2", "uid-2")
    assert d["sandbox"].restore
    assert d["fetch"].satisfied and not d["fetch"].restore and d["fetch"].reason.startswith("init-satisfied")
    assert d["app"].restore and d["sidecar"].restore, "the app containers restore after it"


def test_a_restoring_pod_whose_init_container_changed_fails_and_starts_again_cold(env):
    t, images, tmp, _ = env
    init_pod(t, tmp, "s1", "uid-1")
    images.available[t.pods.tables.pick(lookup(sandbox(), ["app", "sidecar"]), "")[0].key] = True
    box, d = init_pod(t, tmp, "s2", "uid-2", init_image="thaw.dev/init:2")
    assert not d["fetch"].satisfied and d["fetch"].reason.startswith("pod-failed: container-mismatch: init container")
    again = t.prepare_restore(rt_of(tmp, "s3", sandbox(uid="uid-2")))
    assert not again.restore and again.reason.startswith("pod-failed-before")


def test_a_pods_profile_sets_its_environment_on_every_app_container(env):
    """The vllm profile's settings for C/R (loopback host IP, spawned workers, an
    IPC path inside the sandbox) are thaw's to set, not the user's."""
    t, images, tmp, _ = env
    ann = {**POD_ANN, "thaw.dev/profile": "vllm"}
    box = rt_of(tmp, "s2", sandbox(uid="uid-2", ann=ann))
    t.prepare_restore(box)
    m = member("app", ann=ann, env={"VLLM_HOST_IP": "10.0.0.9"})
    m["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    app = rt_of(tmp, "s2-app", m)
    t.prepare_restore(app)
    env_ = dict(e.split("=", 1) for e in specmod.Bundle(app.bundle).load()["process"]["env"])
    assert env_["VLLM_HOST_IP"] == "127.0.0.1" and env_["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env_["VLLM_RPC_BASE_PATH"] == "/tmp"
