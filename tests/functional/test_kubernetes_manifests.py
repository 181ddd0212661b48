"""deploy/kubernetes validated by thaw-kubecheck (strict typed decoding with
k8s.io/api, apimachinery's name/label validation, cross-references), then
thaw's own policy on the decoded objects."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from control import config
from tests.conftest import BUILD, REPO, require

MANIFESTS = REPO / "deploy/kubernetes"
KUBECHECK = BUILD / "thaw-kubecheck"


def kubecheck(*paths: Path) -> tuple[int, dict, str]:
    require(os.access(KUBECHECK, os.X_OK), f"thaw-kubecheck built at {KUBECHECK} (make build)")
    p = subprocess.run([str(KUBECHECK), "-json", *map(str, paths)], capture_output=True, text=True, timeout=60)
    return p.returncode, json.loads(p.stdout), p.stderr


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    rc, out, err = kubecheck(MANIFESTS)
    assert out["errors"] == [] and rc == 0, out["errors"] or err
    return {(o["kind"], o["name"]): o["object"] for o in out["objects"]}


def test_every_manifest_decodes_strictly(objects):
    assert set(objects) == {
        ("Namespace", "thaw-system"), ("RuntimeClass", "runsc-thaw"), ("ServiceAccount", "thawd"),
        ("ConfigMap", "thaw-config"), ("Secret", "thaw-s3-credentials"), ("DaemonSet", "thawd"),
        ("Secret", "thaw-manifest-key"), ("Secret", "thaw-tenant-keys"),
        ("ClusterRole", "thaw-thawd"), ("ClusterRoleBinding", "thaw-thawd"), ("Service", "thawd-metrics"),
        ("ValidatingAdmissionPolicy", "thaw-thawd-own-node"), ("ValidatingAdmissionPolicyBinding", "thaw-thawd-own-node"),
        ("Pod", "llm-server"),
    }


def test_runtimeclass_matches_the_handler_thaw_writes(objects, tmp_path):
    rc_obj = objects[("RuntimeClass", "runsc-thaw")]
    defaults = config.load(environ={}, default_file=tmp_path / "absent")
    assert rc_obj["handler"] == defaults.runtime_handler


def test_configmap_holds_a_valid_thaw_config(objects, tmp_path):
    text = objects[("ConfigMap", "thaw-config")]["data"]["config.toml"]
    f = tmp_path / "config.toml"
    f.write_text(text)
    s = config.load(environ={}, config_file=f)          # raises ConfigError naming any bad key
    assert s.runsc_path == Path("/opt/thaw/bin/runsc")
    assert s.runtime_handler == objects[("RuntimeClass", "runsc-thaw")]["handler"]
    assert s.store_bucket and s.cache_budget_bytes > 0
    assert s.containerd_restart_command[:2] == ("nsenter", "--target")


def test_daemonset_runs_where_runtimeclass_schedules(objects):
    ds = objects[("DaemonSet", "thawd")]["spec"]["template"]["spec"]
    rc_obj = objects[("RuntimeClass", "runsc-thaw")]
    assert ds["nodeSelector"] == rc_obj["scheduling"]["nodeSelector"] == {"thaw.dev/node": "true"}


def test_daemonset_is_privileged_with_the_host_paths_thaw_writes(objects):
    spec = objects[("DaemonSet", "thawd")]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    host = {v["hostPath"]["path"]: v["name"] for v in spec["volumes"] if "hostPath" in v}
    for p in ("/etc/containerd", "/opt/thaw", "/var/lib/thaw", "/run", "/etc/thaw"):
        assert p in host, p
    init = spec["initContainers"][0]
    main = spec["containers"][0]
    for c in (init, main):
        assert c["securityContext"]["privileged"] is True
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        # Host paths appear at the same paths inside the pod (files name host paths).
        for path, vol in host.items():
            assert mounts.get(vol) == path, (c["name"], vol)
    assert init["command"][:2] == ["thaw", "provision"] and "--no-systemd" in init["command"]
    assert main["command"] == ["thaw", "serve"]
    assert main["readinessProbe"]["exec"]["command"][:2] == ["thaw", "doctor"]
    env = {e["name"]: e for e in main["env"]}
    assert env["THAW_CONFIG"]["value"] == "/etc/thaw-config/config.toml"
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[k]["valueFrom"]["secretKeyRef"]["name"] == "thaw-s3-credentials"


def test_example_pod_opts_in(objects):
    pod = objects[("Pod", "llm-server")]
    assert pod["spec"]["runtimeClassName"] == "runsc-thaw"
    assert pod["metadata"]["annotations"]["thaw.dev/workload"]


BAD = {
    "unknown field": """apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: x}
handler: x
handlr: y
""",
    "cannot unmarshal": """apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers: [{name: c, image: i, ports: [{containerPort: "http"}]}]
""",
    'runtimeClassName "runsc-nope"': """apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  runtimeClassName: runsc-nope
  containers: [{name: c, image: i}]
""",
    "does not match spec.template.metadata.labels": """apiVersion: apps/v1
kind: DaemonSet
metadata: {name: d}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: c}}
    spec: {containers: [{name: c, image: i}]}
""",
    'handler "Not_A_Label"': """apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: x}
handler: Not_A_Label
""",
    'has no key "nope"': """apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
data: {a: b}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
    - name: c
      image: i
      env: [{name: X, valueFrom: {configMapKeyRef: {name: cm, key: nope}}}]
""",
    'roleRef: no ClusterRole "nope"': """apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: b}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nope}
subjects: [{kind: ServiceAccount, name: default, namespace: default}]
""",
    'verb "gett"': """apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: r}
rules: [{apiGroups: [""], resources: [pods], verbs: [gett]}]
""",
    "picks no pod template": """apiVersion: v1
kind: Service
metadata: {name: s}
spec:
  selector: {app: nothing}
  ports: [{name: m, port: 9464}]
""",
    'targetPort "metrics" is no container port': """apiVersion: v1
kind: Pod
metadata: {name: p, labels: {app: a}}
spec:
  containers: [{name: c, image: i, ports: [{name: http, containerPort: 80}]}]
---
apiVersion: v1
kind: Service
metadata: {name: s}
spec:
  selector: {app: a}
  ports: [{name: m, port: 9464, targetPort: metrics}]
""",
    'policyName "nope"': """apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: b}
spec: {policyName: nope, validationActions: [Deny]}
""",
}


@pytest.mark.parametrize("expected", list(BAD))
def test_kubecheck_rejects(tmp_path, expected):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD[expected])
    rc, out, _ = kubecheck(f)
    assert rc == 1
    assert any(expected in e for e in out["errors"]), out["errors"]
