"""One readiness (control/lifecycle/readiness.py): a pod's readinessProbes as
thaw's probes, thaw.dev annotations as overrides."""
from __future__ import annotations

import pytest

from control.errors import UserError
from control.lifecycle import pod as podmod
from control.lifecycle import readiness
from runsc_hooks import probe


def pod(*containers, init=()):
    return {"spec": {"containers": list(containers), "initContainers": list(init)}}


@pytest.mark.parametrize("k8s, container, want, note", [
    ({"httpGet": {"path": "/healthz", "port": 8080}}, {}, "http:8080/healthz=200-399", ""),
    ({"httpGet": {"port": "web"}}, {"ports": [{"name": "web", "containerPort": 9000}]}, "http:9000/=200-399", ""),
    ({"httpGet": {"path": "ready", "port": 80, "httpHeaders": [{"name": "Host", "value": "x"}]}}, {},
     "http:80/ready=200-399", "host and headers are not sent"),
    ({"httpGet": {"port": 443, "scheme": "HTTPS"}}, {}, "tcp:443", "HTTPS is checked as a TCP connect"),
    ({"tcpSocket": {"port": "5432"}}, {}, "tcp:5432", ""),
    ({"exec": {"command": ["sh", "-c", "test -f /tmp/ready && echo ok"]}}, {},
     "exec:sh -c 'test -f /tmp/ready && echo ok'", ""),
    ({"grpc": {"port": 50051, "service": "x"}}, {}, "tcp:50051", "gRPC health check"),
])
def test_each_kind_of_probe_translates(k8s, container, want, note):
    p, notes = readiness.translate(k8s, {"name": "c", **container})
    assert str(p) == want and probe.parse(want) == p
    assert (note in " ".join(notes)) if note else notes == []


@pytest.mark.parametrize("k8s, says", [
    ({"httpGet": {"port": "nope"}}, "port 'nope' is no port of the container"),
    ({"tcpSocket": {"port": 70000}}, "outside 1-65535"),
    ({"exec": {"command": []}}, "exec has no command"),
    ({"initialDelaySeconds": 3}, "no httpGet, tcpSocket, exec or grpc"),
])
def test_what_thaw_cannot_express_is_refused_naming_the_container(k8s, says):
    with pytest.raises(readiness.Untranslatable, match=f"container c: .*{says}"):
        readiness.translate(k8s, {"name": "c"})


def test_unprobed_containers_are_ready_when_running_as_the_kubelet_counts_them():
    members, _ = readiness.declared({}, pod({"name": "app", "readinessProbe": {"tcpSocket": {"port": 80}}},
                                            {"name": "logs"}))
    assert {n: (str(m.ready), str(m.health)) for n, m in members.items()} == {
        "app": ("tcp:80", "tcp:80"), "logs": ("running", "running")}


def test_a_pod_that_says_nothing_about_readiness_declares_nothing():
    assert readiness.declared({}, pod({"name": "app"}, {"name": "b"})) == ({}, [])


def test_annotations_override_and_sidecars_count_and_init_containers_do_not():
    ann = {"thaw.dev/ready.app": "http:8000/v1/models~Qwen", "thaw.dev/health.app": "tcp:8000",
           "thaw.dev/ready.sidecar": "delay:5"}
    members, _ = readiness.declared(ann, pod(
        {"name": "app", "readinessProbe": {"httpGet": {"port": 8000, "path": "/health"}}}, {"name": "sidecar"},
        init=[{"name": "fetch-weights"}, {"name": "proxy", "restartPolicy": "Always",
                                          "readinessProbe": {"tcpSocket": {"port": 15000}}}]))
    assert {n: (str(m.ready), str(m.health)) for n, m in members.items()} == {
        "app": ("http:8000/v1/models~Qwen", "tcp:8000"), "sidecar": ("delay:5", "running"),
        "proxy": ("tcp:15000", "tcp:15000")}


def test_the_pod_wide_annotation_is_the_one_containers_and_a_stray_name_stays_declared():
    members, _ = readiness.declared({"thaw.dev/ready": "file:/ready"}, pod({"name": "app", "readinessProbe": {
        "tcpSocket": {"port": 1}}}))
    assert str(members["app"].ready) == "file:/ready"
    members, notes = readiness.declared({"thaw.dev/ready.ghost": "running"}, pod({"name": "app"}))
    assert set(members) == {"app", "ghost"} and "names no container" in notes[0]
    with pytest.raises(UserError, match="annotation thaw.dev/ready.app"):
        readiness.declared({"thaw.dev/ready.app": "bogus:1"}, pod({"name": "app"}))


def test_the_pod_a_cri_container_belongs_to():
    ann = {"io.kubernetes.cri.sandbox-namespace": "ns", "io.kubernetes.cri.sandbox-name": "web-0",
           "io.kubernetes.cri.sandbox-uid": "u1"}
    assert podmod.pod_ref({"annotations": ann}) == podmod.PodRef("ns", "web-0", "u1")
    assert str(podmod.pod_ref({"annotations": ann})) == "ns/web-0"
    assert podmod.pod_ref({"annotations": {"thaw.dev/workload": "x"}}) is None and podmod.pod_ref(None) is None


def test_http_probes_take_a_status_range():
    p = probe.parse("http:80/h=200-399")
    assert (p.status, p.status_max) == (200, 399) and str(p) == "http:80/h=200-399"
    for bad in ("http:80/h=399-200", "http:80/h=200-600"):
        with pytest.raises(UserError):
            probe.parse(bad)
