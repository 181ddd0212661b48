"""A pod's roles, declared containers and key (control/lifecycle/pod.py)."""
import copy
import hashlib

import pytest

from control.errors import UserError
from control.lifecycle import pod, workload
from runsc_hooks import probe
from runsc_hooks import spec as specmod

POD_ANN = {"thaw.dev/workload": "web", "thaw.dev/ready.app": "file:/tmp/ready",
           "thaw.dev/ready.sidecar": "delay:1", "thaw.dev/health.app": "running"}


def sandbox(ann=None, uid="uid-1"):
    return specmod.command_spec(["/pause"], rootfs="r", annotations={
        "io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": "s1",
        "io.kubernetes.cri.sandbox-name": "web-0", "io.kubernetes.cri.sandbox-uid": uid, **(ann or POD_ANN)})


def member(name="app", args=("/app/run.sh",), image="thaw.dev/web:1", ann=None, env=None):
    return specmod.command_spec(list(args), rootfs="r", env=env or {}, annotations={
        "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "s1",
        "io.kubernetes.cri.container-name": name, "io.kubernetes.cri.image-name": image, **(ann or POD_ANN)})


TENANT = "default"   # the pod's tenant, as thawd's ctrinfo tells it (here: a fake's)


def digest(spec: dict) -> str:
    """The image digest containerd records for a member; in these tests a function of its image name."""
    return "sha256:" + hashlib.sha256(spec["annotations"]["io.kubernetes.cri.image-name"].encode()).hexdigest()


def identity(spec: dict, tenant: str = TENANT) -> dict:
    """A member's identity with the workload key thawd gives it (Thawd._workload)."""
    return pod.identity(spec, workload.workload_key(spec, tenant, digest(spec)))


def lookup(sandbox_spec: dict, names, tenant: str = TENANT) -> str:
    return pod.lookup(sandbox_spec, names, tenant)


def test_roles():
    assert pod.role(sandbox()) == pod.SANDBOX
    assert pod.role(member()) == pod.MEMBER
    # `ctr run` with the sandbox annotation (a lone container that is its own pod) is no CRI pod.
    lone = specmod.command_spec(["/x"], rootfs="r", annotations={"io.kubernetes.cri.container-type": "sandbox",
                                                                "io.kubernetes.cri.sandbox-id": "c1"})
    assert pod.role(lone) == pod.LONE
    assert pod.sandbox_id(member()) == "s1" and pod.container_name(member()) == "app"
    assert pod.pod_uid(sandbox()) == "uid-1"


def test_declared_containers_and_their_probes():
    d = pod.declared(sandbox())
    assert sorted(d) == ["app", "sidecar"]
    assert isinstance(d["app"].ready, probe.FileProbe) and isinstance(d["app"].health, probe.RunningProbe)
    # A delay readiness probe is not waited out again after a restore.
    assert isinstance(d["sidecar"].ready, probe.DelayProbe) and isinstance(d["sidecar"].health, probe.RunningProbe)
    assert pod.declared(sandbox({"thaw.dev/workload": "web"})) == {}


@pytest.mark.parametrize("ann, field", [
    ({"thaw.dev/ready.App_1": "running"}, "thaw.dev/ready.App_1"),
    ({"thaw.dev/ready.app": "nonsense:1"}, "thaw.dev/ready.app"),
    ({"thaw.dev/ready.app": "running", "thaw.dev/health.other": "running"}, "thaw.dev/health.other"),
])
def test_bad_declarations_name_the_annotation(ann, field):
    with pytest.raises(UserError) as e:
        pod.declared(sandbox({"thaw.dev/workload": "web", **ann}))
    assert e.value.fields["field"] == field


def test_lookup_covers_the_sandbox_and_the_declared_names_only():
    a = lookup(sandbox(), ["app", "sidecar"])
    assert a.startswith("default.web.") and a == lookup(sandbox(uid="uid-2"), ["sidecar", "app"])
    assert a != lookup(sandbox(), ["app"])
    assert a != lookup(sandbox({**POD_ANN, "thaw.dev/workload": "api"}), ["app", "sidecar"])
    # Another tenant's pod of the same workload has another lookup key, in its own store prefix.
    other = lookup(sandbox(), ["app", "sidecar"], tenant="k8s-team-b")
    assert other.startswith("k8s-team-b.web.") and other.split(".")[-1] != a.split(".")[-1]


def test_key_changes_with_any_container_identity():
    lk = lookup(sandbox(), ["app", "sidecar"])
    base = {"app": identity(member("app")), "sidecar": identity(member("sidecar"))}
    k = pod.key(lk, base)
    assert k.startswith(lk + "-") and len(k) <= 128
    assert k == pod.key(lk, {"sidecar": identity(member("sidecar")), "app": identity(member("app"))})
    for changed in (member("sidecar", image="thaw.dev/web:2"), member("sidecar", args=("/app/other.sh",))):
        assert pod.key(lk, {**base, "sidecar": identity(changed)}) != k


def test_fingerprint_ignores_what_runsc_lets_change():
    a = member()
    b = copy.deepcopy(a)
    b["hostname"] = "elsewhere"
    b["process"]["env"] = ["HOSTNAME=elsewhere"]
    b["root"]["path"] = "/other/rootfs"
    b["linux"]["cgroupsPath"] = "/kubepods/other"
    b["linux"]["resources"] = {"memory": {"limit": 1}}
    b["annotations"]["io.kubernetes.cri.sandbox-id"] = "s2"
    b["process"]["args"][0] = "/elsewhere/run.sh"  # runsc compares the executable's name only
    for m in b["mounts"]:
        m["source"] = "/elsewhere"
    assert pod.fingerprint(a) == pod.fingerprint(b)


def test_differences_name_the_spec_field():
    a = member()
    b = copy.deepcopy(a)
    b["process"]["capabilities"]["bounding"] = b["process"]["capabilities"]["bounding"] + ["CAP_NET_ADMIN"]
    assert pod.differences(identity(a), identity(b)) == ["capabilities"]
    c = member(image="thaw.dev/web:2")
    assert pod.differences(identity(a), identity(c)) == ["workload key (image, args, cwd, key-env)"]
    assert pod.differences(identity(a), identity(member())) == []


def test_a_pod_wide_ready_probe_declares_the_pods_one_container():
    d = pod.declared(sandbox({"thaw.dev/workload": "web", "thaw.dev/ready": "http:8000/health"}))
    assert list(d) == [pod.ANY] and isinstance(d[pod.ANY].ready, probe.HttpProbe)
    # Named declarations win; the pod-wide one is then not a declaration.
    d = pod.declared(sandbox({"thaw.dev/workload": "web", "thaw.dev/ready": "running",
                              "thaw.dev/ready.app": "file:/tmp/ready"}))
    assert list(d) == ["app"]


def test_the_gpu_index_is_no_part_of_a_containers_identity_but_the_count_is():
    """runsc pairs saved and new /dev/nvidiaN by minor whatever their numbers (issue 28)."""
    def on(*minors):
        m = member()
        m["linux"]["devices"] = [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}] + [
            {"path": f"/dev/nvidia{i}", "type": "c", "major": 195, "minor": i} for i in minors]
        return m
    assert identity(on(0)) == identity(on(1))
    assert pod.differences(identity(on(0)), identity(on(0, 1)))[0] == "GPU count 1 (the image's) vs 2 (this container's)"


def test_a_sandboxs_cgroup_parent_annotation_becomes_its_cgroups_path():
    """gVisor's shim names the pod's cgroup in an annotation runsc's restore checks
    compare, so no pod of a kubelet restored; linux.cgroupsPath may change."""
    spec = sandbox()
    spec["linux"] = {"cgroupsPath": "/kubepods/besteffort/pod-u1/abc"}
    spec["annotations"][pod.CGROUP_PARENT] = "/kubepods/besteffort/pod-u1"
    assert pod.fold_cgroup_parent(spec)
    assert spec["linux"]["cgroupsPath"] == "/kubepods/besteffort/pod-u1"
    assert pod.CGROUP_PARENT not in spec["annotations"]
    assert not pod.fold_cgroup_parent(spec), "nothing left to move"
