"""A complete thaw node on loopback, for tests, benchmarks and the worked
example: SeaweedFS (the store), thawd (`thaw serve`), a private containerd
with gVisor's shim and thaw's stand-in, and a locally built busybox image
whose workload keeps its state in memory. Nothing is faked.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from control import config as configmod
from control.dev import ocibuild
from control.dev.containerd import PrivateContainerd
from control.errors import PreconditionError, ThawError, Timeout
from control.dev.seaweed import Seaweed

BUILD = configmod.REPO_ROOT / "build"
THAW = Path(sys.executable).parent / "thaw"

IMAGE = "thaw.dev/test/counter:1"
# A workload with a costly warm-up whose state lives in memory: a random boot
# id chosen at start and a counter ticking every 100 ms. A restored container
# keeps the boot id and continues the counter; a cold one gets a new boot id.
COUNTER = b"""#!/bin/sh
# Warm-up that stands in for a model server's start: make WEIGHTS_MB of
# "weights" in memory (the rootfs overlay is sandbox memory) and hash them
# WARMUP_ROUNDS times.
boot=$(cat /proc/sys/kernel/random/uuid)
dd if=/dev/urandom of=/tmp/weights bs=1048576 count=${WEIGHTS_MB:-4} 2>/dev/null
r=0; while [ $r -lt ${WARMUP_ROUNDS:-1} ]; do sha256sum /tmp/weights > /tmp/digest; r=$((r+1)); done
# A known string in memory, 32 times between 64 KiB of random bytes: most
# chunks holding it are then stored uncompressed, so in a plaintext store it is
# there to be found (tests/integration/test_tenancy.py).
if [ -n "$SECRET" ]; then for i in $(seq 32); do head -c 65536 /dev/urandom; echo -n "$SECRET"; done > /tmp/secret; fi
echo $boot > /tmp/boot
touch /tmp/ready
i=0
# TICK set: a line on stdout every second (the container's log).
while true; do i=$((i+1)); echo "$boot $i" > /tmp/state; [ -n "$TICK" ] && [ $((i % 10)) -eq 0 ] && echo "tick $boot $i"; sleep 0.1; done
"""
ANNOTATIONS = {"thaw.dev/workload": "counter", "thaw.dev/ready": "file:/tmp/ready"}


MARK = ".thaw-testbed"   # what says a base directory is a Stack's, its contents ours to remove


def fresh_base(base: Path) -> None:
    """`base` without what an earlier Stack's run left there (a session stopped during a
    test leaves its cache, quarantine marks, store and logs, which would otherwise be the
    next run's starting state). Only a directory a Stack marked is emptied (MARK): one a
    caller filled before start() is theirs. Mounts under it are detached first, deepest first."""
    import shutil
    if (base / MARK).exists():
        prefix = str(base.resolve()) + "/"
        try:
            mounts = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]
        except OSError:
            mounts = []
        for m in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
        if base.exists():
            raise PreconditionError(f"{base}: an earlier run's state could not be removed")
    base.mkdir(parents=True, exist_ok=True)
    (base / MARK).write_text("")


class Stack:
    """SeaweedFS + thawd + a private containerd, all under one base directory
    (emptied first: fresh_base). `weed`: a store another owner runs and stops (two
    nodes of one store: bench/gpu/pods.py), else this stack's own; `build`: the
    binaries (runsc, containerd, thaw's Go commands); `thaw`: the argv of thaw's
    CLI (default the virtualenv's console script)."""

    def __init__(self, base: Path, name: str, extra_env: dict[str, str] | None = None, *,
                 weed: Seaweed | None = None, build: Path = BUILD, thaw: list[str] | None = None) -> None:
        self.base, self.name = base, name
        self.extra_env = extra_env or {}
        self.own_weed = weed is None
        self.weed = weed or Seaweed(base / "weed")
        self.build = build
        self.thaw_argv = thaw or [str(THAW)]
        self.thawd: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_"))}
        env.update({
            "THAW_NODE_STATE_DIR": str(self.base / "state"), "THAW_NODE_LOG_DIR": str(self.base / "log"),
            "THAW_CACHE_DIR": str(self.base / "cache"), "THAW_THAWD_SOCKET": str(self.base / "thawd" / "thawd.sock"),
            "THAW_THAWD_METRICS_ADDR": "", "THAW_RUNSC_PATH": str(self.build / "runsc"),
            "THAW_RUNSC_ROOT": str(self.base / "thaw-runsc-root"),
            "THAW_STORE_ENDPOINT": self.weed.endpoint, "THAW_STORE_BUCKET": self.name,
            "THAW_STORE_CREDENTIALS_FILE": str(self.base / "aws-credentials"),
            "THAW_PACK_CHUNKER": str(self.build / "thaw-chunk"), "THAW_STORE_FETCHER": str(self.build / "thaw-fetch"),
            "THAW_THAWD_HEALTH_TIMEOUT_S": "20",
            # thawd asks this stack's containerd whose a container is (issue 13).
            "THAW_CONTAINERD_ADDRESS": str(self.base / "ctrd" / "containerd.sock"),
            "THAW_CONTAINERD_RUNSC_ROOT": str(self.base / "ctrd" / "runsc-root"),
            "THAW_CONTAINERD_INFO": str(self.build / "thaw-ctrinfo"),
            **self.extra_env,
        })
        return env

    def settings(self) -> configmod.Settings:
        (self.base / "empty.toml").write_text("")
        return configmod.load(environ=self.env(), config_file=self.base / "empty.toml")

    def start_store(self) -> None:
        if self.own_weed:
            self.weed.start()
        self.weed.credentials.write_aws_file(self.base / "aws-credentials")

    def start(self) -> "Stack":
        fresh_base(self.base)
        self.start_store()
        self.start_thawd()
        self.ctrd = PrivateContainerd(self.base / "ctrd", self.build, self.settings()).start()
        ocibuild.build(self.base / "image.tar", IMAGE, ocibuild.busybox_files(
            self.build / "busybox", {"/app/run.sh": ocibuild.File(COUNTER, 0o755)}), ["/app/run.sh"])
        self.ctrd.import_image(self.base / "image.tar")
        return self

    def start_thawd(self) -> None:
        self.thawd_log = open(self.base / "thawd.log", "ab")
        self.thawd = subprocess.Popen([*self.thaw_argv, "serve"], env=self.env(), stdout=self.thawd_log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        sock = self.base / "thawd" / "thawd.sock"
        end = time.monotonic() + 60
        while not sock.exists():
            if self.thawd.poll() is not None or time.monotonic() > end:
                raise PreconditionError(f"thawd did not start: {(self.base / 'thawd.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def stop_thawd(self) -> None:
        if self.thawd and self.thawd.poll() is None:
            self.thawd.send_signal(signal.SIGTERM)
            try:
                self.thawd.wait(30)
            except subprocess.TimeoutExpired:
                self.thawd.kill()
                self.thawd.wait(10)
                raise ThawError("thawd did not stop within 30 s of SIGTERM")
            finally:
                if getattr(self, "thawd_log", None):
                    self.thawd_log.close()
                    self.thawd_log = None
        self.thawd = None
        if getattr(self, "thawd_log", None):
            self.thawd_log.close()
            self.thawd_log = None

    def stop(self) -> None:
        """Everything, whatever fails first (a thawd that would not stop must not leave
        SeaweedFS running)."""
        try:
            if hasattr(self, "ctrd"):
                self.ctrd.stop()
        finally:
            try:
                self.stop_thawd()
            finally:
                if self.own_weed:
                    self.weed.stop()

    def thaw(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.thaw_argv, *args], env=self.env(), capture_output=True, text=True, timeout=60)

    def stats(self) -> dict:
        p = self.thaw("stats", "--json")
        if p.returncode != 0:
            raise ThawError(f"thaw stats failed: {p.stderr.strip()}")
        return json.loads(p.stdout)

    def stats_decisions(self, container: str, n: int = 20) -> list[dict]:
        """thawd's last decisions about `container`, oldest first (`thaw stats --decisions`)."""
        p = self.thaw("stats", "--decisions", str(n), "--container", container, "--json")
        if p.returncode != 0:
            raise ThawError(f"thaw stats --decisions failed: {p.stderr.strip()}")
        return json.loads(p.stdout)["decisions"]

    def metrics(self) -> dict[str, float]:
        """thawd's counters (the same as its /metrics endpoint's)."""
        return self.stats()["counters"]

    def decisions(self) -> list[dict]:
        p = self.ctrd.settings.standin_log
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []

    def state(self, cid: str, timeout_s: float = 60, ns: str = "thaw") -> tuple[str, int]:
        """(boot id, counter) read from inside the container."""
        end = time.monotonic() + timeout_s
        while True:
            p = self.ctrd.exec(cid, "cat", "/tmp/state", check=False, ns=ns)
            if p.returncode == 0 and len(p.stdout.split()) == 2:
                boot, i = p.stdout.split()
                return boot, int(i)
            if time.monotonic() > end:
                raise Timeout(f"{cid} reporting its state", timeout_s)
            time.sleep(0.1)

    def wait_published(self, timeout_s: float = 120, key_prefix: str = "") -> dict:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            entries = [e for e in self.stats()["entries"] if e["state"] == "ready" and e["key"].startswith(key_prefix)]
            if entries:
                return entries[0]
            time.sleep(0.5)
        raise Timeout(f"publishing an image (thawd log: {(self.base / 'thawd.log').read_text()[-3000:]})", timeout_s)




# -- Kubernetes pods through CRI ---------------------------------------------------

POD_IMAGE = "thaw.dev/test/pod:1"
POD_IMAGE_2 = "thaw.dev/test/pod:2"   # other content (a file names it): another image digest, so another key
# One script, two containers of a pod: the app makes WEIGHTS_MB of "weights"
# and serves its state over HTTP on PORT; the sidecar (no PORT) only keeps
# its own state. Each has a boot id chosen at start and a counter ticking
# every 100 ms, in memory (/tmp is the sandbox's memory), and prints a line
# every second (its log).
POD_SCRIPT = b"""#!/bin/sh
boot=$(cat /proc/sys/kernel/random/uuid)
dd if=/dev/urandom of=/tmp/weights bs=1048576 count=${WEIGHTS_MB:-4} 2>/dev/null
r=0; while [ $r -lt ${WARMUP_ROUNDS:-1} ]; do sha256sum /tmp/weights > /tmp/digest; r=$((r+1)); done
mkdir -p /www
# The page is replaced by a rename, never rewritten in place: `>` truncates
# before echo writes, and httpd serving the file in between sent an empty body
# (seen under load in test_cri_restore). /tmp/state's readers retry a short read.
echo "$boot 0" > /www/.index.html && mv /www/.index.html /www/index.html
echo "$boot 0" > /tmp/state
[ -n "$PORT" ] && httpd -p "$PORT" -h /www
touch /tmp/ready
echo "started $boot"
i=0
while true; do
  i=$((i+1))
  echo "$boot $i" > /tmp/state
  [ -n "$PORT" ] && echo "$boot $i" > /www/.index.html && mv /www/.index.html /www/index.html
  [ $((i % 10)) -eq 0 ] && echo "tick $boot $i"
  sleep 0.1
done
"""
POD_CONTAINERS = {"app": {"PORT": "8080"}, "sidecar": {"WEIGHTS_MB": "1"}}


def pod_annotations(workload: str, containers=("app", "sidecar"), probe: str = "file:/tmp/ready") -> dict[str, str]:
    """A pod's opt-in and the containers it declares (control/lifecycle/pod.py)."""
    return {"thaw.dev/workload": workload, **{f"thaw.dev/ready.{c}": probe for c in containers}}


def write_fake_gpus(directory: Path, n: int, files: Path) -> list[tuple[int, str]]:
    """A CDI spec of kind nvidia.com/gpu in `directory` for `n` fake GPUs, as a node's
    GPU registry names them (nvidia.com/gpu=<index>): each GPU is its device node
    /dev/nvidia<index> (no host node behind it: CDI takes the type and numbers given)
    and a directory of its own under `files`, bound at FAKE_GPU_DIR, with a fake
    nvidia-smi that prints its UUID. No /dev/nvidiactl: that control node turns
    runsc's nvproxy on (runsc/specutils/nvidia.go GPUFunctionalityRequested), which
    cannot start without a driver ("failed to get Nvidia driver version: failed to
    open /dev/nvidiactl"), so on CPU a fake GPU is what thaw can tell of one without
    nvproxy: the GPU nodes a container holds. [(index, UUID)]."""
    devices, out = [], []
    for i in range(n):
        uuid = f"GPU-fake-{i:04d}"
        d = files / str(i)
        d.mkdir(parents=True, exist_ok=True)
        (d / "nvidia-smi").write_text(f"#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: {uuid})'\n")
        os.chmod(d / "nvidia-smi", 0o755)
        devices.append({"name": str(i), "containerEdits": {
            "deviceNodes": [{"path": f"/dev/nvidia{i}", "type": "c", "major": 195, "minor": i}],
            "mounts": [{"hostPath": str(d), "containerPath": FAKE_GPU_DIR, "type": "bind",
                        "options": ["ro", "nosuid", "nodev", "bind"]}]}})
        out.append((i, uuid))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "thaw-fake-gpu.json").write_text(json.dumps(
        {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": devices}, indent=2))
    return out


FAKE_GPU_DIR = "/thaw-fake-gpu"   # where a fake GPU's files appear in its container


class CriStack(Stack):
    """SeaweedFS + thawd + a private containerd with CRI (ci/cri.sh), the
    `runsc-thaw` handler's stand-in configured to reach this thawd. `gpus`: that
    many fake GPUs in CRI's CDI registry (write_fake_gpus; a container's config asks
    for one as the kubelet does: CDI_devices nvidia.com/gpu=<index>); `cdi_dirs`:
    CRI's CDI directories instead (containerd's default when neither is given);
    `runsc_flags`: more runsc global flags for the handlers ("name=value"); `subnet`:
    the pods' addresses (ci/cri.sh's default else: two stacks at once need two)."""

    def __init__(self, *args, gpus: int = 0, cdi_dirs: list[Path] | None = None,
                 runsc_flags: list[str] | None = None, subnet: str = "", **kw) -> None:
        super().__init__(*args, **kw)
        self.gpus, self.cdi_dirs, self.runsc_flags, self.subnet = gpus, cdi_dirs, runsc_flags or [], subnet

    def start(self) -> "CriStack":
        from control.dev import cri as crimod
        fresh_base(self.base)
        # thawd asks ci/cri.sh's containerd (its socket and runsc root under BASE)
        # whose a pod is: the tenant is the pod's Kubernetes namespace (issue 13).
        self.extra_env = {"THAW_CONTAINERD_ADDRESS": str(self.base / "cri" / "containerd.sock"),
                          "THAW_CONTAINERD_RUNSC_ROOT": str(self.base / "cri" / "runsc-root"), **self.extra_env}
        self.start_store()
        self.start_thawd()
        self.standin_log = self.base / "standin.log"
        settings = configmod.replace(self.settings(), standin_state_dir=self.base / "standin",
                                     standin_log=self.standin_log)
        cfg = self.base / "thaw-config.toml"
        cfg.write_text(configmod.render_toml(
            [(k, v) for k, v in configmod.values(settings) if k.standin],
            header=("# The stand-in's keys, from the settings thawd runs with (control/dev/testbed.py).",)))
        cdi_dirs = self.cdi_dirs
        if self.gpus:
            write_fake_gpus(self.base / "cdi", self.gpus, self.base / "fake-gpu")
            cdi_dirs = [self.base / "cdi"]
        self.cri = crimod.up(self.base / "cri", self.build, cfg, cdi_dirs=cdi_dirs, runsc_flags=self.runsc_flags,
                             subnet=self.subnet)
        files = ocibuild.busybox_files(self.build / "busybox", {"/app/run.sh": ocibuild.File(POD_SCRIPT, 0o755),
                                                           "/bin/httpd": ocibuild.File(link="busybox"),
                                                           "/bin/mv": ocibuild.File(link="busybox")})
        for ref in (POD_IMAGE, POD_IMAGE_2):
            archive = self.base / f"pod-image-{ref.rsplit(':', 1)[1]}.tar"
            # Each its own content: thaw keys a container by its image's digest (issue 13),
            # and two names of one content are one image.
            ocibuild.build(archive, ref, {**files, "/etc/thaw-test-image": ocibuild.File(ref.encode())},
                           ["/app/run.sh"])
            self.cri.import_image(archive)
        return self

    def stop(self) -> None:
        from control.dev import cri as crimod
        try:
            if hasattr(self, "cri"):
                crimod.down(self.base / "cri", self.build)
        finally:
            try:
                self.stop_thawd()
            finally:
                if self.own_weed:
                    self.weed.stop()

    def decisions(self) -> list[dict]:
        p = self.base / "standin.log"
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []

    def run_pod(self, name: str, annotations: dict[str, str], containers: dict[str, dict] | None = None, *,
                uid: str | None = None, attempt: int = 0, handler: str = "runsc-thaw",
                image: str = POD_IMAGE, extra: dict[str, dict] | None = None) -> tuple[str, str, dict[str, str]]:
        """RunPodSandbox, then CreateContainer + StartContainer per container in order, as the
        kubelet does: (pod id, pod config path, {container name: id})."""
        cfg = self.cri.pod_config(name, annotations, uid=uid, attempt=attempt)
        pod = self.cri.runp(cfg, handler)
        ids = {}
        for cname, env in (containers if containers is not None else POD_CONTAINERS).items():
            kw = dict((extra or {}).get(cname, {}))
            img = kw.pop("image", image)
            cid = self.cri.create(pod, self.cri.container_config(f"{name}-{attempt}", cname, img, env=env, **kw), cfg)
            self.cri.start(cid)
            ids[cname] = cid
        return pod, cfg, ids

    def wait_key(self, prefix: str, timeout_s: float = 120) -> dict:
        """The published (ready) cache entry whose key starts with `prefix`."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for e in self.stats()["entries"]:
                if e["state"] == "ready" and e["key"].startswith(prefix):
                    return e
            time.sleep(0.5)
        raise Timeout(f"publishing an image {prefix}* (thawd log: {(self.base / 'thawd.log').read_text()[-3000:]})",
                      timeout_s)

    def state(self, cid: str, timeout_s: float = 60) -> tuple[str, int]:
        """(boot id, counter) read from inside the container through CRI's exec."""
        end = time.monotonic() + timeout_s
        while True:
            p = self.cri.exec(cid, "cat", "/tmp/state", check=False)
            if p.returncode == 0 and len(p.stdout.split()) == 2:
                boot, i = p.stdout.split()
                return boot, int(i)
            if time.monotonic() > end:
                raise Timeout(f"{cid} reporting its state ({p.stderr.strip()[-300:]})", timeout_s)
            time.sleep(0.1)
