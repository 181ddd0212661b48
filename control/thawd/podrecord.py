"""A Kubernetes pod as thawd tracks it (control/thawd/pods.py): its state (cold,
restoring, restored, failed), the containers it declares and those that came, the
image's table of them while it restores, its init containers, and the rules that
read only this record: whether a container is the image's, which container a pod
declared by thaw.dev/ready alone means, an init container's end. The reason words
the Go stand-in shares are here too.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from control.lifecycle import pod as podmod
from control.thawd.containers import RuntimeRef

log = logging.getLogger("thawd")

# The reason prefix of a pod thawd removed: the stand-in fails the container's
# create with it instead of creating a container in a sandbox that is gone.
# Twin: go/internal/standin/standin.go podFailedReason.
POD_FAILED = "pod-failed"
# The reason prefix the stand-in reports when a kill of a container of a
# restoring pod failed (the kubelet stops a pod before its last container
# came): thawd removes the sandbox so the pod can go. Twin:
# go/internal/standin/standin.go stoppedWhileRestoring.
STOPPED_WHILE_RESTORING = "stopped-while-restoring"

COLD, RESTORING, RESTORED, FAILED = "cold", "restoring", "restored", "failed"
# The reason of an init container answered as done in a restoring pod (Decision.satisfied;
# the stand-in's marker says "satisfied": go/internal/standin satisfied.go).
INIT_SATISFIED = "init-satisfied"
# An init container's identity in the pod's key: beside the app containers', named apart.
INIT_KEY_PREFIX = "init/"


@dataclass
class MemberState:
    name: str
    rt: RuntimeRef
    identity: dict
    started: bool = False        # cold: started; restoring: its `runsc restore` registered it


@dataclass
class Pod:
    sandbox: RuntimeRef        # the pause container: the sandbox runsc checkpoints and restores
    uid: str
    lookup: str
    declared: dict               # name -> pod.Member
    state: str = COLD
    reason: str = ""
    key: str = ""                # the image restoring; for a cold pod, its key once assembled
    table: dict = field(default_factory=dict)      # name -> identity the image was saved with
    members: dict = field(default_factory=dict)    # name -> MemberState
    undeclared: list = field(default_factory=list)
    unkeyed: str = ""            # why a container's identity (so the pod's key) cannot be told: never checkpointed
    hint: str = ""               # which version of its workload the pod is (podtables.hint_of)
    # Init containers: cold, those that ran and ended before the pod was assembled (name ->
    # identity); restoring, those of the image's pod (its table's), answered as done.
    init: dict = field(default_factory=dict)
    table_init: dict = field(default_factory=dict)
    bound_any: str = ""          # the container a thaw.dev/ready-alone declaration was bound to
    restored_at: float = 0.0
    restoring_since: float = 0.0   # monotonic, at the sandbox's start: its Event's "in how long"
    ref: "podmod.PodRef | None" = None   # the Kubernetes pod: where its Events go (control/thawd/events.py)
    # The pod's IPv4 address, read from its network namespace at its sandbox's create,
    # before runsc took the interface over (runsc/sandbox/network.go removes the host
    # side's addresses): thawd's tcp and http probes reach the pod there, as the
    # kubelet's do; None: they run inside the sandbox (runsc exec).
    address: str | None = None
    timer: threading.Timer | None = None

    def summary(self) -> str:
        return f"pod {self.sandbox.container_id} ({self.lookup}, {self.state})"

    def ended_locked(self, name: str, m: MemberState) -> None:
        """Member `name` was deleted: an init container's end, while the pod is cold and
        unassembled (Pods.forget says why); the Pods lock is held."""
        if self.state != COLD or self.key or not name:
            return
        if name in self.declared and name != self.bound_any:
            return                    # a declared app container that ended: the kubelet restarts it
        if name == self.bound_any:    # thaw.dev/ready was bound to what turned out an init container
            d = self.declared.pop(name)
            self.declared[podmod.ANY] = podmod.Member(podmod.ANY, d.ready, d.health)
            self.bound_any = ""
        if name in self.undeclared:
            self.undeclared.remove(name)
        self.init[name] = m.identity
        log.info("%s: container %s ended before the pod was assembled: an init container", self.summary(), name)

    def bind(self, name: str) -> None:
        """A pod declared by thaw.dev/ready alone: its first container is the declared one
        (unbound again if it ends as an init container: ended_locked)."""
        if name and podmod.ANY in self.declared and name not in self.declared:
            m = self.declared.pop(podmod.ANY)
            self.declared[name] = podmod.Member(name, m.ready, m.health)
            self.bound_any = name

    def mismatch(self, name: str, ident: dict, spec_why: Callable[[], str] = lambda: "") -> str:
        """Why app container `name` of identity `ident` is not the restoring image's; ""
        when it is. `spec_why`: why its spec (the GPUs it holds now: another index is fine,
        another count is not; its mounts and devices) would not restore the image's, a lone
        container's judgement against the spec it was saved with."""
        if name not in self.table:
            return (f"container {name!r} is not one of the image's ({', '.join(sorted(self.table))})"
                    if name else "a container without io.kubernetes.cri.container-name")
        if name in self.members:
            return f"container {name!r} created twice while the pod restores"
        why = spec_why()
        if why:
            return f"container {name!r}: {why}"
        diff = podmod.differences(self.table[name], ident)
        return f"container {name!r} differs from the image's: {', '.join(diff)}" if diff else ""

    def missing(self) -> list[str]:
        """The image's containers not restored yet (registered by their `runsc restore`)."""
        return sorted(n for n in self.table if not (n in self.members and self.members[n].started))
