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
  and both toggles (docs/h200-facts.md). A checkpoint saves every process of
  the sandbox: a torch.compile'd server's idle compile workers made its image
  ~9x that of the same model with CUDA graphs (shared/docs/gvisor-facts.md).
  The environment keeps them from being started at all
  (TORCHINDUCTOR_COMPILE_THREADS=1: inductor compiles in the server's own
  process, serially); the route's shutdown covers a workload that overrides it.
  The workload serves that route (bench/gpu/server.py does).
- pytorch-offload: pytorch, plus the weights out of the CUDA driver's copy
  path (docs/gpu.md, "Cooperative restore"): after /thaw/pre-checkpoint,
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
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, Union

from control.errors import HookError, NotFound, RunscError, SpecError

if TYPE_CHECKING:
    from runsc_hooks.runsc import Runsc

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

PROFILES: dict[str, Profile] = {
    "none": Profile("none"),
    "pytorch": Profile("pytorch", env=PYTORCH_ENV, pre_checkpoint=(HttpHook("/thaw/pre-checkpoint"),)),
    "pytorch-offload": Profile(
        "pytorch-offload",
        env=PYTORCH_ENV,
        pre_checkpoint=(HttpHook("/thaw/pre-checkpoint"), HttpHook("/thaw/offload-weights")),
        post_restore=(HttpHook("/thaw/restore-weights"),),
    ),
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

# exec_in_sandbox(argv, timeout_s) -> (exit code, output)
ExecFn = Callable[[Sequence[str], float], "tuple[int, str]"]


@dataclass(frozen=True)
class Target:
    """Where hooks go: the sandbox's address as the node reaches it, and a way to exec in it.

    http_via_exec: send HTTP hooks from inside the sandbox (to its own
    127.0.0.1) with the workload's python3, through exec_in_sandbox. thawd does
    this for containers started by containerd, whose address it does not know.
    """
    host: str = "127.0.0.1"
    exec_in_sandbox: ExecFn | None = None
    http_via_exec: bool = False


# The HTTP client run inside the sandbox for http_via_exec: argv = method, url,
# body, timeout; prints the status and body, exits 1 on an HTTP error status.
_IN_SANDBOX_HTTP = (
    "import sys,urllib.request as u,urllib.error as e\n"
    "m,url,b,t=sys.argv[1:5]\n"
    "r=u.Request(url,data=(b.encode() if b or m in ('POST','PUT') else None),method=m)\n"
    "try:\n"
    " x=u.urlopen(r,timeout=float(t));print(x.status);print(x.read().decode(errors='replace')[-500:])\n"
    "except e.HTTPError as h:\n"
    " print(h.code);print(h.read().decode(errors='replace')[-500:]);sys.exit(1)\n"
)


def http_exec_argv(hook: "HttpHook") -> list[str]:
    """argv that sends `hook` from inside the sandbox to its own loopback."""
    return ["python3", "-c", _IN_SANDBOX_HTTP, hook.method, f"http://127.0.0.1:{hook.port}{hook.path}",
            hook.body, str(hook.timeout_s)]


def runsc_exec(runsc: "Runsc", cid: str) -> ExecFn:
    """An ExecFn that runs hook commands in sandbox `cid` through `runsc exec`."""
    def run(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        try:
            proc = runsc.exec(cid, argv, timeout_s)
        except RunscError as e:
            return (-1 if e.returncode is None else e.returncode), e.stderr_tail or e.runsc_message
        return 0, proc.stdout + proc.stderr
    return run


def run_hooks(profile: Profile, phase: str, target: Target) -> list[dict]:
    """Run the profile's hooks for `phase` in order; stop at the first failure (HookError).

    Returns one record per hook: what ran, how long it took, its answer.
    """
    records = []
    for i, hook in enumerate(profile.hooks(phase)):
        name = f"{profile.name}/{phase}[{i}] {hook.describe()}"
        t0 = time.monotonic()
        if isinstance(hook, HttpHook) and target.http_via_exec:
            if target.exec_in_sandbox is None:
                raise HookError(name, "http_via_exec needs a way to run a command in the sandbox")
            rc, text = target.exec_in_sandbox(http_exec_argv(hook), hook.timeout_s + 5)
            if rc != 0:
                raise HookError(name, f"in-sandbox HTTP request failed (exit {rc}): {text.strip()[-500:]}")
            first = text.strip().splitlines()[0] if text.strip() else ""
            rec = {"hook": hook.describe(), "status": int(first) if first.isdigit() else None}
        elif isinstance(hook, HttpHook):
            status, text = _http(hook, target.host, name)
            rec = {"hook": hook.describe(), "status": status}
        else:
            if target.exec_in_sandbox is None:
                raise HookError(name, "no way to run a command in this sandbox was given")
            rc, text = target.exec_in_sandbox(list(hook.argv), hook.timeout_s)
            if rc != 0:
                raise HookError(name, f"exit {rc}: {text.strip()[-500:]}")
            rec = {"hook": hook.describe(), "exit": rc}
        rec["seconds"] = round(time.monotonic() - t0, 4)
        rec["output"] = text.strip()[-500:]
        log.info("hook %s: %.3fs", name, rec["seconds"])
        records.append(rec)
    return records


def _http(hook: HttpHook, host: str, name: str) -> tuple[int, str]:
    import urllib.error  # here, not at the top: `thaw restore` of a sandbox without hooks never pays for it
    import urllib.request
    url = f"http://{host}:{hook.port}{hook.path}"
    data = hook.body.encode() if hook.body or hook.method in ("POST", "PUT") else None
    req = urllib.request.Request(url, data=data, method=hook.method)
    try:
        with urllib.request.urlopen(req, timeout=hook.timeout_s) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace").strip()[-500:]
        raise HookError(name, f"HTTP {e.code} from {url}: {body}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise HookError(name, f"no answer from {url}: {reason}") from None
