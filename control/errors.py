"""thaw's exception tree.

One root (`ThawError`) and a handful of subclasses. Each subclass maps to one
gRPC status code in `GRPC_STATUS` (used by server and client alike, so a
server converts an exception once and a client rebuilds the same class), and
to one CLI exit code in `EXIT_CODE`. Exceptions carry fields and build their
message from them, so logs and `--json` output can show the fields.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


class ThawError(Exception):
    """Root of every error thaw raises on purpose."""

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def to_dict(self) -> dict:
        return {"error": type(self).__name__, "message": self.message, **{
            k: v for k, v in self.fields.items() if isinstance(v, (str, int, float, bool, list, type(None)))}}


class UserError(ThawError):
    """The request is wrong: bad argument, bad spec, bad image. Fix the input."""


class ConfigError(UserError):
    """A configuration key has a bad value. `key` names it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config {key}: {problem}", key=key)
        self.key = key


class SpecError(UserError):
    """An OCI runtime spec is invalid. `field` is a dotted path into config.json."""

    def __init__(self, field: str, problem: str, path: str | None = None) -> None:
        where = f"{path}: " if path else ""
        super().__init__(f"{where}spec field {field}: {problem}", field=field, path=path)
        self.field = field


class NotFound(UserError):
    """A named thing (container, image, key) does not exist."""

    def __init__(self, what: str, name: str, hint: str = "") -> None:
        msg = f"{what} {name!r} not found" + (f": {hint}" if hint else "")
        super().__init__(msg, what=what, name=name)
        self.what = what
        self.name = name


class AlreadyExists(UserError):
    """A named thing that must be new already exists."""

    def __init__(self, what: str, name: str, hint: str = "") -> None:
        msg = f"{what} {name!r} already exists" + (f": {hint}" if hint else "")
        super().__init__(msg, what=what, name=name)
        self.what = what
        self.name = name


class InUse(UserError):
    """An address or node port is leased to another sandbox, or a host process
    listens on the port. `holder` names who has it."""

    def __init__(self, what: str, holder: str, hint: str = "") -> None:
        super().__init__(f"{what} is in use by {holder}" + (f"; {hint}" if hint else ""), what=what, holder=holder)
        self.what = what
        self.holder = holder


class ImageError(UserError):
    """A checkpoint image is missing, truncated or otherwise unusable."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"checkpoint image {path}: {problem}", path=path)
        self.path = path


class ManifestError(UserError):
    """An image manifest is invalid. `field` is a dotted path into the manifest JSON."""

    def __init__(self, field: str, problem: str, source: str | None = None) -> None:
        # A hostile document names its own fields and values: one line stays one short line.
        field, problem = _clip(field, 120), _clip(problem, 400)
        where = f"{source}: " if source else ""
        super().__init__(f"{where}manifest field {field}: {problem}", field=field, source=source)
        self.field = field
        self.source = source


def _clip(text: str, n: int) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


class PreconditionError(ThawError):
    """The node cannot do this: not root, runsc missing, no GPU, ..."""


class ProvisionError(ThawError):
    """A `thaw provision` (or `thaw uninstall`: `verb`) step failed. `done` lists what the steps before it
    changed (they stay: provisioning is idempotent, so fix and re-run)."""

    def __init__(self, step: str, problem: str, done: list[str], verb: str = "provision") -> None:
        listed = ", ".join(done) if done else "nothing"
        super().__init__(f"{verb} step {step!r} failed: {problem} (done before it: {listed})",
                         step=step, problem=problem, done=done)
        self.step = step
        self.done = done


class TupleMismatch(PreconditionError):
    """An image exists but was saved on a node this one cannot restore it on.

    `reasons` holds one line per differing field of the compatibility tuple.
    """

    def __init__(self, key: str, reasons: list[str]) -> None:
        super().__init__(f"image {key!r} does not match this node: " + "; ".join(reasons),
                         key=key, reasons=list(reasons))
        self.key = key
        self.reasons = list(reasons)


class IdentityError(PreconditionError):
    """thaw cannot tell, from what the workload cannot set, whose a container is
    or which image it runs (docs/security.md). `code` is the short reason a
    decision log and thawd's metrics show (tenant-refused, identity-unknown,
    image-moved, ...); such a container starts cold."""

    def __init__(self, code: str, problem: str) -> None:
        super().__init__(f"{code}: {problem}", code=code)
        self.code = code


class KeyMissing(PreconditionError):
    """Encryption is on and there is no key for this tenant (store.tenant_keys_dir)."""

    def __init__(self, tenant: str, where: str) -> None:
        super().__init__(f"no encryption key for tenant {tenant!r} in {where}: with store.encrypt on, "
                         "its images are neither published nor restored", tenant=tenant)
        self.tenant = tenant


class CacheFull(PreconditionError):
    """The cache cannot make room: the image exceeds the budget, or entries in use hold it."""

    def __init__(self, key: str, need: int, budget: int, in_use: int, problem: str) -> None:
        super().__init__(f"cache cannot hold image {key!r} ({need} bytes): {problem} "
                         f"(budget {budget} bytes, {in_use} bytes held by entries in use)",
                         key=key, need=need, budget=budget, in_use=in_use)


class StoreError(ThawError):
    """The object store failed or could not be reached. `op` and `object` say where."""

    def __init__(self, op: str, obj: str, problem: str, endpoint: str = "") -> None:
        at = f" at {endpoint}" if endpoint else ""
        super().__init__(f"store {op} {obj}{at}: {problem}", op=op, object=obj, endpoint=endpoint)
        self.op = op
        self.object = obj


class ApiError(ThawError):
    """The Kubernetes API server refused a request or could not be reached
    (control/thawd/kubeapi.py). `op` says which request, `status` its HTTP status
    (0: none came back)."""

    def __init__(self, op: str, problem: str, status: int = 0, server: str = "") -> None:
        at = f" at {server}" if server else ""
        super().__init__(f"kubernetes {op}{at}: {problem}", op=op, status=status, server=server)
        self.op = op
        self.status = status


class IntegrityError(ThawError):
    """Bytes do not hash to what the manifest says: a corrupt chunk in the store or the cache."""

    def __init__(self, where: str, chunk: str, problem: str) -> None:
        super().__init__(f"{where} chunk {chunk}: {problem}", where=where, chunk=chunk)
        self.where = where
        self.chunk = chunk


class ManifestRefused(IntegrityError):
    """A manifest that does not carry this cluster's integrity tag, or was not
    written for the tenant and key it is stored under: someone without the
    manifest key wrote or moved it (docs/security.md)."""

    def __init__(self, source: str, problem: str) -> None:
        ThawError.__init__(self, f"manifest {source} refused: {problem}", where="manifest", source=source)
        self.where = "manifest"
        self.chunk = ""
        self.source = source


class GpuError(PreconditionError):
    """NVML or the NVIDIA driver failed in a way that is not "this node has no GPU".

    `call` names the NVML function, `nvml_error` is NVML's own error text.
    """

    def __init__(self, call: str, nvml_error: str, hint: str = "") -> None:
        super().__init__(f"NVML {call} failed: {nvml_error}" + (f" ({hint})" if hint else ""),
                         call=call, nvml_error=nvml_error)
        self.call = call
        self.nvml_error = nvml_error


class HookError(ThawError):
    """A workload hook (pre-checkpoint, post-restore) failed or answered badly.

    `hook` names it (profile/phase/kind), `detail` says what went wrong.
    """

    def __init__(self, hook: str, detail: str) -> None:
        super().__init__(f"hook {hook} failed: {detail}", hook=hook, detail=detail)
        self.hook = hook
        self.detail = detail


class InvalidTransition(ThawError):
    """A sandbox was asked to move between states its lifecycle does not allow."""

    def __init__(self, sandbox: str, current: str, wanted: str) -> None:
        super().__init__(f"sandbox {sandbox!r} is {current}; cannot go to {wanted}",
                         sandbox=sandbox, current=current, wanted=wanted)


class UnhealthyRestore(ThawError):
    """A restored sandbox failed its health check; thaw removed it. Start the container cold.

    `health` is the check's result (HealthResult.to_dict()): probes, attempts, timings.
    """

    def __init__(self, sandbox: str, image: str, health: dict, summary: str) -> None:
        super().__init__(f"restore of {image} as {sandbox!r} is unhealthy, removed it: {summary}",
                         sandbox=sandbox, image=image, healthy=False)
        self.sandbox = sandbox
        self.image = image
        self.health = health


class WorkloadExited(ThawError):
    """A workload `thaw run` started exited while the command watched it
    (node.run_grace_s). `log_tail` holds its last lines; the sandbox is kept,
    stopped, for `thaw logs`."""

    def __init__(self, sandbox: str, exit: str, seconds: float, log_tail: list[str]) -> None:
        super().__init__(f"sandbox {sandbox!r}: the workload exited {seconds:.1f} s after it started ({exit}); "
                         f"`thaw logs {sandbox}` has its output, `thaw delete {sandbox}` removes it",
                         sandbox=sandbox, exit=exit, log_tail=list(log_tail))
        self.sandbox = sandbox
        self.log_tail = list(log_tail)


class NoSpace(ThawError):
    """A file system is full (ENOSPC, EDQUOT) or a budget cannot make room.
    Nothing half-written is kept. `path` names where, when known."""


class CheckpointFailed(ThawError):
    """A checkpoint did not produce an image. `workload` is the sandbox's state
    afterwards: thaw saves with the workload left running, so it is normally
    still "running" (serving), and nothing of the image is kept."""

    def __init__(self, sandbox: str, reason: str, workload: str) -> None:
        after = "the workload is still running" if workload == "running" else f"the workload is {workload}"
        super().__init__(f"checkpoint of {sandbox} failed: {reason} ({after}; no image was kept)",
                         sandbox=sandbox, reason=reason, workload=workload)
        self.sandbox = sandbox
        self.reason = reason
        self.workload = workload


class CheckpointNoSpace(CheckpointFailed, NoSpace):
    """A checkpoint failed because the image's file system filled up (the
    workload is still running, nothing of the image is kept)."""


class Timeout(ThawError):
    """An operation did not finish within its deadline. `setting` names the
    configuration key that bounds it (every timeout says which one, issue 31)."""

    def __init__(self, what: str, seconds: float, setting: str = "") -> None:
        bound = f" ({setting})" if setting else ""
        super().__init__(f"{what} did not finish within {seconds:g} s{bound}", what=what, seconds=seconds,
                         setting=setting)
        self.setting = setting


@dataclass
class _CommandFacts:
    argv: list[str]
    returncode: int | None
    stderr_tail: str
    duration_s: float = 0.0
    extra: dict = field(default_factory=dict)


class RunscError(ThawError):
    """runsc exited non-zero (or timed out). Carries runsc's own message.

    `runsc_message` is the last error runsc logged (its `--log` JSON line or
    the tail of stderr), which is what the shim would show a user too.
    """

    def __init__(self, argv: list[str], returncode: int | None, stderr: str,
                 runsc_message: str = "", duration_s: float = 0.0, subcommand: str = "") -> None:
        tail = stderr.strip()[-2000:]
        msg = runsc_message or (tail.splitlines()[-1] if tail else "no output")
        rc = "timed out" if returncode is None else f"exit {returncode}"
        # One line: the command line is a field (logs, --json), not part of the message.
        super().__init__(f"runsc {subcommand or 'command'} failed ({rc}): {msg}",
                         argv=argv, command=shlex.join(argv), returncode=returncode, runsc_message=msg,
                         subcommand=subcommand)
        self.facts = _CommandFacts(argv, returncode, tail, duration_s)
        self.argv = argv
        self.returncode = returncode
        self.runsc_message = msg
        self.stderr_tail = tail
        # A recovered sentry panic prints its message above a long goroutine dump.
        self.stderr_head = stderr.strip()[:2000]


# Every exit status of the `thaw` CLI, documented once: README "Command line"
# and `thaw --help` show this table (a unit test keeps the README in step).
EXIT_STATUSES: list[tuple[int, str]] = [
    (0, "success; `health`: ready"),
    (1, "the operation failed (runsc, a provision step, an unhealthy restore); "
        "`health`: not ready; `demo`: the restored state did not verify"),
    (2, "bad input: a usage error, an invalid id or key, a missing file or command, a name that does "
        "not exist or already does, a port or address already in use"),
    (3, "the image does not match this node (compatibility tuple)"),
    (4, "no room: the cache budget cannot hold the image, or a file system is full"),
    (65, "corrupt data: a chunk or an image does not hash to its name"),
    (69, "the node cannot do it: not root, runsc missing, thawd not running (or already running), "
         "the store unreachable, permission denied"),
    (70, "internal error: a bug in thaw (`thaw -vv ...` prints the traceback)"),
    (73, "a checkpoint made no image (runsc or a hook failed); the workload is still running"),
    (75, "timed out; trying again may work"),
    (78, "configuration: a bad value for a key, or an unsafe path in one"),
    (130, "interrupted (Ctrl-C)"),
]
EXIT_INTERNAL = 70            # EX_SOFTWARE
EXIT_INTERRUPTED = 130

# The CLI's exit codes by class, most specific first. 1 is "any other thaw error".
EXIT_CODE: list[tuple[type[ThawError], int]] = [
    (ConfigError, 78),        # EX_CONFIG
    (TupleMismatch, 3),
    (CacheFull, 4),
    (NoSpace, 4),
    (StoreError, 69),         # EX_UNAVAILABLE
    (ApiError, 69),
    (IntegrityError, 65),     # EX_DATAERR
    (PreconditionError, 69),  # EX_UNAVAILABLE
    (NotFound, 2),
    (AlreadyExists, 2),
    (UserError, 2),
    (Timeout, 75),            # EX_TEMPFAIL
    (CheckpointFailed, 73),   # EX_CANTCREAT: no image was made; the workload still runs
    (ThawError, 1),
]

# gRPC status names by class (grpc.StatusCode member names), most specific
# first; the thawd server and client both use this one table.
GRPC_STATUS: list[tuple[type[ThawError], str]] = [
    (ConfigError, "FAILED_PRECONDITION"),
    (TupleMismatch, "FAILED_PRECONDITION"),
    (CacheFull, "RESOURCE_EXHAUSTED"),
    (NoSpace, "RESOURCE_EXHAUSTED"),
    (StoreError, "UNAVAILABLE"),
    (ApiError, "UNAVAILABLE"),
    (IntegrityError, "DATA_LOSS"),
    (NotFound, "NOT_FOUND"),
    (AlreadyExists, "ALREADY_EXISTS"),
    (InvalidTransition, "FAILED_PRECONDITION"),
    (UserError, "INVALID_ARGUMENT"),
    (PreconditionError, "FAILED_PRECONDITION"),
    (Timeout, "DEADLINE_EXCEEDED"),
    (UnhealthyRestore, "UNAVAILABLE"),
    (ThawError, "INTERNAL"),
]


def exit_code(err: ThawError) -> int:
    for cls, code in EXIT_CODE:
        if isinstance(err, cls):
            return code
    return 1
