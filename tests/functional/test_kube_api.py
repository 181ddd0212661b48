"""thawd's Kubernetes API client (control/thawd/kubeapi.py), its Events
(events.py) and its pod reads (podspecs.py) against a real HTTPS server in this
process (tests/functional/kube_server.py): TLS verified against a CA, bearer
tokens, the API's status codes, a server that stops answering."""
from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
import yaml

from control import config
from control.errors import ApiError, ConfigError
from control.lifecycle.pod import PodRef
from control.metrics import Metrics
from control.thawd import kubeapi
from control.thawd.events import Events
from control.thawd.podspecs import DOWN_S, PodSpecs
from tests.functional.kube_server import ApiServer

NS, POD, UID = "team-a", "web-0", "4f9c-uid"


@pytest.fixture
def api(tmp_path):
    srv = ApiServer(tmp_path)
    yield srv
    srv.close()


def settings(tmp_path) -> "config.Settings":
    (tmp_path / "empty.toml").write_text("")
    return config.load(environ={}, config_file=tmp_path / "empty.toml")


def kubeconfig(tmp_path: Path, api: ApiServer, user: dict) -> Path:
    f = tmp_path / "kubeconfig"
    f.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "c", "cluster": {"server": api.url, "certificate-authority-data":
                                               base64.b64encode(api.ca.read_bytes()).decode()}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}]}))
    return f


def client(tmp_path, api) -> kubeapi.Client:
    return kubeapi.from_kubeconfig(kubeconfig(tmp_path, api, {"token": "t0k3n"}), timeout_s=2)


def test_in_cluster_client_verifies_the_ca_and_rereads_its_rotated_token(tmp_path, api, monkeypatch):
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t0k3n\n")
    (sa / "ca.crt").write_bytes(api.ca.read_bytes())
    host, port = api.url.removeprefix("https://").split(":")
    c = kubeapi.from_settings(settings(tmp_path), {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port},
                              sa_dir=sa)
    api.add_pod(NS, POD, UID, [{"name": "app"}])
    assert c.get_pod(NS, POD)["metadata"]["uid"] == UID
    api.tokens = {"rotated"}                    # the kubelet rotated the projected token
    (sa / "token").write_text("rotated")
    with pytest.raises(ApiError) as e:          # read again only once a minute has passed
        c.get_pod(NS, POD)
    assert e.value.status == 401
    monkeypatch.setattr(kubeapi, "TOKEN_REREAD_S", 0.0)
    assert c.get_pod(NS, POD)["metadata"]["name"] == POD
    assert api.requests[-1][2] == "rotated"


def test_a_server_whose_certificate_the_ca_did_not_sign_is_refused(tmp_path, api):
    (tmp_path / "other").mkdir()
    other = ApiServer(tmp_path / "other")
    try:
        f = kubeconfig(tmp_path, api, {"token": "t0k3n"})
        c = kubeapi.from_kubeconfig(f, server=other.url, timeout_s=2)   # api's CA, other's server
        with pytest.raises(ApiError) as e:
            c.get_pod(NS, POD)
        assert e.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in e.value.message
    finally:
        other.close()


def test_errors_name_the_request_status_and_the_apis_message(tmp_path, api):
    c = client(tmp_path, api)
    with pytest.raises(ApiError) as e:
        c.get_pod(NS, "absent")
    assert e.value.status == 404 and e.value.message == f'kubernetes get pod at {api.url}: 404 Not Found: pods "absent" not found'
    api.forbid.add(("GET", "pods"))
    with pytest.raises(ApiError) as e:
        c.get_pod(NS, POD)
    assert e.value.status == 403 and "forbidden" in e.value.message


def test_kubeconfig_problems_are_one_line_config_errors(tmp_path, api):
    with pytest.raises(ConfigError, match="plugin"):
        kubeapi.from_kubeconfig(kubeconfig(tmp_path, api, {"exec": {"command": "aws"}}))
    bad = tmp_path / "bad"
    bad.write_text("current-context: nope\ncontexts: []\n")
    with pytest.raises(ConfigError, match="no context 'nope'"):
        kubeapi.from_kubeconfig(bad)
    with pytest.raises(ConfigError, match="kubernetes.kubeconfig: not in a pod"):
        kubeapi.from_settings(settings(tmp_path), {}, sa_dir=tmp_path / "none")


def test_events_are_posted_as_the_node_and_repeats_counted_as_the_kubelet_does(tmp_path, api):
    m = Metrics()
    ev = Events(client(tmp_path, api), "node-a", m)
    ref = PodRef(NS, POD, UID)
    for _ in range(3):
        ev.cold(ref, "no-image: no pod of this workload")
    ev.restored(ref, "team-a.web.abc-123", 1.234)
    ev.post(None, "Ignored", "no pod")
    assert ev.flush()
    events = api.pod_events(NS, POD)
    assert [(e["reason"], e["count"]) for e in events] == [("ThawColdStart", 3), ("ThawRestored", 1)]
    cold = events[0]
    assert cold["message"] == "started cold: no-image: no pod of this workload" and cold["type"] == "Normal"
    assert cold["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": NS, "name": POD, "uid": UID}
    assert cold["source"] == {"component": "thawd", "host": "node-a"}
    assert (cold["reportingComponent"], cold["reportingInstance"]) == ("thaw.dev/thawd", "node-a")
    assert cold["lastTimestamp"] >= cold["firstTimestamp"]
    assert [r[0] for r in api.requests] == ["POST", "PATCH", "PATCH", "POST"]
    assert events[1]["message"] == "restored from image team-a.web.abc-123 in 1.23s"
    c = m.counters()
    assert (c['thaw_kube_events_total{result="posted"}'], c['thaw_kube_events_total{result="aggregated"}']) == (2, 2)
    # An Event the API server no longer has (they expire after an hour) is made again, its count kept.
    api.events.clear()
    ev.cold(ref, "no-image: no pod of this workload")
    assert ev.flush()
    assert [(e["reason"], e["count"]) for e in api.pod_events(NS, POD)] == [("ThawColdStart", 4)]
    ev.close()


def test_a_failing_api_server_never_delays_a_post_and_a_full_queue_drops(tmp_path, api):
    m = Metrics()
    api.delay_s = 0.5                 # every answer slow: the worker is busy, the callers are not
    ev = Events(client(tmp_path, api), "node-a", m, queue_size=2)
    ref = PodRef(NS, POD, UID)
    t0 = time.monotonic()
    for i in range(6):
        ev.cold(ref, f"reason {i}")
    assert time.monotonic() - t0 < 0.1
    assert ev.flush(10)
    c = m.counters()
    assert c['thaw_kube_events_total{result="dropped"}'] >= 3
    api.delay_s, api.down = 0.0, True
    ev.cold(ref, "while down")
    assert ev.flush(10)
    assert m.counters()['thaw_kube_events_total{result="failed"}'] == 1
    ev.close()


def test_readiness_comes_from_the_pod_spec_with_annotations_overriding(tmp_path, api):
    m = Metrics()
    ev = Events(client(tmp_path, api), "node-a", m)
    specs = PodSpecs(client(tmp_path, api), ev, m)
    api.add_pod(NS, POD, UID, [
        {"name": "app", "ports": [{"name": "http", "containerPort": 8080}],
         "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}}},
        {"name": "side", "readinessProbe": {"exec": {"command": ["cat", "/tmp/ok"]}}},
        {"name": "logs"}])
    spec = sandbox_spec(**{"thaw.dev/ready.side": "file:/tmp/warm"})
    members = specs.declared(spec)
    assert {n: str(mb.ready) for n, mb in members.items()} == {
        "app": "http:8080/healthz=200-399", "side": "file:/tmp/warm", "logs": "running"}
    assert str(members["app"].health) == "http:8080/healthz=200-399"
    assert ev.flush()
    (e,) = api.pod_events(NS, POD)
    assert e["reason"] == "ThawReadiness" and e["type"] == "Normal" and "app: http:8080/healthz=200-399" in e["message"]
    assert m.counters()['thaw_kube_pod_reads_total{result="ok"}'] == 1


def sandbox_spec(**ann) -> dict:
    return {"annotations": {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": "sb1",
                            "io.kubernetes.cri.sandbox-name": POD, "io.kubernetes.cri.sandbox-namespace": NS,
                            "io.kubernetes.cri.sandbox-uid": UID, "thaw.dev/workload": "web", **ann}}


def test_an_unreachable_api_server_falls_back_to_annotations_and_is_not_asked_again_for_a_while(tmp_path, api):
    m = Metrics()
    ev = Events(client(tmp_path, api), "node-a", m)
    now = [1000.0]
    specs = PodSpecs(client(tmp_path, api), ev, m, clock=lambda: now[0])
    api.add_pod(NS, POD, UID, [{"name": "app", "readinessProbe": {"tcpSocket": {"port": 80}}}])
    api.down = True
    spec = sandbox_spec(**{"thaw.dev/ready": "http:80/ready"})
    t0 = time.monotonic()
    assert {n: str(mb.ready) for n, mb in specs.declared(spec).items()} == {"": "http:80/ready"}
    assert time.monotonic() - t0 < 2.5                 # one request, bounded by its timeout
    asked = len(api.requests)
    specs.declared(spec)                               # within DOWN_S: not asked
    assert len(api.requests) == asked
    api.down = False
    now[0] += DOWN_S + 1
    assert {n: str(mb.ready) for n, mb in specs.declared(spec).items()} == {"app": "http:80/ready"}
    c = m.counters()
    assert (c['thaw_kube_pod_reads_total{result="failed"}'], c['thaw_kube_pod_reads_total{result="skipped"}'],
            c['thaw_kube_pod_reads_total{result="ok"}']) == (1, 1, 1)
    assert ev.flush()
    msgs = [e["message"] for e in api.pod_events(NS, POD)]
    assert any("readiness from thaw.dev annotations alone: its one container: http:80/ready" in x for x in msgs), msgs


@pytest.mark.parametrize("change, why", [
    (lambda api: api.pods[(NS, POD)]["metadata"].update(uid="other"), "is another one"),
    (lambda api: api.pods[(NS, POD)]["spec"]["containers"][0]["readinessProbe"]["httpGet"].update(port="nope"),
     "port 'nope' is no port of the container"),
    (lambda api: api.forbid.add(("GET", "pods")), "403 Forbidden"),
])
def test_a_spec_thaw_cannot_use_falls_back_and_says_why(tmp_path, api, change, why):
    m = Metrics()
    ev = Events(client(tmp_path, api), "node-a", m)
    specs = PodSpecs(client(tmp_path, api), ev, m)
    api.add_pod(NS, POD, UID, [{"name": "app", "readinessProbe": {"httpGet": {"port": 80}}}])
    change(api)
    assert specs.declared(sandbox_spec()) == {}        # no annotations: nothing declared, never checkpointed
    assert ev.flush()
    (e,) = api.pod_events(NS, POD)
    assert e["type"] == "Warning" and why in e["message"], e["message"]
