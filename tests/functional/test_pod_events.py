"""A Kubernetes pod through thawd with the API server in the loop (issue 29): the
pod's readiness from its spec's readinessProbes, and an Event on it for each
decision, against a real HTTPS API server in this process
(tests/functional/kube_server.py); runsc is the fake that records its argv, the
image source and containerd's records are test_pods' fakes."""
from __future__ import annotations

import stat
import time

import pytest

from control import config
from control.thawd import kubeapi
from control.thawd.service import Thawd
from tests.functional.kube_server import ApiServer
from tests.functional.test_kube_api import kubeconfig
from tests.unit.test_pod import member, sandbox
from tests.unit.test_pods import FAKE_RUNSC, FakePodIdentities, rt_of
from tests.unit.test_service import FakeImages

NS = "shop"
ANN = {"thaw.dev/workload": "web", "io.kubernetes.cri.sandbox-namespace": NS}   # no thaw.dev/ready at all
CONTAINERS = [{"name": "app", "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}}}, {"name": "sidecar"}]


@pytest.fixture
def env(tmp_path):
    api = ApiServer(tmp_path)
    (tmp_path / "empty.toml").write_text("")
    runsc = tmp_path / "bin" / "runsc"
    runsc.parent.mkdir()
    runsc.write_text(FAKE_RUNSC)
    runsc.chmod(runsc.stat().st_mode | stat.S_IEXEC)
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_THAWD_PREPARE_TIMEOUT_S": "1",
                             "THAW_RUNSC_PATH": str(runsc), "THAW_KUBERNETES_EVENTS": "true",
                             "THAW_KUBERNETES_READ_PODS": "true", "THAW_KUBERNETES_NODE_NAME": "node-a",
                             "THAW_KUBERNETES_TIMEOUT_S": "1"}, config_file=tmp_path / "empty.toml")
    kube = kubeapi.from_kubeconfig(kubeconfig(tmp_path, api, {"token": "t0k3n"}), timeout_s=1)
    images, ids = FakeImages(tmp_path), FakePodIdentities()
    t = Thawd(s, images, identify=ids.container, identify_sandbox=ids.sandbox, kube=kube)
    asked: list[tuple] = []
    t.autocheckpoint.maybe = lambda key, job, what="", pod=None: asked.append((key, pod))
    yield t, api, images, tmp_path, asked
    t.close()
    api.close()


def start_pod(t, tmp, sid, uid, name):
    """The kubelet's creates of a pod: its sandbox, then app and sidecar; (sandbox, members, decisions)."""
    box = rt_of(tmp, sid, sandbox(uid=uid, ann={**ANN, "io.kubernetes.cri.sandbox-name": name,
                                                "io.kubernetes.cri.sandbox-id": sid}))
    d = {"sandbox": t.prepare_restore(box)}
    members = {}
    for c in ("app", "sidecar"):
        m = member(c, ann={**ANN, "io.kubernetes.cri.sandbox-name": name, "io.kubernetes.cri.sandbox-uid": uid,
                           "io.kubernetes.cri.sandbox-id": sid})
        members[c] = rt_of(tmp, f"{sid}-{c}", m)
    return box, members, d


def events_of(t, api, name):
    assert t.events.flush(10)
    return [(e["reason"], e["type"], e["message"], e["count"]) for e in api.pod_events(NS, name)]


def test_a_pod_without_thaw_annotations_is_checkpointed_by_its_readiness_probe_and_restores_with_events(env):
    t, api, images, tmp, asked = env
    api.add_pod(NS, "web-0", "uid-1", CONTAINERS)
    api.add_pod(NS, "web-1", "uid-2", CONTAINERS)
    box, members, d = start_pod(t, tmp, "s1", "uid-1", "web-0")
    assert not d["sandbox"].restore and d["sandbox"].reason.startswith("no-image")
    t.report_outcome(box, "COLD_STARTED", d["sandbox"].reason)
    for rt in members.values():
        dm = t.prepare_restore(rt)
        t.report_outcome(rt, "COLD_STARTED", dm.reason)
    p = t.pods._get(box.runsc_root, "s1")
    assert {n: str(m.ready) for n, m in p.declared.items()} == {"app": "exec:cat /tmp/ready", "sidecar": "running"}
    [(key, ref)] = asked                       # assembled from the spec's containers: checkpoint asked once
    assert (ref.namespace, ref.name, ref.uid) == (NS, "web-0", "uid-1")
    t.autocheckpoint._run(key, lambda: {"image_bytes": 300 << 20, "seconds": 2.5}, p.summary(), ref)
    ev = events_of(t, api, "web-0")
    assert [e[0] for e in ev] == ["ThawReadiness", "ThawColdStart", "ThawCheckpointed"], ev
    assert ev[1][2].startswith("started cold: no-image")
    assert ev[0][2].startswith("readiness from the pod spec (thaw.dev annotations override it): "
                               "app: exec:cat /tmp/ready, sidecar: running")
    assert ev[2][2] == f"checkpointed as image {key}: 300.0 MiB in 2.50s, published"

    images.available[key] = True                # the next pod of the workload restores
    box2, members2, d2 = start_pod(t, tmp, "s2", "uid-2", "web-1")
    assert d2["sandbox"].restore and d2["sandbox"].key == key
    assert t.restore(box2)[0]
    for rt in members2.values():
        assert t.prepare_restore(rt).restore
        ok, detail, _ = t.restore(rt, subcontainer_restored=True)
        assert ok, detail
    ev = events_of(t, api, "web-1")
    assert [e[0] for e in ev] == ["ThawReadiness", "ThawRestored"], ev
    assert ev[1][2].startswith(f"restored from image {key} in ") and ev[1][1] == "Normal"
    assert {e["source"]["host"] for e in api.events.values()} == {"node-a"}


def test_an_api_server_that_does_not_answer_costs_a_start_one_timeout_and_the_annotations_decide(env):
    t, api, images, tmp, asked = env
    api.add_pod(NS, "web-0", "uid-1", CONTAINERS)
    api.down = True
    t0 = time.monotonic()
    box, members, d = start_pod(t, tmp, "s1", "uid-1", "web-0")
    assert time.monotonic() - t0 < 2.5
    # No thaw.dev/ready annotations and no spec: nothing declared, the pod starts cold, never checkpointed.
    assert not d["sandbox"].restore and d["sandbox"].reason.startswith("no-declared-containers")
    t0 = time.monotonic()
    start_pod(t, tmp, "s2", "uid-2", "web-1")       # not asked again for a while: no wait at all
    assert time.monotonic() - t0 < 0.5
    c = t.metrics.counters()
    assert (c['thaw_kube_pod_reads_total{result="failed"}'], c['thaw_kube_pod_reads_total{result="skipped"}']) == (1, 1)
    # The Events of both pods (readiness from annotations, started cold) were tried once each and lost,
    # counted: an outage is not retried into (docs/kubernetes.md).
    assert t.events.flush(10) and api.events == {}
    assert t.metrics.counters()['thaw_kube_events_total{result="failed"}'] == 4
