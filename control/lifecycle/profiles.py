"""Workload profiles: what a kind of workload needs around checkpoint and restore.

A profile is environment for the workload (set at the cold start, so the
saved process already has it) plus hooks: pre-checkpoint hooks run against
the warm sandbox just before `runsc checkpoint`, post-restore hooks right
after `runsc restore`, before the sandbox is called healthy. A hook is an
HTTP call to the workload (the sandbox's own address) or a command run in
the sandbox (`runsc exec`; such processes die at a later restore, which is
fine for a hook that has finished). A failing hook raises HookError: a
pre-checkpoint failure means "do not publish this image", a post-restore one
"this restore is unhealthy, cold-start instead".

Profiles:
- none: nothing.
- pytorch: before the checkpoint, POST /thaw/pre-checkpoint, where the
  workload runs gc.collect(), torch.cuda.synchronize() and
  torch.cuda.empty_cache(), and ends torch.compile's compile-worker processes
  (torch._inductor.async_compile.shutdown_compile_workers()). The CUDA
  checkpoint saves every device allocation, blocks the PyTorch caching
  allocator holds but no tensor uses too; releasing them shrinks the image
  and both toggles (docs/notes/h200-facts.md). A checkpoint saves every process of
  the sandbox: a torch.compile'd server's idle compile workers made its image
  ~9x that of the same model with CUDA graphs (docs/notes/gvisor-facts.md).
  The environment keeps them from being started at all
  (TORCHINDUCTOR_COMPILE_THREADS=1: inductor compiles in the server's own
  process, serially); the route's shutdown covers a workload that overrides it.
  The workload serves that route (bench/gpu/server.py does).
- pytorch-offload: pytorch, plus the weights out of the CUDA driver's copy
  path (docs/notes/2026-11-29-gpu-restore-journal.md, the cooperative
  restores of "Restore speed levers"): after /thaw/pre-checkpoint,
  POST /thaw/offload-weights, where the workload copies its parameters into
  host memory it has page-locked (cudaHostRegister), points them there and
  frees their GPU memory (empty_cache), so the CUDA image holds only the
  context, buffers and what else is live; after the restore, POST
  /thaw/restore-weights, which copies them back to the GPU and answers once
  they are there. The driver restores device memory at ~5 GB/s, a pinned
  copy runs at ~50 GB/s in the sandbox too. Until the post-restore hook has
  answered, the workload must not serve requests that need the weights.
  bench/gpu/offload.py is a reference implementation (also `?mode=alloc`:
  cudaHostAlloc, and `?mode=drop`: no host copy, reload from the model files).
- jax: JAX (XLA) without its default preallocation. XLA's GPU client
  reserves 75 % of the device's memory at its first use
  (XLA_PYTHON_CLIENT_PREALLOCATE, XLA_PYTHON_CLIENT_MEM_FRACTION): ~108 GB
  on an H200 for a model that uses 1 GB, and the CUDA checkpoint saves every
  reserved byte, to the image and to the restored sandbox's host memory
  (a 151 s checkpoint and a 49 s restore, measured). With preallocation off,
  XLA's allocator grows to what the workload has used at its peak and keeps
  only that. JAX has no call that hands its pool back (unlike PyTorch's
  empty_cache), so there is no pre-checkpoint hook: warm up with the shapes
  you serve. (jax docs "GPU memory allocation".)
- vllm: the environment vLLM needs to checkpoint (loopback host IP, spawn
  workers, ZMQ IPC sockets in the sandbox's own /tmp, which is saved with the
  image), sleep level 1 before the checkpoint (offloads the weights to host
  memory and drops the KV cache) and wake up after the restore. Needs
  `vllm serve --enable-sleep-mode`; VLLM_SERVER_DEV_MODE=1 exposes /sleep and /wake_up.

A spec picks its profile with the annotation `thaw.dev/profile` (default
none) and may move the HTTP port with `thaw.dev/profile-port`.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Mapping, Union

from control.errors import HookError, NotFound, SpecError
from runsc_hooks import probe as probemod
from control.logfields import fields

log = logging.getLogger(__name__)

PROFILE_ANNOTATION = "thaw.dev/profile"
PORT_ANNOTATION = "thaw.dev/profile-port"
PHASES = ("pre_checkpoint", "post_restore")
# Where vLLM puts its ZMQ IPC sockets: the sandbox's own tmpfs, which the
# checkpoint saves, so the sockets the restored processes hold still exist.
VLLM_RPC_BASE_PATH = "/tmp"


@dataclass(frozen=True)
class HttpHook:
    path: str                       # with query, e.g. "/sleep?level=1"
    method: str = "POST"
    port: int = 8000
    body: str = ""
    timeout_s: float = 120.0

    def describe(self) -> str:
        return f"{self.method} :{self.port}{self.path}"


@dataclass(frozen=True)
class ExecHook:
    argv: tuple[str, ...]
    timeout_s: float = 120.0

    def describe(self) -> str:
        return "exec " + " ".join(self.argv)


Hook = Union[HttpHook, ExecHook]


@dataclass(frozen=True)
class Profile:
    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    pre_checkpoint: tuple[Hook, ...] = ()
    post_restore: tuple[Hook, ...] = ()

    def hooks(self, phase: str) -> tuple[Hook, ...]:
        if phase not in PHASES:
            raise ValueError(f"unknown hook phase {phase!r}")
        return getattr(self, phase)

    def with_port(self, port: int) -> "Profile":
        def move(h: Hook) -> Hook:
            return HttpHook(h.path, h.method, port, h.body, h.timeout_s) if isinstance(h, HttpHook) else h
        return Profile(self.name, dict(self.env), tuple(map(move, self.pre_checkpoint)),
                       tuple(map(move, self.post_restore)))


# Environment of both PyTorch profiles: torch.compile (inductor) compiles in
# the workload's own process instead of a pool of worker processes, which a
# checkpoint would save too (torch/_inductor/config.py decide_compile_threads).
PYTORCH_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}

# JAX's environment: XLA allocates GPU memory as the workload needs it instead
# of reserving 75 % of the device at its first use (the jax profile above).
JAX_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

PROFILES: dict[str, Profile] = {
    "none": Profile("none"),
    "pytorch": Profile("pytorch", env=PYTORCH_ENV, pre_checkpoint=(HttpHook("/thaw/pre-checkpoint"),)),
    "pytorch-offload": Profile(
        "pytorch-offload",
        env=PYTORCH_ENV,
        pre_checkpoint=(HttpHook("/thaw/pre-checkpoint"), HttpHook("/thaw/offload-weights")),
        post_restore=(HttpHook("/thaw/restore-weights"),),
    ),
    "jax": Profile("jax", env=JAX_ENV),
    "vllm": Profile(
        "vllm",
        env={"VLLM_HOST_IP": "127.0.0.1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
             "VLLM_RPC_BASE_PATH": VLLM_RPC_BASE_PATH, "VLLM_SERVER_DEV_MODE": "1"},
        pre_checkpoint=(HttpHook("/sleep?level=1"),),
        post_restore=(HttpHook("/wake_up"),),
    ),
}


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise NotFound("workload profile", name, f"known: {', '.join(sorted(PROFILES))}") from None


def for_spec(spec: dict) -> Profile:
    """The profile a spec asks for through its annotations."""
    ann = spec.get("annotations") or {}
    profile = get(ann.get(PROFILE_ANNOTATION, "none"))
    if PORT_ANNOTATION in ann:
        raw = ann[PORT_ANNOTATION]
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise SpecError(f"annotations.{PORT_ANNOTATION}", f"{raw!r} is not a TCP port")
        profile = profile.with_port(int(raw))
    return profile


def apply_env(spec: dict, profile: Profile) -> dict:
    """A copy of `spec` with the profile's environment (replacing same-named variables)."""
    out = copy.deepcopy(spec)
    proc = out.setdefault("process", {})
    env = [e for e in proc.get("env") or [] if e.split("=", 1)[0] not in profile.env]
    proc["env"] = env + [f"{k}={v}" for k, v in profile.env.items()]
    return out


# -- running hooks -----------------------------------------------------------------

# Hooks talk to the sandbox through the probes' Target and HTTP client
# (runsc_hooks/probe.py): one description of a sandbox, one request function.
# Its marked socket passes the closed gate, which the pre-checkpoint and
# post-restore hooks run behind (control/lifecycle/engine.py).


def run_hooks(profile: Profile, phase: str, target: probemod.Target) -> list[dict]:
    """Run the profile's hooks for `phase` in order; stop at the first failure (HookError).

    Returns one record per hook: what ran, how long it took, its answer.
    """
    records = []
    for i, hook in enumerate(profile.hooks(phase)):
        name = f"{profile.name}/{phase}[{i}] {hook.describe()}"
        t0 = time.monotonic()
        if isinstance(hook, HttpHook):
            status, text = _http(hook, target, name)
            rec = {"hook": hook.describe(), "status": status}
        else:
            if target.exec is None:
                raise HookError(name, "no way to run a command in this sandbox was given")
            rc, text = target.exec(list(hook.argv), hook.timeout_s)
            if rc != 0:
                raise HookError(name, f"exit {rc}: {text.strip()[-500:]}")
            rec = {"hook": hook.describe(), "exit": rc}
        rec["seconds"] = round(time.monotonic() - t0, 4)
        rec["output"] = text.strip()[-500:]
        log.info("hook %s: %.3fs", name, rec["seconds"], extra=fields(hook=name, duration_s=rec["seconds"]))
        records.append(rec)
    return records


def _http(hook: HttpHook, target: probemod.Target, name: str) -> tuple[int, str]:
    """Send `hook` (probe.http_request: to the address, or from inside the sandbox
    without one); an error status or no answer is a HookError."""
    where = (f"http://{target.address}:{hook.port}{hook.path}" if target.address
             else f"http://127.0.0.1:{hook.port}{hook.path} (inside the sandbox)")
    try:
        status, body = probemod.http_request(target, hook.port, hook.path, hook.timeout_s, hook.method,
                                             hook.body.encode())
    except probemod.ProbeFailed as e:
        raise HookError(name, f"no answer from {where}: {e}") from None
    text = body.decode(errors="replace")
    if status >= 400:
        raise HookError(name, f"HTTP {status} from {where}: {text.strip()[-500:]}")
    return status, text
