"""thawd's pods: one restore-or-cold decision per Kubernetes pod, the pod's
restore as runsc does it, and the automatic checkpoint of a cold pod once every
container it declares is ready. docs/containerd.md "Pods" says what happens call
by call and why; in short:

- The pause container's create decides for the pod: its lookup key picks a table
  (control/thawd/podtables.py: this node's, else the store's) naming the pod's key
  and every container's identity; its image is leased and its start is `runsc
  restore` of the sandbox's root (runsc/boot/restore.go: the restore runs when the
  last container the image holds has registered).
- Each app container's create is checked against the table (name, identity) and
  against the spec the image saved it with, as a lone container's is (its GPUs:
  another index restores, another count does not; nvproxy/restore_spec.py); a match is restored by the stand-in itself (only the process the shim
  started holds the container's stdio). A mismatch after the root's restore cannot
  start cold in that sandbox: thawd removes it, the kubelet re-creates the pod,
  whose next sandbox starts cold.
- Init containers ran and ended before the pod was saved (CRI deletes an exited
  container's task); a restoring pod answers them as done (SATISFIED).
- GPU containers get the CUDA helper mounted at their create; the pod's checkpoint
  names it once for all of them (pkg/sentry/control/state_cuda.go runs the helper
  in each CUDA process's own container).
- A container the kubelet re-creates in a running pod starts cold.

Pod records live in memory: a thawd restart forgets pods in flight (their later
containers start cold, which runsc turns into restores of a restoring sandbox by
itself, controller.go StartSubcontainer).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from control.errors import IdentityError, ThawError
from control.lifecycle import image_meta
from control.lifecycle import pod as podmod
from control.lifecycle.engine import Engine, loads_after_return
from control.lifecycle.workload import workload_of
from control.thawd.containers import Containers, Decision, RuntimeRef, State
from control.thawd.events import Events
from control.thawd.podrecord import (COLD, FAILED, INIT_KEY_PREFIX, INIT_SATISFIED, POD_FAILED, RESTORED, RESTORING,
                                     STOPPED_WHILE_RESTORING, MemberState, Pod)
from control.thawd.podtables import PodTables, hint_of
from control.thawd.restore import restore_failure, restore_options
from control.thawd.standin import CONFIRM_TIMEOUT_S, Standin
from runsc_hooks import network as netmod
from runsc_hooks import spec as specmod
from control.logfields import fields

if TYPE_CHECKING:
    from control.thawd.autocheckpoint import AutoCheckpointer
    from control.thawd.prepare import Preparer
    from control.thawd.restore import Restorer

log = logging.getLogger("thawd")


class Pods:
    def __init__(self, settings, state_dir: Path, containers: Containers, preparer: "Preparer",
                 restorer: "Restorer", autocheckpoint: "AutoCheckpointer", quarantine, metrics,
                 store_for=None, pool=None, events: Events | None = None, podspecs=None) -> None:
        """`store_for(lookup)`: the store as a lookup key's tenant sees it, where pod tables
        are published and found (control/thawd/podtables.py); `pool`: where they are
        published from (None: at once, in the caller's thread). `events`: the pod's Events;
        `podspecs`: its readiness from its spec (control/thawd/podspecs.py; None: annotations)."""
        self.s = settings
        self._pool = pool
        self.containers = containers
        self.preparer = preparer
        self.restorer = restorer
        self.autocheckpoint = autocheckpoint
        self.quarantine = quarantine
        self.metrics = metrics
        self.events = events or Events(None, "", metrics)
        self.declared_of = podspecs.declared if podspecs is not None else podmod.declared
        self.tables = PodTables(state_dir / "pods", store_for)
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], Pod] = {}        # (runsc root, sandbox id) -> pod
        self._failed_uids: dict[str, tuple[str, float]] = {}  # pod uid -> (reason, when)

    # -- records ---------------------------------------------------------------

    def _get(self, root: Path | str, sandbox_id: str) -> Pod | None:
        with self._lock:
            return self._pods.get((str(root), sandbox_id))

    def _new(self, rt: RuntimeRef, spec: dict, tenant: str | None) -> Pod:
        """`tenant`: the sandbox's (Containers.sandbox_tenant); None when it cannot be told,
        and the pod then has no lookup key: it starts cold and is never checkpointed."""
        declared = self.declared_of(spec)
        p = Pod(rt, podmod.pod_uid(spec), podmod.lookup(spec, declared, tenant) if tenant is not None else "",
                declared, hint=hint_of(spec), ref=podmod.pod_ref(spec),
                address=netmod.namespace_address(specmod.netns_path(spec))[0])
        with self._lock:
            old = self._pods.pop((str(rt.runsc_root), rt.container_id), None)
            self._pods[(str(rt.runsc_root), rt.container_id)] = p
        if old and old.timer:
            old.timer.cancel()
        return p

    def forget(self, root: str, container_id: str) -> None:
        """delete of a container: a sandbox's pod record goes, a member leaves its pod.

        containerd's CRI deletes a container's task as soon as it exits
        (internal/cri/server/events.go handleContainerExit: task.Delete), so the
        delete of a member of a cold pod that is not assembled yet is an init
        container's that ran to its end (the kubelet runs init containers, one
        after the other, before any app container: kuberuntime SyncPod): it is
        recorded as one, and is no container of the pod's image (runsc saves the
        containers a sandbox holds, and this one is gone)."""
        with self._lock:
            p = self._pods.pop((root, container_id), None)
            if p is None:
                for q in self._pods.values():
                    for name, m in list(q.members.items()):
                        if m.rt.container_id == container_id and str(m.rt.runsc_root) == root:
                            del q.members[name]
                            q.ended_locked(name, m)
        if p is not None and p.timer:
            p.timer.cancel()

    # -- the pause container ---------------------------------------------------

    def prepare_sandbox(self, rt: RuntimeRef, spec: dict) -> Decision:
        if podmod.fold_cgroup_parent(spec):   # before runsc reads it, cold or restored (pod.py says why)
            specmod.Bundle(rt.bundle).write(spec)
        try:
            tenant = self.containers.sandbox_tenant(rt, spec)
        except IdentityError as e:
            p = self._new(rt, spec, None)
            p.reason = p.unkeyed = str(e)
            return Decision(False, p.reason)
        p = self._new(rt, spec, tenant)
        if not p.declared:
            p.reason = (f"no-declared-containers: the pod declares none (annotation "
                        f"{podmod.ANNOTATION_READY_PREFIX}<container>)")
            return Decision(False, p.reason, p.lookup)
        with self._lock:  # one sandbox of that pod starts cold; later ones may restore again
            failed = self._failed_uids.pop(p.uid, None)
        if failed and time.time() - failed[1] < 3600:
            p.reason = f"{POD_FAILED}-before: an earlier sandbox of this pod was not restored ({failed[0]})"
            return Decision(False, p.reason, p.lookup)
        table, source = self.tables.pick(p.lookup, p.hint)
        if table is None:
            p.reason = "no-image: no pod of this workload and container set assembled on this node or in the store"
            return Decision(False, p.reason, p.lookup)
        names = sorted(table.containers)
        p.table_init = dict(table.init)
        if names != sorted(p.declared) and not (podmod.ANY in p.declared and len(names) == 1):
            # the lookup key covers the declared names: a table that disagrees is damaged
            self.tables.forget(p.lookup, table.key)
            p.reason = "no-image: the recorded container set does not match the declared names"
            return Decision(False, p.reason, p.lookup)
        # A miss streams (store.stream) as a lone container's does: only the root's
        # `runsc restore` reads the image (restore_sandbox); the members' restores do not.
        d = self.preparer.claim_image(rt, spec, table.key)
        if not d.restore:
            p.reason = d.reason
            return d
        log.info("%s: restores %s (pod table from the %s, hint %r)", p.summary(), table.key, source, p.hint,
                 extra=fields(container=rt.container_id, key=table.key, decision="restore", role="pod-sandbox",
                              reason=f"pod table from the {source}"))
        p.state, p.key, p.table = RESTORING, table.key, table.containers
        return d

    def pod_of(self, rt: RuntimeRef, spec: dict) -> Pod | None:
        """The pod record of a pod's container (its pause container or an app container)."""
        sid = rt.container_id if podmod.role(spec) == podmod.SANDBOX else podmod.sandbox_id(spec)
        return self._get(rt.runsc_root, sid)

    def restore_sandbox(self, rt: RuntimeRef, cancelled=lambda: False,
                        standin: Standin | None = None) -> tuple[bool, str, float]:
        """start of the pause container: `runsc restore` of the root registers it and
        opens the image (its lease's; a streamed one through thaw-gofer, which this call
        starts: restore.restore_options); the restore runs when the last app container
        registers. `cancelled()`: the stand-in gave up (Thawd.restore); its start falls
        back to a cold one, so the pod is cold from here."""
        t0 = time.monotonic()
        lease = self.containers.lease_of(rt)
        if lease is None:
            return False, "thawd holds no restore decision for this container (thawd restarted?)", 0.0
        key, _ = self.containers.start_restore(rt)   # the engine opens the gate once registered
        log.info("restore %s key=%s starting", rt.container_id, key,
                 extra=fields(container=rt.container_id, key=key, decision="restoring", role="pod-sandbox"))
        p = self._get(rt.runsc_root, rt.container_id)
        if p is None or p.state != RESTORING:
            return False, "thawd holds no restoring pod for this sandbox (thawd restarted?)", 0.0
        h = self.containers.handle(rt, specmod.Bundle(rt.bundle).load())
        p.restoring_since = t0
        try:
            Engine(self.s).restore(h, Path(lease.path), [], opts=restore_options(self.s, lease),
                                   health_check=False, post_restore_hooks=False, await_pages=False)
        except ThawError as e:
            reason, counts = restore_failure(lease, f"{type(e).__name__}: {e.message}")
            p.state, p.reason = COLD, f"restore of the sandbox failed: {reason}"
            self.restorer.undo_restore(h, rt, p.key, reason, quarantine=counts)
            return False, reason, time.monotonic() - t0
        if cancelled():
            p.state, p.reason = COLD, "the stand-in gave up before the sandbox's restore finished"
            self.restorer.undo_restore(h, rt, p.key, p.reason)
            return False, "cancelled", time.monotonic() - t0
        timeout = self.s.thawd_pod_assembly_timeout_s
        p.timer = threading.Timer(timeout, self._assembly_deadline, args=(p, timeout))
        p.timer.daemon = True
        p.timer.start()
        log.info("%s: sandbox registered for restore in %.3fs; waiting for %s", p.summary(),
                 time.monotonic() - t0, ", ".join(sorted(p.table)))
        self._watch_standin(rt, standin, p)
        return True, "sandbox registered; restored with its last container", time.monotonic() - t0

    def _assembly_deadline(self, p: Pod, timeout: float) -> None:
        """The timer runs from the root's registration to the last container's: the kubelet
        creating the containers and, for a streamed image, the last one's `runsc restore`
        loading the kernel through thaw-gofer (its reads are bounded by store.stream_deadline_s
        each: docs/store.md "Pods"). A stream that failed meanwhile is the reason."""
        if p.state == RESTORING:
            why = (f"assembly-timeout: {', '.join(p.missing())} not restored within {timeout:.0f}s "
                   "(thawd.pod_assembly_timeout_s)")
            lease = self.containers.lease_of(p.sandbox)
            if lease is not None and lease.streamed and lease.verdict(0) is not None:
                self._restore_failed(p, why)   # the stream's error replaces it
            else:
                self.fail(p, why)

    # -- app containers -----------------------------------------------------------

    def prepare_member(self, rt: RuntimeRef, spec: dict) -> Decision:
        sid, name = podmod.sandbox_id(spec), podmod.container_name(spec)
        p = self._get(rt.runsc_root, sid)
        if p is None:
            return Decision(False, f"pod-unknown: thawd has no record of sandbox {sid} (thawd restarted?)")
        try:
            # Its GPUs (and the CUDA helper) before its identity: both are part of it.
            self.preparer.prepare_spec(rt, spec, visible_devices=True)
        except ThawError as e:
            why = f"spec: container {name!r}: {e.message}"
            if p.state == RESTORING:
                self.fail(p, why)
                return Decision(False, f"{POD_FAILED}: {p.reason}", p.key)
            p.unkeyed = p.unkeyed or why
            return Decision(False, f"pod-cold: {why}", p.key or p.lookup)
        try:
            # its workload key from its recorded tenant and image digest, as a lone container's
            ident, unkeyed = podmod.identity(spec, self.containers.workload(rt, spec).key), ""
        except IdentityError as e:
            ident, unkeyed = {}, f"{e} (container {name!r})"
        if p.state != RESTORING or name in p.table:
            p.bind(name)
        if p.state == RESTORING:
            if unkeyed:   # nobody can tell it is the image's container: the pod starts again, cold
                self.fail(p, unkeyed)
                return Decision(False, f"{POD_FAILED}: {p.reason}", p.key)
            if name in p.table_init and name not in p.table:
                return self._satisfy(p, rt, name, ident)
            problem = p.mismatch(name, ident, lambda: self._spec_mismatch(p, name, spec))
            if problem:
                self.fail(p, f"container-mismatch: {problem}", refuse_table=True)
                return Decision(False, f"{POD_FAILED}: {p.reason}", p.key)
            with self._lock:
                p.members[name] = MemberState(name, rt, ident)
            lease = self.containers.lease_of(p.sandbox)
            return Decision(True, "pod-restoring", p.key, str(lease.path) if lease else "",
                            self.preparer.restore_deadline_s(spec, Path(lease.path) if lease else None)
                            + self.s.thawd_health_timeout_s * len(p.table))
        with self._lock:
            known = name in p.members
            p.members[name] = MemberState(name, rt, ident)
            if name not in p.declared and name not in p.undeclared:
                p.undeclared.append(name)
            if unkeyed and not p.unkeyed:
                p.unkeyed = unkeyed
        if p.state == FAILED:
            return Decision(False, f"{POD_FAILED}: {p.reason}", p.key)
        if p.state == RESTORED or known:
            return Decision(False, "pod-running: a container re-created in a running pod starts cold "
                                   "(the kubelet's restart; a restore would bring back the saved state)", p.key)
        self._assembled(p)
        return Decision(False, f"pod-cold: {unkeyed or p.reason}", p.key or p.lookup)

    def _satisfy(self, p: Pod, rt: RuntimeRef, name: str, ident: dict) -> Decision:
        """An init container of a restoring pod: the image's pod ran it to its end before
        it was saved, and what it left in memory comes back with the restore. The kubelet
        runs init containers before any app container of a new sandbox, and at the pin
        runsc cannot run a container in a sandbox that is restoring (a `runsc start` there
        becomes a restore: boot/controller.go StartSubcontainer), so the stand-in answers it
        as done (exit 0) without running it. One that differs from the image's (another
        image, args, spec) fails the pod: its next sandbox starts cold and runs it."""
        diff = podmod.differences(p.table_init[name], ident)
        if diff:
            self.fail(p, f"container-mismatch: init container {name!r} differs from the image's: "
                         f"{', '.join(diff)}", refuse_table=True)
            return Decision(False, f"{POD_FAILED}: {p.reason}", p.key)
        log.info("%s: init container %s answered as done (the image holds what it did)", p.summary(), name)
        self.containers.decide(rt, State.SATISFIED, p.key, reason=INIT_SATISFIED)
        return Decision(False, f"{INIT_SATISFIED}: the image's pod ran it; its work is in the restored memory",
                        p.key, satisfied=True)

    def _spec_mismatch(self, p: Pod, name: str, spec: dict) -> str:
        lease = self.containers.lease_of(p.sandbox)
        return image_meta.spec_mismatch(Path(lease.path), spec, name) if lease is not None else ""

    def _assembled(self, p: Pod) -> None:
        """A cold pod whose declared containers have all been created: its key and container
        set are known; remember them for the next pod of this lookup key."""
        if p.key or p.unkeyed or not p.lookup or set(p.members) != set(p.declared):
            return
        table = {n: m.identity for n, m in p.members.items()}
        p.key = podmod.key(p.lookup, {**table, **{f"{INIT_KEY_PREFIX}{n}": i for n, i in p.init.items()}})
        t = self.tables.put(p.lookup, p.key, table, p.hint, init=p.init)
        log.info("%s assembled: key %s (%s)", p.summary(), p.key, ", ".join(sorted(table)))
        # In the store too, so that a node which never assembled a pod of it restores its first.
        if self._pool is not None:
            self._pool.submit(self._publish_table, t)
        else:
            self._publish_table(t)

    def _publish_table(self, t) -> None:
        try:
            self.tables.publish(t)
        except ThawError as e:   # other nodes' first pods start cold until a later publish
            log.warning("pod table %s/%s not published: %s", t.lookup, t.key, e)

    def restore_member(self, rt: RuntimeRef, spec: dict, standin: Standin | None = None) -> tuple[bool, str, float]:
        """The stand-in ran `runsc restore` for this app container (with the shim's stdio).
        The last one's was the sandbox's restore: health-check every container."""
        t0 = time.monotonic()
        p = self._get(rt.runsc_root, podmod.sandbox_id(spec))
        name = podmod.container_name(spec)
        if p is None or p.state != RESTORING or name not in p.members:
            return False, "thawd holds no restoring pod for this container", 0.0
        with self._lock:
            p.members[name].started = True
            done = not p.missing()
        if not done:
            self._watch_standin(rt, standin, p)
            return True, "registered; the sandbox restores with its last container", time.monotonic() - t0
        engine = Engine(self.s)
        results = []
        for n in sorted(p.table):
            m = p.members[n]
            h = self.containers.handle(m.rt, specmod.Bundle(m.rt.bundle).load(), address=p.address)
            r = engine.check(h, [p.declared[n].health])
            results.append(f"{n}: {r.summary()}")
            if not r.healthy:
                reason = self._restore_failed(p, f"UnhealthyRestore: container {n}: {r.summary()}")
                return False, reason, time.monotonic() - t0
        first = next(iter(p.members.values()))
        try:  # the workload profile's hooks (thaw.dev/profile) run against the pod's first container
            hooks = engine.hooks(self.containers.handle(first.rt, specmod.Bundle(first.rt.bundle).load(),
                                                        address=p.address),
                                 specmod.Bundle(first.rt.bundle).load(), "post_restore")
        except ThawError as e:
            reason = self._restore_failed(p, f"UnhealthyRestore: post-restore hook failed: {e.message}")
            return False, reason, time.monotonic() - t0
        if hooks:
            results.append(f"post-restore hooks: {len(hooks)}")
        lease = self.containers.lease_of(p.sandbox)
        if lease is not None and loads_after_return(restore_options(self.s, lease)):
            # A --background restore is not done until every page is in (Engine.restore
            # says why); the sandbox's memory loads from when the last container registered.
            try:
                sb = self.containers.handle(p.sandbox, specmod.Bundle(p.sandbox.bundle).load())
                sb.runsc.wait(sb.id, None, restore=True)
            except ThawError as e:
                reason = self._restore_failed(p, f"{type(e).__name__}: the pod's memory did not load: {e.message}")
                return False, reason, time.monotonic() - t0
        if p.timer:
            p.timer.cancel()
        p.state, p.restored_at = RESTORED, time.time()
        secs = time.monotonic() - t0
        log.info("outcome %s key=%s RESTORED (pod of %d containers; health %.3fs: %s)", p.sandbox.container_id,
                 p.key, len(p.table), secs, "; ".join(results),
                 extra=fields(container=p.sandbox.container_id, key=p.key, decision="RESTORED", pod=True,
                              duration_s=round(secs, 4)))
        self.metrics.inc("thaw_restores_total")
        # What thawd times of a pod's restore: from the last container's Restore (its
        # `runsc restore`, the stand-in's, has registered it) to every container healthy,
        # the hooks run and, for a --background restore, every page in.
        self.metrics.observe("thaw_restore_seconds", secs, workload=workload_of(p.key))
        self.metrics.observe("thaw_health_seconds", secs)
        self.quarantine.succeeded(p.key)
        self.events.restored(p.ref, p.key, time.monotonic() - (p.restoring_since or t0), lease)
        if lease is not None:
            self.restorer.count_stream(lease)
        self._watch_standin(rt, standin, p)
        return True, "; ".join(results), secs

    def _restore_failed(self, p: Pod, reason: str) -> str:
        """The pod's restore failed (its last container's `runsc restore`, or a probe or
        hook after it): fail the pod, counted towards the key's quarantine; when its image's
        stream failed, the gofer failed the sentry's reads and runsc killed the sandbox, so
        the stream's error is the reason, counted as for a lone container
        (restore.restore_failure). The reason given."""
        lease = self.containers.lease_of(p.sandbox)
        reason, counts = restore_failure(lease, reason) if lease is not None else (reason, True)
        self.fail(p, reason, count=counts)
        return reason

    def _watch_standin(self, rt: RuntimeRef, standin: Standin | None, pod: Pod | None) -> None:
        """The stand-in kill safety of a lone container's restore (restore.py _confirm)
        for a pod's container (its pause container, whose `runsc restore` thawd ran, or
        an app container, whose the stand-in ran): when the stand-in dies after thawd's
        answer without having committed the start, containerd reports that start failed,
        and the pod containerd believes in is not the sandbox runsc holds. A pod's
        sandbox cannot lose one container and start it cold again (its start went to
        the restore), so the whole pod goes (fail): the kubelet re-creates it, and that
        sandbox starts cold. A pod's outcome is recorded at its last container
        (restore_member), and a death after it is recorded as the pod's failure."""
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
                    self.standin_died(pod, f"the stand-in of container {rt.container_id} died after "
                                           "its restore, before it could report it")
            except Exception:  # noqa: BLE001 - a thread of its own: log, keep the restore
                log.exception("confirming the restore of %s", rt.container_id)

        threading.Thread(target=watch, daemon=True, name=f"confirm-{rt.container_id}"[:15]).start()

    # -- outcomes the stand-in reports ----------------------------------------------

    def outcome(self, rt: RuntimeRef, spec: dict, outcome: str, reason: str) -> None:
        """What the stand-in reports for a pod's container (control/thawd/roles.py sends it
        here): RESTORE_FAILED (its part of the pod's restore, or a pause container's
        create that failed) or COLD_STARTED."""
        role = podmod.role(spec)
        log.info("outcome %s (pod %s) %s %s", rt.container_id, role, outcome, reason,
                 extra=fields(container=rt.container_id, role=role, decision=outcome, reason=reason or None))
        self.containers.end(rt, outcome, reason)
        if outcome == "RESTORE_FAILED":
            self.restore_failed(rt, spec, reason)
        else:
            self.metrics.inc("thaw_cold_starts_total")
            self.cold_started(rt, spec)

    def cold_started(self, rt: RuntimeRef, spec: dict) -> None:
        role = podmod.role(spec)
        if role == podmod.SANDBOX:
            if self._get(rt.runsc_root, rt.container_id) is None:  # thawd restarted since create
                self._new(rt, spec, None).reason = "thawd restarted"
            return
        p = self._get(rt.runsc_root, podmod.sandbox_id(spec))
        name = podmod.container_name(spec)
        if p is None or name not in p.members:
            return
        with self._lock:
            p.members[name].started = True
        if p.state == COLD:
            self._maybe_checkpoint(p)

    def restore_failed(self, rt: RuntimeRef, spec: dict, reason: str) -> None:
        """The stand-in could not do its part of a restore: the pause container's create
        (it starts cold), or an app container's `runsc restore` (the pod is lost); or
        a container of a restoring pod could not be stopped (the pod is going away)."""
        if reason.startswith(STOPPED_WHILE_RESTORING):
            sid = rt.container_id if podmod.role(spec) == podmod.SANDBOX else podmod.sandbox_id(spec)
            p = self._get(rt.runsc_root, sid)
            if p is not None and p.state == RESTORING:
                self.fail(p, reason)
            return
        if podmod.role(spec) == podmod.SANDBOX:
            p = self._get(rt.runsc_root, rt.container_id)
            if p is not None:
                p.state, p.reason = COLD, f"restore could not be tried: {reason}"
            return
        p = self._get(rt.runsc_root, podmod.sandbox_id(spec))
        if p is not None and p.state == RESTORING:
            self._restore_failed(p, f"runsc restore of container {podmod.container_name(spec)!r}: {reason}")

    def standin_died(self, p: Pod, reason: str) -> None:
        """A stand-in of this pod's restore died after thawd's answer, before it
        committed its start (_watch_standin): containerd reports that
        start failed. Not the image's fault: not counted towards quarantine."""
        if p.state in (RESTORING, RESTORED):
            self.fail(p, reason)

    def fail(self, p: Pod, reason: str, *, count: bool = False, refuse_table: bool = False) -> None:
        """The pod cannot be restored and cannot start cold in this sandbox: remove the
        sandbox (the kubelet re-creates the pod, and its next sandbox starts cold)."""
        with self._lock:
            if p.state == FAILED:
                return
            p.state, p.reason = FAILED, reason
            self._failed_uids[p.uid] = (reason, time.time())
        if p.timer:
            p.timer.cancel()
        if refuse_table:   # a pod of another version: its hint picks this table no more here
            self.tables.refuse(p.lookup, p.key, p.hint)
        log.warning("%s: %s; removing its sandbox: the kubelet re-creates the pod, which then starts cold",
                    p.summary(), reason, extra=fields(container=p.sandbox.container_id, key=p.key or None,
                                                      decision="pod-failed", reason=reason))
        r = p.sandbox.runsc(self.s.runsc_path, self.s.runsc_timeout_s)
        try:
            if r.exists(p.sandbox.container_id):
                r.delete(p.sandbox.container_id, force=True)
        except ThawError as e:
            log.warning("removing the sandbox of %s: %s", p.summary(), e)
        self.metrics.inc("thaw_fallbacks_total", reason=reason.split(":")[0])
        self.events.restore_failed(p.ref, reason)
        self.containers.drop_image(p.sandbox)
        if count and p.key and self.quarantine.failed(p.key, reason):
            self.metrics.inc("thaw_quarantined_total")
            self.events.quarantined(p.ref, p.key, reason)

    # -- automatic checkpoint ----------------------------------------------------------

    def _maybe_checkpoint(self, p: Pod) -> None:
        if p.unkeyed:
            log.warning("%s is not checkpointed: %s", p.summary(), p.unkeyed)
            return
        if p.undeclared:
            log.warning("%s is not checkpointed: container(s) %s not declared (annotation %s<container>)",
                        p.summary(), ", ".join(p.undeclared), podmod.ANNOTATION_READY_PREFIX)
            return
        if not p.key or not all(m.started for m in p.members.values()):
            return
        self.autocheckpoint.maybe(p.key, lambda: self._auto_checkpoint(p), p.summary(), pod=p.ref)

    def _auto_checkpoint(self, p: Pod) -> dict | None:
        """Wait for every declared container's readiness, then checkpoint the sandbox
        (all its containers) and publish it under the pod's key."""
        engine = Engine(self.s)
        deadline = time.monotonic() + self.s.thawd_ready_timeout_s
        for n in sorted(p.declared):
            m = p.members.get(n)
            if m is None:
                return None
            h = self.containers.handle(m.rt, specmod.Bundle(m.rt.bundle).load(), address=p.address)
            ready = engine.check(h, [p.declared[n].ready], engine.policy(max(1.0, deadline - time.monotonic())))
            if not ready.healthy:
                log.warning("auto-checkpoint of %s skipped: container %s never ready (%s)", p.summary(), n,
                            ready.summary())
                self.metrics.inc("thaw_auto_checkpoints_total", result="not-ready")
                return None
        if p.state != COLD or set(p.members) != set(p.declared):
            return None  # the pod went away or changed while it warmed up
        # The profile's pre-checkpoint hooks run against the pod's first container
        # (the kubelet starts them in the pod spec's order); runsc saves the sandbox.
        first = next(iter(p.members.values()))
        return self.autocheckpoint.checkpoint(p.sandbox, leave_running=self.s.thawd_leave_running, key=p.key,
                                              hooks_rt=first.rt, members={n: m.rt for n, m in p.members.items()})

