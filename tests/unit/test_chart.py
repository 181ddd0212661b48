"""deploy/helm/thaw: `helm lint`, `helm template` with the default values and with
every option changed, each rendering checked by thaw-kubecheck (strict decoding
with k8s.io/api, cross-references) and by thaw's own rules; deploy/kubernetes is
the chart's rendering (ci/update-manifests.py). build/k8s/helm is the pinned Helm
(helm.sh/helm/v4 v4.3.2, ci/build-cluster.sh); without it these tests fail, never skip."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from control import config, version
from tests.conftest import BUILD, REPO, require

CHART = REPO / "deploy/helm/thaw"
HELM = BUILD / "k8s" / "helm"
KUBECHECK = BUILD / "thaw-kubecheck"
EVERYTHING = CHART / "ci/everything-values.yaml"
# What a cluster holds before the chart is installed into it: the release's
# namespace (helm --create-namespace); for everything-values, the Secrets it names.
CLUSTER = """apiVersion: v1
kind: Namespace
metadata: {name: thaw-system}
"""
SECRETS = """apiVersion: v1
kind: Secret
metadata: {name: my-s3, namespace: thaw-test}
stringData: {AWS_ACCESS_KEY_ID: a, AWS_SECRET_ACCESS_KEY: b}
---
apiVersion: v1
kind: Secret
metadata: {name: my-tenant-keys, namespace: thaw-test}
stringData: {k8s-default: "00"}
---
apiVersion: v1
kind: Secret
metadata: {name: my-manifest-key, namespace: thaw-test}
stringData: {manifest.key: "00"}
"""


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    require(os.access(HELM, os.X_OK), f"helm built at {HELM} (helm.sh/helm/v4/cmd/helm@v4.3.2)")
    p = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HELM_CACHE_HOME": "/nonexistent", "HELM_CONFIG_HOME": "/nonexistent"})
    if check:
        assert p.returncode == 0, p.stderr
    return p


def render(*values: str, tmp_path: Path, name: str, cluster: str = CLUSTER) -> tuple[Path, dict[tuple[str, str], dict]]:
    """The chart rendered with `values` files / --set pairs into tmp_path/<name>.yaml,
    checked by thaw-kubecheck beside CLUSTER; its objects by (kind, name)."""
    args = []
    for v in values:
        args += ["-f", v] if v.endswith(".yaml") else ["--set", v]
    out = tmp_path / f"{name}.yaml"
    out.write_text(helm("template", "thaw", str(CHART), "--namespace", "thaw-system", *args).stdout)
    (tmp_path / "cluster.yaml").write_text(cluster)
    require(os.access(KUBECHECK, os.X_OK), f"thaw-kubecheck built at {KUBECHECK} (make build)")
    p = subprocess.run([str(KUBECHECK), "-json", str(out), str(tmp_path / "cluster.yaml")], capture_output=True,
                       text=True, timeout=60)
    doc = json.loads(p.stdout)
    assert doc["errors"] == [] and p.returncode == 0, doc["errors"] or p.stderr
    return out, {(o["kind"], o["name"]): o["object"] for o in doc["objects"] if o["file"] == str(out)}


def settings_of(objects, tmp_path) -> "config.Settings":
    f = tmp_path / "config.toml"
    f.write_text(objects[("ConfigMap", "thaw-config")]["data"]["config.toml"])
    return config.load(environ={}, config_file=f)    # a ConfigError names any bad key


def pod_of(objects) -> dict:
    return objects[("DaemonSet", "thawd")]["spec"]["template"]


def test_lint_passes_with_every_values_file():
    for values in [None, *sorted((CHART / "ci").glob("*-values.yaml"))]:
        p = helm("lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))
        assert "0 chart(s) failed" in p.stdout, p.stdout


def test_chart_version_is_thaws_and_the_image_tag_follows_it(tmp_path):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert str(chart["version"]) == str(chart["appVersion"]) == version.VERSION
    assert yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"] == ""
    for t in (CHART / "templates").iterdir():      # the templates derive it; none writes it down
        assert version.VERSION not in t.read_text(), t.name
    _, objects = render(tmp_path=tmp_path, name="default")
    pod = pod_of(objects)["spec"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {version.image_ref()}
    assert {c["imagePullPolicy"] for c in pod["containers"] + pod["initContainers"]} == {"IfNotPresent"}


def test_default_rendering_is_a_node_scoped_thawd_with_events_readiness_and_metrics(tmp_path):
    _, objects = render(tmp_path=tmp_path, name="default")
    assert ("Namespace", "thaw-system") not in objects     # helm install --create-namespace makes it
    s = settings_of(objects, tmp_path)
    assert s.kubernetes_events and s.kubernetes_read_pods and s.kubernetes_timeout_s == 1.0
    assert s.thawd_metrics_addr == "0.0.0.0:9464" and not s.store_encrypt and s.store_manifest_key_file is None
    tmpl = pod_of(objects)
    spec = tmpl["spec"]
    assert spec["automountServiceAccountToken"] is True and spec["serviceAccountName"] == "thawd"
    assert spec["nodeSelector"] == objects[("RuntimeClass", "runsc-thaw")]["scheduling"]["nodeSelector"]
    thawd = spec["containers"][0]
    env = {e["name"]: e for e in thawd["env"]}
    assert env["THAW_KUBERNETES_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "AWS_ACCESS_KEY_ID" not in env          # no credentials given: boto3's own chain
    # One port, everywhere it is named: thawd's listen address, the container, the scrape annotations, the Service.
    assert thawd["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    ann = tmpl["metadata"]["annotations"]
    assert (ann["prometheus.io/scrape"], ann["prometheus.io/port"], ann["prometheus.io/path"]) == ("true", "9464",
                                                                                                  "/metrics")
    svc = objects[("Service", "thawd-metrics")]["spec"]
    assert svc["clusterIP"] == "None" and svc["ports"][0]["port"] == 9464 and svc["ports"][0]["targetPort"] == "metrics"
    # RBAC: exactly what thawd asks, nothing else.
    rules = objects[("ClusterRole", "thaw-thawd")]["rules"]
    assert sorted((r["apiGroups"], r["resources"], sorted(r["verbs"])) for r in rules) == [
        ([""], ["events"], ["create", "patch"]), ([""], ["pods"], ["get"])]
    crb = objects[("ClusterRoleBinding", "thaw-thawd")]
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "thawd", "namespace": "thaw-system"}]
    vap = objects[("ValidatingAdmissionPolicy", "thaw-thawd-own-node")]["spec"]
    assert vap["failurePolicy"] == "Fail"
    assert "system:serviceaccount:thaw-system:thawd" in vap["matchConditions"][0]["expression"]
    assert "authentication.kubernetes.io/node-name" in vap["variables"][0]["expression"]
    text = " ".join(v["expression"] for v in vap["validations"])
    for field in ("source.host", "reportingInstance", "reportingComponent", "involvedObject.kind", "oldObject"):
        assert field in text, field


def test_every_option_changed(tmp_path):
    _, objects = render(str(EVERYTHING), tmp_path=tmp_path, name="everything", cluster=CLUSTER + "---\n" + SECRETS)
    s = settings_of(objects, tmp_path)
    assert not s.kubernetes_events and not s.kubernetes_read_pods and s.thawd_metrics_addr == ""
    assert (s.store_endpoint, s.store_bucket, s.store_prefix, s.store_stream) == (
        "http://seaweed.example:8333", "thaw-test", "team/", False)
    assert s.store_encrypt and s.store_tenant_keys_dir == Path("/etc/thaw-keys/tenants")
    assert s.store_manifest_key_file == Path("/etc/thaw-keys/manifest/manifest.key")
    assert (s.park_enabled, s.park_per_key, s.park_memory_budget_bytes, s.park_idle_s) == (True, 2, 8 << 30, 600.0)
    assert (s.cache_budget_bytes, s.cache_min_free_bytes) == (5 << 30, 1 << 30)
    assert dict(s.tenant_map) == {"k8s:team-a-prod": "team-a", "k8s:team-a-dev": "team-a"}
    assert (s.thawd_ready_timeout_s, s.thawd_quarantine_after, s.checkpoint_compression) == (
        900.0, 5, "flate-best-speed")                                          # extraConfig
    assert (s.gpu, s.machine_type, s.runtime_handler) == ("no", "m7i.2xlarge", "runsc-thaw-test")
    assert set(objects) == {("Namespace", "thaw-test"), ("ServiceAccount", "thawd-test"),
                            ("ConfigMap", "thaw-config"), ("DaemonSet", "thawd"), ("RuntimeClass", "runsc-thaw-test")}
    ns = objects[("Namespace", "thaw-test")]["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "privileged"
    spec = pod_of(objects)["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["nodeSelector"] == {"pool.example/thaw": "yes"}
    thawd = spec["containers"][0]
    assert "ports" not in thawd and "prometheus.io/scrape" not in pod_of(objects)["metadata"]["annotations"]
    assert {c["image"] for c in spec["containers"]} == {"ghcr.io/thaw-dev/thaw:dev"}
    env = {e["name"]: e for e in thawd["env"]}
    assert "THAW_KUBERNETES_NODE_NAME" not in env
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "my-s3"
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["tenant-keys"]["secret"] == {"secretName": "my-tenant-keys", "defaultMode": 0o400}
    assert vols["manifest-key"]["secret"] == {"secretName": "my-manifest-key", "defaultMode": 0o400}


def test_a_changed_config_rolls_thawd(tmp_path):
    _, a = render(tmp_path=tmp_path, name="a")
    _, b = render("cache.budget=300g", tmp_path=tmp_path, name="b")
    key = "thaw.dev/config-sha256"
    assert pod_of(a)["metadata"]["annotations"][key] != pod_of(b)["metadata"]["annotations"][key]


def test_events_alone_ask_for_no_pods_and_no_api_means_no_token(tmp_path):
    _, objects = render("kubernetes.readinessFromPodSpec=false", tmp_path=tmp_path, name="events")
    assert [r["resources"] for r in objects[("ClusterRole", "thaw-thawd")]["rules"]] == [["events"]]
    _, objects = render("kubernetes.events=false", tmp_path=tmp_path, name="pods")
    assert [r["resources"] for r in objects[("ClusterRole", "thaw-thawd")]["rules"]] == [["pods"]]
    assert ("ValidatingAdmissionPolicy", "thaw-thawd-own-node") not in objects   # it guards Events only


@pytest.mark.parametrize("bad, says", [
    ("image.pullPolicy=Sometimes", "pullPolicy"),
    ("metrics.port=0", "port"),
    ("runtimeClass.handler=Not_A_Label", "handler"),
    ("stor.bucket=x", "stor"),
    ("node.gpu=maybe", "gpu"),
])
def test_bad_values_are_refused_naming_them(bad, says):
    p = helm("template", "thaw", str(CHART), "--set", bad, check=False)
    assert p.returncode != 0 and says in p.stderr, p.stderr


def test_deploy_kubernetes_is_the_charts_rendering():
    spec = importlib.util.spec_from_file_location("update_manifests", REPO / "ci/update-manifests.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    require(os.access(HELM, os.X_OK), f"helm built at {HELM}")
    want = mod.render(HELM)
    have = {p.name: p.read_text() for p in (REPO / "deploy/kubernetes").glob("*.yaml")}
    stale = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
    assert stale == [], f"run python3 ci/update-manifests.py: {stale}"
