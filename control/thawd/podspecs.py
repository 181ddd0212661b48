"""What thawd reads of a pod from the API server: its spec, when the pod's sandbox
is created, for the readiness of its containers (control/lifecycle/readiness.py:
the pod's readinessProbes, thaw.dev annotations as overrides).

A read never stands in a start's way for long: one request, bounded by
kubernetes.timeout_s, and when it fails the pod's annotations alone declare its
containers, as before the API server was asked (pod.declared), and the log and an
Event on the pod say so. An API server that did not answer (no connection, a
timeout, a 5xx) is not asked again for DOWN_S: pods created meanwhile go straight
to their annotations. A pod the API server names with another uid (deleted and
made again under the same name) is not this sandbox's: annotations too.

Falling back can change the declared set, so the pod's lookup key, and a pod that
would have restored then starts cold; it never fails.
"""
from __future__ import annotations

import logging
import threading
import time

from control.errors import ApiError
from control.lifecycle import pod as podmod
from control.lifecycle import readiness
from control.logfields import fields
from control.thawd.events import NORMAL, WARNING

log = logging.getLogger("thawd")

DOWN_S = 30.0


class PodSpecs:
    """`client` (kubeapi.Client) None: reading pods is off (kubernetes.read_pods)."""

    def __init__(self, client, events, metrics, clock=time.monotonic) -> None:
        self.client, self.events, self.metrics, self._clock = client, events, metrics, clock
        self._down_until = 0.0
        self._down_why = ""
        self._lock = threading.Lock()

    def declared(self, spec: dict) -> dict[str, "podmod.Member"]:
        """The containers a pod's sandbox `spec` declares (pods.Pods._new); UserError for a
        bad thaw.dev annotation, as pod.declared."""
        ref = podmod.pod_ref(spec)
        if self.client is None or ref is None:
            return podmod.declared(spec)
        with self._lock:
            down = self._clock() < self._down_until and self._down_why
        if down:
            self.metrics.inc("thaw_kube_pod_reads_total", result="skipped")
            return self._fallback(spec, ref, f"the API server did not answer a moment ago ({down})")
        try:
            pod = self.client.get_pod(ref.namespace, ref.name)
        except ApiError as e:
            self.metrics.inc("thaw_kube_pod_reads_total", result="failed")
            if e.status == 0 or e.status >= 500:
                with self._lock:
                    self._down_until, self._down_why = self._clock() + DOWN_S, e.message
            return self._fallback(spec, ref, f"its spec could not be read: {e.message}")
        uid = (pod.get("metadata") or {}).get("uid", "")
        if uid != ref.uid:
            self.metrics.inc("thaw_kube_pod_reads_total", result="unusable")
            return self._fallback(spec, ref, f"the API server's pod {ref} is another one (uid {uid}, the "
                                  f"sandbox's {ref.uid})")
        try:
            members, notes = readiness.declared(spec.get("annotations") or {}, pod)
        except readiness.Untranslatable as e:
            self.metrics.inc("thaw_kube_pod_reads_total", result="unusable")
            return self._fallback(spec, ref, e.message)
        self.metrics.inc("thaw_kube_pod_reads_total", result="ok")
        said = (f"readiness from the pod spec (thaw.dev annotations override it): {readiness.describe(members)}"
                if members else "no container of the pod has a readinessProbe or a thaw.dev/ready annotation: "
                "it is never checkpointed")
        if notes:
            said += "; " + "; ".join(notes)
        log.info("pod %s: %s", ref, said, extra=fields(pod=str(ref), reason=said))
        self.events.post(ref, "ThawReadiness", said, NORMAL if members else WARNING)
        return members

    def _fallback(self, spec: dict, ref: "podmod.PodRef", why: str) -> dict[str, "podmod.Member"]:
        members = podmod.declared(spec)
        said = f"{why}; readiness from thaw.dev annotations alone: {readiness.describe(members)}"
        log.warning("pod %s: %s", ref, said, extra=fields(pod=str(ref), reason=said))
        self.events.post(ref, "ThawReadiness", said, WARNING)
        return members
