"""Pods through containerd's CRI plugin, driven by crictl as the kubelet
drives it: a private containerd with CRI on (ci/cri.sh: pinned local pause
image, a ptp CNI network, gVisor's shim under the `runsc` and `runsc-thaw`
handlers), RunPodSandbox with pod annotations, CreateContainer /
StartContainer, logs, exec, the pod's address, then Stop / Remove.
Nothing is faked; no thawd runs, so `runsc-thaw` pods start cold."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import BUILD, REPO, require

CRI = REPO / "ci/cri.sh"


class Cri:
    def __init__(self, base: Path, env: dict[str, str]) -> None:
        self.base, self.env = base, env
        self.config = env["CRI_CONFIG_FILE"]

    def crictl(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        p = subprocess.run([str(BUILD / "crictl"), "--config", self.config, *args], capture_output=True,
                           text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise AssertionError(f"crictl {' '.join(args)} failed ({p.returncode}): {p.stderr[-2000:]}")
        return p

    def json(self, command: str, *args: str) -> dict:
        # crictl (urfave/cli) stops reading flags at the first argument.
        return json.loads(self.crictl(command, "-o", "json", *args).stdout)

    def write(self, name: str, obj: dict) -> str:
        p = self.base / name
        p.write_text(json.dumps(obj))
        return str(p)

    def pod_config(self, name: str, annotations: dict[str, str] | None = None) -> str:
        logs = self.base / "logs" / name
        logs.mkdir(parents=True, exist_ok=True)
        return self.write(f"{name}-pod.json", {
            "metadata": {"name": name, "namespace": "default", "uid": f"{name}-uid", "attempt": 0},
            "hostname": name, "log_directory": str(logs), "annotations": annotations or {},
            "labels": {"app": name}, "linux": {}})

    def container_config(self, pod: str, name: str, command: list[str] | None = None) -> str:
        c = {"metadata": {"name": name}, "image": {"image": self.env["TEST_IMAGE"]}, "log_path": f"{name}.log"}
        if command:
            c["command"] = command
        return self.write(f"{pod}-{name}.json", c)


@pytest.fixture
def cri(name, runsc_bin):
    for b in ("crictl", "containerd", "thaw-image", "cni-bin/ptp", "cni-bin/host-local", "cni-bin/loopback"):
        require((BUILD / b).is_file(), f"{b} built at {BUILD / b}")
    base = Path(f"/tmp/thaw-it/{name}")
    subprocess.run(["bash", str(CRI), "down", str(base)], capture_output=True, timeout=120)
    r = subprocess.run(["bash", str(CRI), "up", str(base)], capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, f"ci/cri.sh up failed:\n{r.stdout}\n{r.stderr}"
        env = dict(line.split("=", 1) for line in r.stdout.split())
        yield Cri(base, env)
    finally:
        d = subprocess.run(["bash", str(CRI), "down", str(base)], capture_output=True, text=True, timeout=120)
        assert d.returncode == 0, d.stderr
        assert not base.exists()


def test_cri_answers_with_runtime_and_network_ready(cri):
    assert cri.crictl("version").stdout.split("RuntimeName:")[1].split()[0] == "containerd"
    info = json.loads(cri.crictl("info").stdout)
    conditions = {c["type"]: c["status"] for c in info["status"]["conditions"]}
    assert conditions["RuntimeReady"] and conditions["NetworkReady"], conditions
    runtimes = info["config"]["containerd"]["runtimes"]
    for handler, binary in (("runsc", "runsc"), ("runsc-thaw", "thaw-runsc")):
        assert runtimes[handler]["runtimeType"] == "io.containerd.runsc.v1"
        toml = Path(runtimes[handler]["options"]["ConfigPath"]).read_text()
        assert f'binary_name = "{BUILD / binary}"' in toml
    images = {t for i in cri.json("images")["images"] for t in i["repoTags"]}
    assert {cri.env["PAUSE_IMAGE"], cri.env["TEST_IMAGE"]} <= images


@pytest.mark.parametrize("handler", ["runsc", "runsc-thaw"])
def test_pod_lifecycle_through_crictl(cri, name, handler):
    pod_cfg = cri.pod_config(name, {"thaw.dev/workload": name, "example.com/other": "x"})
    pod = cri.crictl("runp", "--runtime", handler, pod_cfg).stdout.strip()
    status = cri.json("inspectp", pod)
    assert status["status"]["state"] == "SANDBOX_READY"
    assert status["status"]["runtimeHandler"] == handler
    # The pause container is the sandbox: its spec carries CRI's sandbox
    # annotations and, through the handler's pod_annotations, thaw's opt-in
    # (and nothing the handler does not pass through).
    spec_ann = status["info"]["runtimeSpec"]["annotations"]
    assert spec_ann["io.kubernetes.cri.container-type"] == "sandbox"
    assert spec_ann["thaw.dev/workload"] == name and "example.com/other" not in spec_ann
    ip = status["status"]["network"]["ip"]
    assert ip.startswith("10.216.0."), ip

    app = cri.crictl("create", pod, cri.container_config(name, "app", [
        "sh", "-c", "echo hello from $HOSTNAME; mkdir -p /www; echo served-by-$HOSTNAME > /www/index.html; "
                    "exec httpd -f -p 8080 -h /www"]), pod_cfg).stdout.strip()
    cri.crictl("start", app)
    ps = cri.json("ps", "--pod", pod)["containers"]
    assert [(c["metadata"]["name"], c["state"]) for c in ps] == [("app", "CONTAINER_RUNNING")]
    c = cri.json("inspect", app)
    c_ann = c["info"]["runtimeSpec"]["annotations"]
    assert c_ann["io.kubernetes.cri.container-type"] == "container"
    assert c_ann["io.kubernetes.cri.sandbox-id"] == pod and c_ann["io.kubernetes.cri.container-name"] == "app"
    assert c_ann["thaw.dev/workload"] == name

    end = time.monotonic() + 10
    logs = ""
    while f"hello from {name}" not in logs and time.monotonic() < end:
        logs = cri.crictl("logs", app).stdout
        time.sleep(0.1)
    assert f"hello from {name}" in logs
    assert "gvisor" in cri.crictl("exec", app, "cat", "/proc/version").stdout.lower()
    # The pod's address answers from the host (ptp veth, host route).
    body = ""
    while not body and time.monotonic() < end:
        try:
            body = urllib.request.urlopen(f"http://{ip}:8080/", timeout=2).read().decode()
        except OSError:
            time.sleep(0.2)
    assert body.strip() == f"served-by-{name}"

    if handler == "runsc-thaw":
        # Both the pause container and the app container went through thaw's
        # stand-in, with the opt-in; no thawd answers here, so both are cold.
        lines = [json.loads(x) for x in (cri.base / "standin.log").read_text().splitlines()]
        starts = {x["id"]: x["decision"] for x in lines if x["cmd"] == "start"}
        assert starts == {pod: "started-cold", app: "started-cold"}, lines

    cri.crictl("stop", app)
    cri.crictl("rm", app)
    cri.crictl("stopp", pod)
    cri.crictl("rmp", pod)
    assert cri.crictl("pods", "-q").stdout.strip() == ""
    assert not list((cri.base / "cni/ipam/thaw-cri").glob("10.216.*")), "pod address not released"


def test_unknown_handler_is_containerds_error(cri, name):
    r = cri.crictl("runp", "--runtime", "no-such-handler", cri.pod_config(name), check=False)
    assert r.returncode != 0
    assert 'no runtime for "no-such-handler" is configured' in r.stderr.replace('\\"', '"'), r.stderr
    assert cri.crictl("pods", "-q").stdout.strip() == ""
