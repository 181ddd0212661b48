"""A private containerd with its CRI plugin on (ci/cri.sh), and crictl driving
it as the kubelet drives CRI: RunPodSandbox with a runtime handler and pod
annotations, CreateContainer / StartContainer per container, then Stop /
Remove. The CRI tests (tests/integration/test_cri_*.py) and the pod
benchmark (bench/pods.py) use it; docs/containerd.md#cri has the recipe.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from control import config as configmod
from control.errors import ThawError, Timeout

CRI_SH = configmod.REPO_ROOT / "ci" / "cri.sh"
NAMESPACE = "k8s.io"   # CRI's containerd namespace: images must be imported there


class CrictlError(ThawError):
    def __init__(self, args: tuple[str, ...], rc: int, stderr: str) -> None:
        super().__init__(f"crictl {' '.join(args[:3])} failed (exit {rc}): {stderr.strip()[-1500:]}",
                         returncode=rc)
        self.stderr = stderr


class Cri:
    """crictl against one ci/cri.sh instance (`up` printed `env`)."""

    def __init__(self, base: Path, build: Path, env: dict[str, str]) -> None:
        self.base, self.build, self.env = base, build, env
        self.config = env["CRI_CONFIG_FILE"]
        # record(argv, returncode, seconds): every crictl and ctr command, for a benchmark's
        # report (bench/gpu/pods.py); None: not recorded.
        self.record = None

    def _run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        t0 = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if self.record is not None:
            self.record(argv, p.returncode, time.monotonic() - t0)
        return p

    def crictl(self, *args: str, check: bool = True, timeout: float = 90) -> subprocess.CompletedProcess:
        # crictl (urfave/cli) reads a command's flags only before its first argument.
        p = self._run([str(self.build / "crictl"), "--config", self.config, *args], timeout)
        if check and p.returncode != 0:
            raise CrictlError(args, p.returncode, p.stderr)
        return p

    def json(self, command: str, *args: str) -> dict:
        return json.loads(self.crictl(command, "-o", "json", *args).stdout)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = self._run([str(self.build / "ctr"), "--address", self.env["CONTAINERD_ADDRESS"],
                       "--namespace", NAMESPACE, *args], 120)
        if check and p.returncode != 0:
            raise ThawError(f"ctr {' '.join(args[:3])} failed: {p.stderr.strip()[-500:]}")
        return p

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", "--all-platforms", str(archive))

    def write(self, name: str, obj: dict) -> str:
        p = self.base / name
        p.write_text(json.dumps(obj))
        return str(p)

    def pod_config(self, name: str, annotations: dict[str, str] | None = None, *, uid: str | None = None,
                   attempt: int = 0) -> str:
        """A PodSandboxConfig as the kubelet writes one (metadata, hostname, log directory, annotations)."""
        logs = self.base / "logs" / name
        logs.mkdir(parents=True, exist_ok=True)
        return self.write(f"{name}-pod-{attempt}.json", {
            "metadata": {"name": name, "namespace": "default", "uid": uid or f"{name}-uid", "attempt": attempt},
            "hostname": name, "log_directory": str(logs), "annotations": annotations or {},
            "labels": {"app": name}, "linux": {}})

    def container_config(self, pod: str, name: str, image: str | None = None, command: list[str] | None = None,
                         env: dict[str, str] | None = None, attempt: int = 0, **extra) -> str:
        """A ContainerConfig; the log goes to <pod log directory>/<name>_<attempt>.log as the kubelet names it."""
        c = {"metadata": {"name": name, "attempt": attempt}, "image": {"image": image or self.env["TEST_IMAGE"]},
             "log_path": f"{name}_{attempt}.log", **extra}
        if command:
            c["command"] = command
        if env:
            c["envs"] = [{"key": k, "value": v} for k, v in env.items()]
        return self.write(f"{pod}-{name}-{attempt}.json", c)

    def runp(self, pod_cfg: str, handler: str) -> str:
        return self.crictl("runp", "--runtime", handler, pod_cfg).stdout.strip()

    def create(self, pod: str, ctr_cfg: str, pod_cfg: str) -> str:
        return self.crictl("create", pod, ctr_cfg, pod_cfg).stdout.strip()

    def start(self, cid: str) -> None:
        self.crictl("start", cid)

    def exec(self, cid: str, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return self.crictl("exec", cid, *cmd, check=check, timeout=timeout)

    def pod_ip(self, pod: str) -> str:
        return self.json("inspectp", pod)["status"]["network"]["ip"]

    def remove_pod(self, pod: str) -> None:
        """What the kubelet does with a pod it is done with: StopPodSandbox, RemovePodSandbox."""
        self.crictl("stopp", pod)
        self.crictl("rmp", pod)

    def wait_pod_state(self, pod: str, state: str, timeout_s: float = 30) -> dict:
        end = time.monotonic() + timeout_s
        while True:
            st = self.json("inspectp", pod)
            if st["status"]["state"] == state:
                return st
            if time.monotonic() > end:
                raise Timeout(f"pod {pod} reaching {state} (it is {st['status']['state']})", timeout_s)
            time.sleep(0.2)


def down(base: Path, build: Path) -> None:
    r = subprocess.run(["bash", str(CRI_SH), "down", str(base)], capture_output=True, text=True, timeout=180,
                       env={**os.environ, "THAW_BUILD_DIR": str(build)})
    if r.returncode != 0:
        raise ThawError(f"ci/cri.sh down {base} failed: {r.stderr.strip()[-1000:]}")


def up(base: Path, build: Path, thaw_config: Path | None = None, *, cdi_dirs: list[Path] | None = None,
       runsc_flags: list[str] | None = None, subnet: str = "") -> Cri:
    """ci/cri.sh up at `base` (anything left there first goes down). `thaw_config`:
    the stand-in's configuration file (thawd's socket, its state and log), as
    /etc/thaw/config.toml is on a node; `cdi_dirs`: where CRI reads CDI specs
    (THAW_CRI_CDI_DIRS); `runsc_flags`: "name=value" runsc flags (THAW_CRI_RUNSC_FLAGS);
    `subnet`: the pods' addresses (THAW_CRI_SUBNET)."""
    down(base, build)
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env["THAW_BUILD_DIR"] = str(build)
    if thaw_config is not None:
        env["THAW_CONFIG"] = str(thaw_config)
    if cdi_dirs:
        env["THAW_CRI_CDI_DIRS"] = ":".join(map(str, cdi_dirs))
    if runsc_flags:
        env["THAW_CRI_RUNSC_FLAGS"] = " ".join(runsc_flags)
    if subnet:
        env["THAW_CRI_SUBNET"] = subnet
    r = subprocess.run(["bash", str(CRI_SH), "up", str(base)], capture_output=True, text=True, timeout=180, env=env)
    if r.returncode != 0:
        raise ThawError(f"ci/cri.sh up {base} failed:\n{r.stdout}\n{r.stderr}")
    return Cri(base, build, dict(line.split("=", 1) for line in r.stdout.split()))
