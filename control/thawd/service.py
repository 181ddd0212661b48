"""thawd's logic: decide restore vs cold, check health, record outcomes,
checkpoint automatically, quarantine images that keep failing.

`Thawd` holds the logic and is testable without gRPC; `ThawdServicer`
(control/thawd/server.py) adapts it to the generated gRPC service and converts
errors once. Every request field is validated here, at the edge.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from control.lifecycle import pod as podmod
from control.lifecycle import tenant as tenantmod
from control.lifecycle import workload as workloadmod
from control.config import Settings
from control.errors import IdentityError, IntegrityError, KeyMissing, ManifestRefused, NotFound, ThawError, UserError
from control.thawd import ctrinfo
from control.thawd.exits import ExitWatch
from control.thawd.metrics import Metrics
from control.thawd.parking import Parking
from control.thawd.pods import Pods
from control.thawd.quarantine import Quarantine
from control.files import write_json_atomic
from control.lifecycle import profiles
from control.lifecycle import sandbox as sandboxmod
from control.lifecycle.engine import Engine, Handle, uses_gpu
from runsc_hooks import gate as gatemod
from runsc_hooks import network as netmod
from runsc_hooks import spec as specmod
from runsc_hooks.runsc import GlobalOptions, RestoreOptions, Runsc

log = logging.getLogger("thawd")

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,255}$")
# The shim's config.json as it was before thawd rewrote it. Twin:
# go/internal/standin/standin.go origConfigName.
ORIG_CONFIG = "config.json.thaw-orig"


@dataclass(frozen=True)
class RuntimeRef:
    """How the shim runs runsc for one container (validated request fields)."""
    container_id: str
    bundle: Path
    runsc_root: Path
    global_flags: tuple[str, ...]

    @classmethod
    def validate(cls, container_id: str, bundle: str, runsc_root: str, global_flags: list[str]) -> "RuntimeRef":
        if not _ID_RE.match(container_id or ""):
            raise UserError(f"runtime.container_id {container_id!r} is not a valid container id", field="container_id")
        for fld, val in (("runtime.bundle", bundle), ("runtime.runsc_root", runsc_root)):
            if not val or not val.startswith("/") or "\0" in val or ".." in Path(val).parts:
                raise UserError(f"{fld} {val!r} must be an absolute path", field=fld)
        flags = tuple(global_flags)
        if any(not f or "\0" in f for f in flags) or len(flags) > 128:
            raise UserError("runtime.global_flags must be at most 128 non-empty strings", field="global_flags")
        return cls(container_id, Path(bundle), Path(runsc_root), flags)

    def runsc(self, binary: Path, timeout_s: float) -> Runsc:
        # The shim's own flags, verbatim: restore and checkpoint need the
        # same global flags as the run (docs/notes/gvisor-facts.md).
        flags = self.global_flags
        if not any(f.lstrip("-").split("=")[0] == "root" for f in flags):
            flags = (f"--root={self.runsc_root}", *flags)
        return Runsc(binary, GlobalOptions(root=self.runsc_root, extra=flags, verbatim=True), timeout_s)


# How long thawd waits for a stand-in to exit after answering its Restore,
# seconds (it exits within milliseconds: one log line, one rename).
CONFIRM_TIMEOUT_S = 30.0
# The outcome of a decision ended by its container's delete (or release) with no restore tried.
RELEASED_UNRESTORED = "released before any restore (create or start did not finish)"
# The largest stand-in marker thawd reads (a few hundred bytes of JSON).
MAX_MARKER_BYTES = 64 << 10
# The stand-in's process name (go/cmd/thaw-runsc-hooks; thaw-runsc execs it).
STANDIN_BINARY = "thaw-runsc-hooks"


@dataclass
class Standin:
    """The stand-in process that asked for a Restore, and its marker file: the
    marker says "restored" once the stand-in committed the restore, just
    before it exits (go/internal/standin start). Where thawd hears process
    exits (control/thawd/exits.py), the exit status decides too: a stand-in
    killed after its commit, before its exit, made containerd report a failed
    start, so its restore must go although the marker says "restored"."""
    pid: int
    marker: Path
    start: str = ""       # /proc/PID/stat start time: a recycled pid is not the stand-in
    watchable: bool = False
    exits: "ExitWatch | None" = None
    since_ns: int = 0     # CLOCK_MONOTONIC: an exit of `pid` before this is another process's

    # How long before the Restore request arrived the stand-in may have died
    # (killed after sending it): its exit still counts.
    EARLY_DEATH_NS = 2_000_000_000

    @classmethod
    def validate(cls, pid: int, marker: str, exits: "ExitWatch | None" = None) -> "Standin | None":
        if pid <= 0 and not marker:
            return None            # an older stand-in: nothing to wait for
        if pid <= 0 or not marker.startswith("/") or "\0" in marker or ".." in Path(marker).parts:
            raise UserError("standin_pid and standin_marker go together: a pid and an absolute path",
                            field="standin_pid")
        return cls(pid, Path(marker), exits=exits, since_ns=time.monotonic_ns() - cls.EARLY_DEATH_NS)

    def observe(self) -> None:
        """Record who `pid` is now. Only a thaw-runsc-hooks process is watched: in
        another pid namespace (thawd in a pod without hostPID) the number names
        some other process or none, and nothing can be told from it. A stand-in
        already dead when its request is read is watched when its exit was
        heard (exit events come only in the initial pid namespace, where pid
        numbers are the stand-in's own)."""
        from control.files import process_start
        try:
            argv0 = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            argv0 = b""
        self.start = process_start(self.pid) if Path(argv0.decode(errors="replace")).name == STANDIN_BINARY else ""
        if self.start:
            # Alive and already the stand-in: every exit of `pid` heard from now on is its own
            # (not the exec that made it one: exits.py).
            self.since_ns = time.monotonic_ns()
        self.watchable = bool(self.start) or (not argv0 and self.exit_status(wait_s=0.5) is not None)

    def exit_status(self, wait_s: float = 1.0) -> int | None:
        """The stand-in's wait status (0: exited 0; a signal number: killed), None when not heard."""
        return self.exits.status(self.pid, self.since_ns, wait_s) if self.exits is not None else None

    def wait_exit(self, timeout_s: float) -> bool:
        """True once the stand-in has exited; False after `timeout_s`."""
        import os
        import select

        from control.files import process_start
        if process_start(self.pid) != self.start:
            return True
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return True
        try:
            if process_start(self.pid) != self.start:   # recycled between the check and the open
                return True
            return bool(select.select([fd], [], [], timeout_s)[0])
        finally:
            os.close(fd)

    def committed(self, container_id: str) -> bool | None:
        """Did the (exited) stand-in commit the restore of `container_id`? False
        when it did not exit 0 (containerd reports that start failed, whatever
        its marker says) or its marker does not say "restored"; None when
        there is no readable marker of that container (nothing to go by)."""
        status = self.exit_status()
        if status is not None and status != 0:
            log.info("stand-in %d of %s ended with wait status %#x: its start failed", self.pid, container_id,
                     status)
            return False
        try:
            data = json.loads(specmod.read_regular(self.marker, MAX_MARKER_BYTES, "standin_marker"))
        except (ThawError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("id") != container_id:
            return None
        return data.get("decision") == "restored"


@dataclass
class Decision:
    restore: bool
    reason: str
    key: str = ""
    image_path: str = ""
    restore_timeout_s: float = 0.0   # the stand-in's deadline for the Restore call
    # ADOPT: the parked sandbox (control/thawd/parking.py) the container becomes.
    adopt_id: str = ""
    adopt_pid: int = 0
    relay_socket: str = ""


class Thawd:
    def __init__(self, settings: Settings, images, metrics: Metrics | None = None, identify=None,
                 identify_sandbox=None, exits: ExitWatch | None = None) -> None:
        """`images` is the image source (control/images/image.py adapter: pull/publish/evict/entries).
        `identify(rt)` tells a container's tenant and image digest (ctrinfo.Identity) from
        what its runtime records; default: containerd's records (control/thawd/ctrinfo.py).
        `identify_sandbox(rt)`: the same for a CRI pod's sandbox (pause) container, which
        has a tenant but no image digest (ctrinfo.identify sandbox=True).
        `exits`: process exit statuses (control/thawd/exits.py), which tell a
        stand-in killed after its commit; None: its marker alone decides."""
        self.s = settings
        self.exits = exits
        self.images = images
        self.metrics = metrics or Metrics()
        self.identify = identify or (lambda rt: ctrinfo.identify_container(settings, rt.runsc_root, rt.container_id))
        self.identify_sandbox = identify_sandbox or (lambda rt: ctrinfo.identify_container(
            settings, rt.runsc_root, rt.container_id, sandbox=True))
        self.state_dir = settings.state_dir / "thawd"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._leases: dict[tuple[str, str], object] = {}        # (root, id) -> lease
        # (root, id) -> ctrinfo.Identity, established at create: a tag moved later
        # must not change which key a running container checkpoints under.
        self._identities: dict[tuple[str, str], ctrinfo.Identity] = {}
        self._fetches: dict[str, Future] = {}                  # key -> background pull
        self._checkpointing: set[str] = set()
        # Restore decisions with no outcome yet: (root, id) -> (workload key,
        # gate closed for it or None). Each ends in exactly one outcome:
        # RESTORED, RESTORE_FAILED, or ABANDONED (released before any restore:
        # the stand-in was killed or containerd gave up between create and
        # start; issue 14).
        self._pending: dict[tuple[str, str], tuple[str, str | None]] = {}
        self._networks: dict[tuple[str, str], tuple[str, list]] = {}   # (root, id) -> netns config before restore
        self.quarantine = Quarantine(settings)
        self._pool = ThreadPoolExecutor(max_workers=settings.thawd_workers, thread_name_prefix="thawd")
        self.pods = Pods(self)
        self.parking = Parking(self)

    # -- quarantine ------------------------------------------------------------

    def quarantined(self) -> dict[str, str]:
        return self.quarantine.items()

    def unquarantine(self, key: str) -> bool:
        return self.quarantine.lift(key)

    # -- create ------------------------------------------------------------------

    def prepare_restore(self, rt: RuntimeRef, stdio: str = "") -> Decision:
        """`stdio`: what the shim gave the container as stdin, stdout, stderr (the stand-in's
        fstat of them: PrepareRestoreRequest.stdio); kept for parking (control/thawd/parking.py)."""
        t0 = time.monotonic()
        self.parking.note_stdio(rt, stdio)
        d = self._decide(rt)
        self.metrics.observe("thaw_prepare_seconds", time.monotonic() - t0)
        if d.restore:
            self.metrics.inc("thaw_restore_decisions_total")
        else:
            self.metrics.inc("thaw_cold_decisions_total", reason=d.reason.split(":")[0])
        log.info("prepare %s key=%s -> %s %s", rt.container_id, d.key, "restore" if d.restore else "cold", d.reason)
        return d

    def _workload(self, rt: RuntimeRef, spec: dict) -> "workloadmod.Workload | None":
        """The workload of an opted-in container, keyed by the identity its runtime
        records (asked once per container); IdentityError when that cannot be told
        or its tenant annotation would widen or switch it."""
        if not workloadmod.opted_in(spec):
            return None
        k = (str(rt.runsc_root), rt.container_id)
        with self._lock:
            ident = self._identities.get(k)
        if ident is None:
            ident = self.identify(rt)
            with self._lock:
                self._identities[k] = ident
        return workloadmod.from_spec(spec, ident.tenant, ident.image)

    def sandbox_tenant(self, rt: RuntimeRef, spec: dict) -> str:
        """The tenant of a CRI pod's sandbox (pause) container, narrowed by the pod's
        tenant annotation as its app containers' are (workload.from_spec); IdentityError
        when that cannot be told. The pod's lookup key starts with it (pods.py)."""
        ident = self.identify_sandbox(rt)
        return tenantmod.narrow(ident.tenant, (spec.get("annotations") or {}).get(workloadmod.ANNOTATION_TENANT))

    def _key(self, rt: RuntimeRef, spec: dict | None = None) -> str:
        """The container's workload key, "" when it has none thaw may use."""
        try:
            wl = self._workload(rt, spec if spec is not None else specmod.Bundle(rt.bundle).load())
        except (IdentityError, UserError):
            return ""
        return wl.key if wl else ""

    def _decide(self, rt: RuntimeRef) -> Decision:
        t0 = time.monotonic()
        spec = specmod.Bundle(rt.bundle).load()
        if not workloadmod.opted_in(spec):
            return Decision(False, "not-opted-in")
        workloadmod.check_annotation_sizes(spec)   # bounded input: refused before the identity lookup
        role = podmod.role(spec)
        if role == podmod.SANDBOX:       # a Kubernetes pod's pause container: the pod's decision
            return self.pods.prepare_sandbox(rt, spec)
        if role == podmod.MEMBER:        # an app container: its pod's decision, checked against the image
            return self.pods.prepare_member(rt, spec)
        try:
            wl = self._workload(rt, spec)
        except IdentityError as e:
            return Decision(False, str(e))
        self._prepare_gpu_spec(rt, spec)
        if self.parking.enabled and self.quarantine.reason(wl.key) is None:
            parked = self.parking.take(rt, spec, wl.key)
            if parked is not None:
                return self._adopt(rt, spec, wl.key, parked)
        return self.claim_image(rt, spec, wl.key, t0)

    def _adopt(self, rt: RuntimeRef, spec: dict, key: str, parked) -> Decision:
        """Container `rt` becomes parked sandbox `parked` (taken for it): the sandbox's
        image lease becomes the container's, as a restore's would (released at its delete)."""
        k = (str(rt.runsc_root), rt.container_id)
        lease = self.parking.lease_of(parked)
        self._settle(k, "a new decision for the same container replaced it")
        with self._lock:
            old = self._leases.pop(k, None)
            if lease is not None:
                self._leases[k] = lease
            self._pending[k] = (key, None)
        if old is not None:
            old.release()
        self.metrics.inc("thaw_cache_hits_total")
        return Decision(True, f"parked: adopts {parked.id}", key, "", self.restore_deadline_s(spec),
                        adopt_id=parked.id, adopt_pid=parked.pid, relay_socket=parked.relay_socket)

    def claim_image(self, rt: RuntimeRef, spec: dict, key: str, t0: float | None = None) -> Decision:
        """A leased local image of `key` for container `rt` (fetched if need be, one pull
        per key; with store.stream a miss is a Stream: restore_options), its gate closed;
        or cold with the reason. A lone container's and a pod's sandbox's alike."""
        why = self.quarantine.reason(key)
        if why is not None:
            return Decision(False, f"quarantined: {why}", key)
        # The identity lookup comes out of the same budget (t0, taken before it):
        # the stand-in waits thawd.prepare_timeout_s + 1 s for the whole answer.
        deadline = (t0 if t0 is not None else time.monotonic()) + self.s.thawd_prepare_timeout_s
        fut = self._fetch(key)
        try:
            lease = fut.result(timeout=max(0.05, deadline - time.monotonic()))
        except TimeoutError:
            return Decision(False, "fetch-in-progress: the image is still being fetched", key)
        except NotFound:
            return Decision(False, "no-image", key)
        except IntegrityError as e:
            # The store served bytes that are not the image's (thaw-fetch and the Python
            # engine check every chunk; neither retries a mismatch): every pull of this
            # image fails alike, so it counts towards quarantine like a failed restore,
            # and a quarantined key stops costing a download at every start.
            # A refused manifest (ManifestRefused, where "manifest") keeps its own reason,
            # manifest-refused, and counts only as a cold start, as before this rule.
            reason = f"{_fetch_reason(e)}: {e}"
            if e.where == "store" and self.quarantine.failed(key, reason):
                self.metrics.inc("thaw_quarantined_total")
            return Decision(False, reason, key)
        except ThawError as e:
            return Decision(False, f"{_fetch_reason(e)}: {e}", key)
        k = (str(rt.runsc_root), rt.container_id)
        with self._lock:  # claim the fetched lease, unless another container already did
            shared = any(v is lease for v in self._leases.values())
            if not shared:
                old = self._leases.pop(k, None)
                self._leases[k] = lease
        if shared:
            # The entry is local now: this pull is a cache hit with its own lease. It
            # is bounded by the same deadline (it may wait for the key's lock behind
            # another pull); a lease that comes too late is released.
            second = self._pool.submit(self.images.pull, key)
            try:
                lease = second.result(timeout=max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                second.add_done_callback(lambda f: f.exception() is None and f.result().release())
                return Decision(False, "fetch-in-progress: the image's cache entry is busy", key)
            except ThawError as e:
                return Decision(False, f"{_fetch_reason(e)}: {e}", key)
            with self._lock:
                old = self._leases.pop(k, None)
                self._leases[k] = lease
        if old is not None:
            old.release()
        self._settle(k, "a new decision for the same container replaced it")
        self.metrics.inc("thaw_cache_hits_total" if getattr(lease, "hit", True) else "thaw_cache_misses_total")
        h = self._handle(rt, spec)
        why = self._spec_mismatch(Path(lease.path), spec)
        if why:
            self._release_key(k)
            return Decision(False, f"spec-mismatch: {why}", key)
        with self._lock:
            self._pending[k] = (key, h.gate)
        if h.gate is not None:  # no packet reaches the sandbox until the restore is healthy
            gatemod.close(h.gate, self.s.network_probe_mark, f"restore of {rt.container_id}")
        self._remember_network(k, spec)
        return Decision(True, "image-ready", key, str(lease.path), self.restore_deadline_s(spec))

    def _spec_mismatch(self, image: Path, spec: dict) -> str:
        """Why runsc would refuse to restore `image` into a container with `spec`
        (mount destinations/types/options, devices, the GPU count: nvproxy/cdi.py
        check_restore_compatible), said before runsc runs; "" when it would not."""
        from nvproxy import cdi
        try:
            saved = json.loads((image / sandboxmod.IMAGE_META).read_text())["spec"]
        except (OSError, ValueError, KeyError, TypeError):
            return ""   # an image without its spec (older thaw): runsc's own validation decides
        try:
            cdi.check_restore_compatible(saved, spec)
        except ThawError as e:
            return e.message
        return ""

    def restore_deadline_s(self, spec: dict) -> float:
        """How long a Restore call may take: runsc restore, the health check, the
        post-restore hooks (the stand-in's deadline; PrepareRestore tells it)."""
        hooks = sum(h.timeout_s + 5 for h in profiles.for_spec(spec).hooks("post_restore"))
        return self.s.runsc_timeout_s + self.s.thawd_health_timeout_s + hooks + 5.0

    def _prepare_gpu_spec(self, rt: RuntimeRef, spec: dict) -> None:
        """A GPU container gets the CUDA checkpoint helper mounted at its fixed
        path, cold or restored alike: runsc runs it inside the sandbox at
        checkpoint and restore, and restore validation wants the same mounts
        as at checkpoint. The shim's original config.json is kept beside it
        (the stand-in puts it back when it falls back to a cold start)."""
        if not uses_gpu(spec):
            return
        from nvproxy import helper
        before = json.dumps(spec.get("mounts", []), sort_keys=True)
        helper.add_to_spec(spec, self._helper_dir())
        if json.dumps(spec["mounts"], sort_keys=True) == before:
            return
        orig = rt.bundle / ORIG_CONFIG
        if not orig.exists():
            shutil.copy2(rt.bundle / "config.json", orig)
        specmod.Bundle(rt.bundle).write(spec)

    def _helper_dir(self) -> Path:
        """The host directory holding the staged helper (staged once per thawd)."""
        from nvproxy import helper
        d = self.state_dir / "cuda-helper"
        if not (d / helper.HELPER_NAME).is_file():
            helper.stage(self.s.runsc_path.parent / helper.BINARY_NAME, d)
        return d

    def _fetch(self, key: str) -> Future:
        """One pull per key however many ask; the pull goes on past a caller's deadline."""
        with self._lock:
            fut = self._fetches.get(key)
            new = fut is None or fut.done()
            if new:
                fut = self._pool.submit(self.images.pull, key)
                self._fetches[key] = fut
        if new:
            # Outside the lock: a future that is already done runs the
            # callback right here, and the callback takes the lock.
            fut.add_done_callback(lambda f, k=key: self._fetch_done(k, f))
        return fut

    def _fetch_done(self, key: str, fut: Future) -> None:
        with self._lock:
            if self._fetches.get(key) is fut:
                del self._fetches[key]
        # A lease nobody took (the caller timed out) must not pin the entry.
        if not fut.cancelled() and fut.exception() is None:
            lease = fut.result()
            with self._lock:
                taken = any(v is lease for v in self._leases.values())
            if not taken:
                threading.Timer(1.0, self._release_if_untaken, args=(lease,)).start()

    def _release_if_untaken(self, lease) -> None:
        with self._lock:
            if any(v is lease for v in self._leases.values()):
                return
        lease.release()

    # -- start -----------------------------------------------------------------

    def _handle(self, rt: RuntimeRef, spec: dict, timeout_s: float | None = None) -> Handle:
        """The engine's view of a container the shim runs: its runsc root and flags,
        and, when its network namespace is one thaw plumbed, its address and gate."""
        address, gate = netmod.namespace_address(specmod.netns_path(spec))
        if not self.s.thawd_gate:  # diagnostics (config thawd.gate): what a door without the gate does
            gate = None
        return Handle(rt.container_id, rt.runsc(self.s.runsc_path, timeout_s or self.s.runsc_timeout_s),
                      rt.bundle, address=address, gate=gate, mark=self.s.network_probe_mark)

    def handle_of(self, rt: RuntimeRef, spec: dict) -> Handle:
        return self._handle(rt, spec)

    def lease_of(self, rt: RuntimeRef):
        with self._lock:
            return self._leases.get((str(rt.runsc_root), rt.container_id))

    def restore(self, rt: RuntimeRef, cancelled=lambda: False, standin: "Standin | None" = None,
                subcontainer_restored: bool = False) -> tuple[bool, str, float]:
        """start of a container PrepareRestore answered RESTORE to: runsc restore,
        health check, post-restore hooks, gate open; the outcome is recorded here.
        Not restored: the sandbox is removed and the caller starts it cold.
        `cancelled()` tells whether the stand-in gave up (it was killed, or its
        deadline passed): a restore nobody will report to containerd is undone.
        With `standin`, the restore is kept only once that stand-in has exited
        with its marker saying "restored" (_confirm): containerd believes the
        stand-in's exit status, and a SIGKILL may land after this answer.
        A pod's app container (`subcontainer_restored`): the stand-in ran its
        `runsc restore` itself (control/thawd/pods.py says why)."""
        t0 = time.monotonic()
        if standin is not None:
            standin.observe()   # before anything: its identity, while it surely lives
        k = (str(rt.runsc_root), rt.container_id)
        try:
            spec = specmod.Bundle(rt.bundle).load()
        except ThawError as e:
            if subcontainer_restored:
                raise           # a pod's app container holds no decision of its own to end
            spec, unreadable = None, f"{type(e).__name__}: {e.message}"
        role = podmod.role(spec) if spec is not None else podmod.LONE
        if role == podmod.MEMBER or subcontainer_restored:
            if not (role == podmod.MEMBER and subcontainer_restored):
                raise UserError("subcontainer_restored is for a pod's app container, after its own runsc restore, "
                                "and such a container's Restore must set it", field="subcontainer_restored")
            p = self.pods.pod_of(rt, spec)
            ok, detail, secs = self.pods.restore_member(rt, spec)
            if ok:
                self._watch_pod_standin(rt, standin, p)
            return ok, detail, secs
        lease = self.lease_of(rt)
        if lease is None:
            return False, "thawd holds no restore decision for this container (thawd restarted?)", 0.0
        with self._lock:
            key, gate = self._pending.pop(k, ("", None))   # from here, the engine and undo_restore own the gate
        log.info("restore %s key=%s starting", rt.container_id, key)
        if spec is None:
            return self._restore_not_tried(rt, key, gate, unreadable, t0)
        if role == podmod.SANDBOX:
            p = self.pods.pod_of(rt, spec)
            ok, detail, secs = self.pods.restore_sandbox(rt, lease, cancelled)
            if ok:
                self._watch_pod_standin(rt, standin, p)
            return ok, detail, secs
        try:
            # The identity established at create (self._identities): a tag moved
            # since must not change the key; an error here means thawd restarted.
            wl = self._workload(rt, spec)
        except IdentityError as e:
            return self._restore_not_tried(rt, key, gate, f"{type(e).__name__}: {getattr(e, 'message', e)}", t0)
        key = wl.key if wl else key
        parked = self.parking.adopter(rt)
        if parked is not None:
            return self._wake(rt, spec, key, wl, parked, cancelled, standin, t0)
        h = Handle(rt.container_id, rt.runsc(self.s.runsc_path, self.s.runsc_timeout_s), rt.bundle)
        image = Path(lease.path)
        try:
            h = self._handle(rt, spec)
            done = Engine(self.s).restore(h, image, [wl.health] if wl else [], opts=self.restore_options(lease),
                                          health_check=self.s.thawd_health_check)
        except Exception as e:  # noqa: BLE001 - every decision ends in one recorded outcome
            if not isinstance(e, ThawError):
                log.exception("restore of %s failed unexpectedly", rt.container_id)
            reason, counts = self.restore_failure(lease, f"{type(e).__name__}: {getattr(e, 'message', e)}")
            self.undo_restore(h, rt, key, reason, quarantine=counts)
            return False, reason, time.monotonic() - t0
        if cancelled():
            self.undo_restore(h, rt, key, "the stand-in gave up before the restore finished")
            return False, "cancelled", time.monotonic() - t0
        secs = time.monotonic() - t0
        self.count_stream(lease)
        if standin is None:
            self._restored(rt, key, done, secs)
        else:
            threading.Thread(target=self._confirm, args=(rt, h, key, standin, done, secs), daemon=True,
                             name=f"confirm-{rt.container_id}"[:15]).start()
        self.parking.note_start(rt, spec, key)
        return True, done.health.summary() if done.health else "", secs

    def _wake(self, rt: RuntimeRef, spec: dict, key: str, wl, parked, cancelled, standin, t0: float):
        """start of a container that adopted a parked sandbox: its CUDA state back, the
        health probe, the post-restore hooks (Parking.wake). Not woken: the sandbox is
        removed, and the stand-in starts the container cold."""
        from control.lifecycle.engine import Restored
        undo = lambda why, counts=True: self._undo_adoption(rt, key, parked, why, counts)  # noqa: E731
        try:
            cuda_s, _, health, hooks = self.parking.wake(parked, rt, [wl.health] if wl else [])
        except Exception as e:  # noqa: BLE001 - every decision ends in one recorded outcome
            if not isinstance(e, ThawError):
                log.exception("wake of %s (parked %s) failed unexpectedly", rt.container_id, parked.id)
            reason = f"adopting parked sandbox {parked.id}: {type(e).__name__}: {getattr(e, 'message', e)}"
            undo(reason)
            return False, reason, time.monotonic() - t0
        if cancelled():
            undo("the stand-in gave up before the adoption finished")
            return False, "cancelled", time.monotonic() - t0
        secs = time.monotonic() - t0
        done = Restored(secs, 0.0, health, hooks)
        log.info("outcome %s key=%s adopted parked %s: CUDA %.4fs", rt.container_id, key, parked.id, cuda_s)
        self.metrics.inc("thaw_adoptions_total")
        self.metrics.observe("thaw_adopt_seconds", secs)
        if standin is None:
            self._restored(rt, key, done, secs)
        else:
            threading.Thread(target=self._confirm, args=(rt, None, key, standin, done, secs, undo), daemon=True,
                             name=f"confirm-{rt.container_id}"[:15]).start()
        self.parking.note_start(rt, spec, key)
        return True, health.summary() if health else "", secs

    def _undo_adoption(self, rt: RuntimeRef, key: str, parked, reason: str, quarantine: bool = True) -> None:
        """An adoption that will not be used: the parked sandbox goes (its alias too),
        the outcome is recorded (the container's lease released)."""
        self.parking.discard(parked, f"adoption by {rt.container_id} ended: {reason}")
        self.report_outcome(rt, "RESTORE_FAILED", reason, key=key, quarantine=quarantine)

    def restore_options(self, lease) -> RestoreOptions:
        """`runsc restore`'s options for a leased image. A streamed one (store.stream, a
        Stream): runsc takes thaw-gofer as its checkpoint-gofer for this call (the sidecar
        directory in its environment) and restores in the background (the image is still
        arriving). A pod's sandbox takes the same (Pods.restore_sandbox): at the pin only
        the root's `runsc restore` reads the image (docs/store.md "Pods")."""
        streamed = getattr(lease, "stream", False)
        return RestoreOptions(image_path=Path(lease.path), detach=True,
                              background=self.s.restore_background or streamed,
                              env=tuple(lease.env().items()) if streamed else ())

    @staticmethod
    def restore_failure(lease, reason: str) -> tuple[str, bool]:
        """Why a restore from `lease` failed, and whether that counts towards the key's
        quarantine. When its stream failed, the gofer failed the sentry's reads and runsc
        killed the sandbox: the stream's error is the reason, and it counts as a pull's
        failure would (claim_image): only when the store served bytes that are not the
        image's, never for a full cache file system (NoSpace) or a store that stalled.
        Otherwise `reason`, counted."""
        failed = lease.verdict() if getattr(lease, "stream", False) else None
        if failed is None:
            return reason, True
        from control.images.stream import failure_reason
        return failure_reason(failed), isinstance(failed, IntegrityError) and failed.where == "store"

    def count_stream(self, lease) -> None:
        """thaw_streams_total{result}: how the stream of a restore that succeeded ended
        (installed in the cache, or failed while the sandbox loaded its pages)."""
        if getattr(lease, "stream", False):
            lease.add_done_callback(lambda st: self.metrics.inc(
                "thaw_streams_total", result="installed" if st.error is None else "failed"))

    def _restored(self, rt: RuntimeRef, key: str, done, secs: float) -> None:
        with self._lock:   # kept: no cold start will need the namespace's configuration back
            self._networks.pop((str(rt.runsc_root), rt.container_id), None)
        # Four decimals: the flood benchmark's containerd door reads its runsc and health split from here.
        log.info("outcome %s key=%s RESTORED %.4fs (runsc %.4fs, health %s)", rt.container_id, key, secs,
                 done.runsc_s, f"{done.health.seconds:.4f}s: {done.health.summary()}" if done.health else "off")
        self.metrics.inc("thaw_restores_total")
        self.metrics.observe("thaw_restore_seconds", secs)
        self.metrics.observe("thaw_health_seconds", done.health.seconds if done.health else 0.0)
        self.quarantine.succeeded(key)

    def _confirm(self, rt: RuntimeRef, h: Handle | None, key: str, standin: "Standin", done, secs: float,
                 undo=None) -> None:
        """Keep the restore once its stand-in has exited having committed it (its
        marker says "restored"); remove it when the stand-in died first (SIGKILL
        between thawd's answer and its exit): containerd then reports the start
        failed, and the container must not run (issue 14). A stand-in still alive
        after CONFIRM_TIMEOUT_S (stopped?) is trusted: removing a restore it may
        still report would be the opposite mismatch."""
        try:
            if not standin.watchable:   # not a stand-in this thawd can see: keep what it restored
                self._restored(rt, key, done, secs)
                return
            exited = standin.wait_exit(CONFIRM_TIMEOUT_S)
            if not exited:
                log.warning("stand-in %d of %s still runs %.0f s after its restore; keeping the restore",
                            standin.pid, rt.container_id, CONFIRM_TIMEOUT_S)
            elif standin.committed(rt.container_id) is False:
                why = "the stand-in died after the restore, before it could report it"
                if undo is not None:
                    undo(why)
                else:
                    self.undo_restore(h, rt, key, why)
                return
            self._restored(rt, key, done, secs)
        except Exception:  # noqa: BLE001 - a thread of its own: log, never lose the outcome
            log.exception("confirming the restore of %s", rt.container_id)
            self._restored(rt, key, done, secs)

    def _watch_pod_standin(self, rt: RuntimeRef, standin: "Standin | None", pod) -> None:
        """The stand-in kill safety of _confirm for a pod's container (its pause
        container, whose `runsc restore` thawd ran, or an app container, whose
        the stand-in ran): when the stand-in dies after thawd's answer without
        having committed the start, containerd reports that start failed, and
        the pod containerd believes in is not the sandbox runsc holds. A pod's
        sandbox cannot lose one container and start it cold again (its start
        went to the restore: control/thawd/pods.py), so the whole pod goes
        (Pods.fail): the kubelet re-creates it, and that sandbox starts cold.
        Pod metrics are not deferred as _confirm defers a lone container's: a
        pod's outcome is recorded at its last container (Pods.restore_member),
        and a death after it is recorded as the pod's failure."""
        if standin is None or pod is None:
            return

        def watch() -> None:
            try:
                if not standin.watchable:   # not a stand-in this thawd can see: keep what it restored
                    return
                if not standin.wait_exit(CONFIRM_TIMEOUT_S):
                    log.warning("stand-in %d of %s still runs %.0f s after its restore; keeping the restore",
                                standin.pid, rt.container_id, CONFIRM_TIMEOUT_S)
                elif standin.committed(rt.container_id) is False:
                    self.pods.standin_died(pod, f"the stand-in of container {rt.container_id} died after "
                                                "its restore, before it could report it")
            except Exception:  # noqa: BLE001 - a thread of its own: log, keep the restore
                log.exception("confirming the restore of %s", rt.container_id)

        threading.Thread(target=watch, daemon=True, name=f"confirm-{rt.container_id}"[:15]).start()

    def _remember_network(self, k: tuple[str, str], spec: dict) -> None:
        """Keep the container's network namespace configuration from before runsc
        takes it over, for a cold start after a failed restore (network.snapshot)."""
        path = specmod.netns_path(spec)
        if not path:
            return
        try:
            snap = netmod.snapshot(path)
        except Exception as e:  # noqa: BLE001 - a namespace thaw cannot read: nothing to put back later
            log.warning("network of %s not recorded: %s", k[1], e)
            return
        with self._lock:
            self._networks[k] = (path, snap)

    def _restore_not_tried(self, rt: RuntimeRef, key: str, gate, reason: str, t0: float):
        """End a restore that never reached runsc: the cold start needs its network
        (the gate opened), and the outcome is recorded."""
        if gate is not None:
            gatemod.open(gate, f"restore of {rt.container_id} not tried: {reason}")
        self.report_outcome(rt, "RESTORE_FAILED", reason, key=key)
        return False, reason, time.monotonic() - t0

    def undo_restore(self, h: Handle, rt: RuntimeRef, key: str, reason: str, quarantine: bool = True) -> None:
        """A restore that will not be used: kill and delete the sandbox (the stand-in
        creates it again, cold), put the namespace's addresses and routes back
        (runsc removed them), open the gate, release the lease, count the failure
        (towards the key's quarantine too, unless `quarantine` is False)."""
        try:
            if h.runsc.exists(h.id):
                h.runsc.delete(h.id, force=True)
        except ThawError as e:
            log.warning("removing the failed restore of %s: %s", rt.container_id, e)
        with self._lock:
            net = self._networks.pop((str(rt.runsc_root), rt.container_id), None)
        if net is not None:
            try:
                netmod.reapply(*net)
            except Exception as e:  # noqa: BLE001 - the cold start goes on; it may lack its network
                log.warning("network of %s not put back after its failed restore: %s", rt.container_id, e)
        if h.gate is not None:
            gatemod.open(h.gate, f"restore of {rt.container_id} failed; starting cold")
        self.report_outcome(rt, "RESTORE_FAILED", reason, key=key, quarantine=quarantine)

    def report_outcome(self, rt: RuntimeRef, outcome: str, reason: str, key: str | None = None,
                       quarantine: bool = True) -> None:
        if outcome not in ("RESTORE_FAILED", "COLD_STARTED"):
            raise UserError(f"outcome {outcome!r}: expected RESTORE_FAILED or COLD_STARTED", field="outcome")
        spec = None
        if key is None:
            spec = specmod.Bundle(rt.bundle).load()
            role = podmod.role(spec)
            if role != podmod.LONE:
                log.info("outcome %s (pod %s) %s %s", rt.container_id, role, outcome, reason)
                self._end_pending(rt, outcome)   # a pod's sandbox whose create failed
                if outcome == "RESTORE_FAILED":
                    self.pods.restore_failed(rt, spec, reason)
                else:
                    self.metrics.inc("thaw_cold_starts_total")
                    self.pods.cold_started(rt, spec)
                return
            key = self._key(rt, spec)
        self._end_pending(rt, outcome)
        log.info("outcome %s key=%s %s %s", rt.container_id, key, outcome, reason)
        if outcome == "RESTORE_FAILED":
            self.metrics.inc("thaw_fallbacks_total", reason=reason.split(":")[0])
            self._release(rt)
            if key and quarantine and self.quarantine.failed(key, reason):
                self.metrics.inc("thaw_quarantined_total")
        else:
            self.metrics.inc("thaw_cold_starts_total")
            self._maybe_auto_checkpoint(rt, key)

    def _end_pending(self, rt: RuntimeRef, outcome: str) -> None:
        with self._lock:
            pending = self._pending.pop((str(rt.runsc_root), rt.container_id), None)
        if pending is not None and pending[1] is not None:  # the restore was never tried: open its gate
            gatemod.open(pending[1], f"restore of {rt.container_id} not tried: {outcome}")

    def _maybe_auto_checkpoint(self, rt: RuntimeRef, key: str) -> None:
        self.maybe_auto_checkpoint(key, lambda: self._auto_checkpoint(rt, key), rt.container_id)

    def maybe_auto_checkpoint(self, key: str, job, what: str = "") -> None:
        """Run `job` (it checks readiness and checkpoints) in the background, unless
        automatic checkpoints are off, `key` is quarantined, has an image already, or
        is being checkpointed now."""
        if not self.s.thawd_auto_checkpoint or not key or self.quarantine.reason(key) is not None:
            return
        try:
            if self.images.has(key):
                return
        except ThawError as e:
            log.warning("auto-checkpoint of %s skipped: cannot tell whether %s has an image (%s)", what, key, e)
            return
        with self._lock:
            if key in self._checkpointing:
                return
            self._checkpointing.add(key)
        self._pool.submit(self._run_auto_checkpoint, key, job, what)

    def _run_auto_checkpoint(self, key: str, job, what: str) -> None:
        try:
            res = job()
            if res is not None:
                log.info("auto-checkpoint of %s published %s (%d bytes, %.2fs)", what, key,
                         res["image_bytes"], res["seconds"])
                self.metrics.inc("thaw_auto_checkpoints_total", result="ok")
        except Exception as e:  # noqa: BLE001 - a failed auto-checkpoint must not hurt the container
            log.warning("auto-checkpoint of %s failed: %s", what, e)
            self.metrics.inc("thaw_auto_checkpoints_total", result="error")
        finally:
            with self._lock:
                self._checkpointing.discard(key)

    def _auto_checkpoint(self, rt: RuntimeRef, key: str) -> dict | None:
        """A lone container's: wait for its readiness probe, checkpoint, publish."""
        spec = specmod.Bundle(rt.bundle).load()
        wl = self._workload(rt, spec)
        if wl is None or wl.key != key:
            log.warning("auto-checkpoint of %s skipped: its key is no longer %s", rt.container_id, key)
            return None
        if wl.ready is None:
            log.warning("auto-checkpoint of %s skipped: the workload declares no readiness probe "
                        "(annotation %s); thaw does not guess when it is warm", rt.container_id,
                        workloadmod.ANNOTATION_READY)
            self.metrics.inc("thaw_auto_checkpoints_total", result="no-ready-probe")
            return None
        engine = Engine(self.s)
        h = self._handle(rt, spec)
        ready = engine.check(h, [wl.ready], engine.policy(self.s.thawd_ready_timeout_s))
        if not ready.healthy:
            log.warning("auto-checkpoint of %s skipped: never ready (%s)", rt.container_id, ready.summary())
            self.metrics.inc("thaw_auto_checkpoints_total", result="not-ready")
            return None
        res = self.checkpoint(rt, leave_running=self.s.thawd_leave_running)
        self.parking.note_start(rt, spec, key)
        return res

    # -- delete / explicit -------------------------------------------------------

    def release(self, container_id: str, runsc_root: str, why: str = RELEASED_UNRESTORED) -> bool:
        self.pods.forget(runsc_root, container_id)
        return self._release_key((runsc_root, container_id), why)

    def abandon(self, rt: RuntimeRef, why: str) -> bool:
        """The stand-in that asked for `rt`'s decision is gone before the answer reached it
        (SIGKILLed, or past its deadline): nobody will restore the container or report an
        outcome, and containerd's delete may have come while thawd still decided, before
        the decision existed to release (issue 14: every decision ends in one outcome).
        Released now, as a delete would: ABANDONED."""
        return self.release(rt.container_id, str(rt.runsc_root), why)

    def _release(self, rt: RuntimeRef) -> bool:
        return self._release_key((str(rt.runsc_root), rt.container_id))

    def release_ref(self, rt: RuntimeRef) -> bool:
        return self._release(rt)

    def _release_key(self, k: tuple[str, str], why: str = RELEASED_UNRESTORED) -> bool:
        self._settle(k, why)
        self.parking.release(k[0], k[1])   # a parked sandbox it adopted (or was promised): gone with it
        with self._lock:
            self._identities.pop(k, None)
            lease = self._leases.pop(k, None)
            self._networks.pop(k, None)
        if lease is None:
            return False
        lease.release()
        return True

    def _settle(self, k: tuple[str, str], why: str) -> None:
        """Record the outcome of a restore decision that will never be restored:
        ABANDONED. The stand-in that asked was killed, or containerd deleted the
        container between create and start (issue 14: thawd hears every outcome)."""
        with self._lock:
            pending = self._pending.pop(k, None)
        if pending is None:
            return
        key, gate = pending
        if gate is not None:
            gatemod.open(gate, f"restore of {k[1]} abandoned")
        log.info("outcome %s key=%s ABANDONED %s", k[1], key, why)
        self.metrics.inc("thaw_restores_abandoned_total")

    def checkpoint(self, rt: RuntimeRef, leave_running: bool = True, key: str | None = None,
                   hooks_rt: RuntimeRef | None = None) -> dict:
        """Checkpoint a running container and publish the image (under `key`, default
        the container's workload key; a pod's sandbox passes the pod's). The engine saves
        with the workload left running: a failed save never loses it; without
        `leave_running` it is stopped only after the image is complete."""
        spec = specmod.Bundle(rt.bundle).load()
        if not workloadmod.opted_in(spec):
            raise UserError(f"container {rt.container_id} did not opt in (annotation {workloadmod.ANNOTATION_WORKLOAD})")
        # A pod's key was made from its containers' identities (pods.py); its pause
        # container has no image digest of its own to ask for (ctrinfo.identify).
        key = key or self._workload(rt, spec).key
        # runsc writes the image straight into a partial directory of the node
        # cache; publishing chunks and uploads it from there and the cache adopts
        # the directory by rename: one copy of the image, hashed once.
        with self.images.staged(key) as image:
            hooks_on = self._handle(hooks_rt, specmod.Bundle(hooks_rt.bundle).load()) if hooks_rt else None
            saved = Engine(self.s).checkpoint(self._handle(rt, spec), image.path, stop_after=not leave_running,
                                              hooks_on=hooks_on)
            # What a restore needs, with the image (thaw.json, as the CLI's images
            # carry it): the spec runsc validates at restore and the GPUs it holds.
            write_json_atomic(image.path / sandboxmod.IMAGE_META, {
                "version": sandboxmod.IMAGE_META_VERSION, "door": "containerd", "spec": spec,
                "files": saved.files, "gpu": sandboxmod.gpu_needs(spec), "checkpoint_s": saved.seconds,
                "created_at": time.time()})
            published = self.images.publish(image)
        self.metrics.inc("thaw_checkpoints_total")
        self.metrics.observe("thaw_checkpoint_seconds", saved.seconds)
        return {"workload_key": key, "image_bytes": saved.bytes, "seconds": saved.seconds,
                "published": published}

    def stats(self) -> dict:
        entries = self.images.entries()
        q = self.quarantined()
        for e in entries:
            if e["key"] in q:
                e["state"], e["reason"] = "quarantined", q[e["key"]]
        return {"counters": self.metrics.counters(), "entries": entries}

    def evict(self, key: str) -> bool:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", key or ""):
            raise UserError(f"workload_key {key!r} is not a valid key", field="workload_key")
        removed = self.images.evict(key)
        self.unquarantine(key)
        return removed

    def close(self) -> None:
        self.parking.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            leases = list(self._leases.values())
            self._leases.clear()
        for lease in leases:
            lease.release()


def _fetch_reason(e: ThawError) -> str:
    """The decision reason (and metrics label) of a failed pull."""
    if isinstance(e, ManifestRefused):
        return "manifest-refused"
    if isinstance(e, KeyMissing):
        return "no-tenant-key"
    if type(e).__name__ == "TupleMismatch":
        return "tuple-mismatch"
    if type(e).__name__ == "Timeout":   # another pull or stream holds the key's lock (image_source._stream)
        return "fetch-in-progress"
    return "fetch-failed"
