"""Kubernetes Events on a pod for each of thawd's decisions (issue 29): restored
from which image in how long, started cold and why, checkpointed (size, time),
quarantined, where its readiness came from. `kubectl describe pod` shows them.

Never in a container's way: `post` puts the Event on a bounded queue
(QUEUE_SIZE) and returns; one worker thread sends them. A full queue drops the
Event; a failing API server fails only the Event; both are counted
(thaw_kube_events_total{result}) and logged, never raised.

Aggregated as the kubelet's recorder does (client-go tools/record
events_cache.go EventLogger): an Event equal to one posted before (same pod,
type, reason and message) is not posted again, its count goes up and its
lastTimestamp moves, through a strategic merge patch of the first; one the API
server no longer has (Events live an hour) is created again with its count.
The cache of those is an LRU of CACHE_SIZE entries (client-go's
maxLruCacheEntries, 4096).

Core v1 Events, as the kubelet posts them (no eventTime: the API server
validates them as the legacy kind, pkg/apis/core/validation/events.go), with
source.host and reportingInstance this node and reportingComponent
REPORTING_COMPONENT: the chart's admission policy holds thawd to Events of its
own node by those fields (docs/kubernetes.md "What thawd may do").
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from control.errors import ApiError
from control.lifecycle.pod import PodRef

log = logging.getLogger("thawd")

QUEUE_SIZE = 256
CACHE_SIZE = 4096
REPORTING_COMPONENT = "thaw.dev/thawd"    # twin: deploy/helm/thaw/templates/admissionpolicy.yaml
SOURCE_COMPONENT = "thawd"
MESSAGE_MAX = 1024                        # events.k8s.io's note limit (core validation NoteLengthLimit)
NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class Event:
    pod: PodRef
    type: str
    reason: str
    message: str


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Events:
    """The recorder. `client` (control/thawd/kubeapi.py Client) None: posting is off,
    `post` does nothing."""

    def __init__(self, client, node: str, metrics, queue_size: int = QUEUE_SIZE) -> None:
        self.client, self.node, self.metrics = client, node, metrics
        self._q: queue.Queue[Event | None] = queue.Queue(maxsize=queue_size)
        self._posted: collections.OrderedDict[tuple, tuple[str, int, str]] = collections.OrderedDict()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def post(self, pod: PodRef | None, reason: str, message: str, type: str = NORMAL) -> None:
        """Queue one Event on `pod` (None: not a pod's, nothing to post). Never blocks."""
        if self.client is None or pod is None:
            return
        self._start()
        if len(message) > MESSAGE_MAX:
            message = message[:MESSAGE_MAX - 3] + "..."
        try:
            self._q.put_nowait(Event(pod, type, reason, message))
        except queue.Full:
            self.metrics.inc("thaw_kube_events_total", result="dropped")
            log.warning("event %s on pod %s dropped: %d events wait already", reason, pod, self._q.maxsize)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="kube-events")
                self._thread.start()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued Event was sent or failed (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._q.unfinished_tasks

    def close(self) -> None:
        if self._thread is not None:
            try:
                self._q.put_nowait(None)
            except queue.Full:
                pass

    def _run(self) -> None:
        while True:
            ev = self._q.get()
            try:
                if ev is None:
                    return
                self.metrics.inc("thaw_kube_events_total", result=self._send(ev))
            except ApiError as e:
                self.metrics.inc("thaw_kube_events_total", result="failed")
                log.warning("event %s on pod %s not posted: %s", ev.reason, ev.pod, e.message)
            except Exception:  # noqa: BLE001 - the worker must outlive any one Event
                self.metrics.inc("thaw_kube_events_total", result="failed")
                log.exception("event %s on pod %s not posted", ev.reason, ev.pod)
            finally:
                self._q.task_done()

    def _send(self, ev: Event) -> str:
        """Post `ev` or count it on the one posted before; "posted" or "aggregated"."""
        key = (ev.pod.namespace, ev.pod.uid, ev.type, ev.reason, ev.message)
        now = _now()
        seen = self._posted.get(key)
        if seen is not None:
            name, count, first = seen
            try:
                self.client.patch_event(ev.pod.namespace, name, {"count": count + 1, "lastTimestamp": now})
                self._remember(key, (name, count + 1, first))
                return "aggregated"
            except ApiError as e:
                if e.status != 404:
                    raise
                self._posted.pop(key, None)   # expired on the API server: made again, its count kept
                return self._create(key, ev, now, count + 1, first)
        return self._create(key, ev, now, 1, now)

    def _create(self, key: tuple, ev: Event, now: str, count: int, first: str) -> str:
        # The name client-go's recorder gives (record/event.go makeEvent): <object>.<unix nanos, hex>.
        name = f"{ev.pod.name[:236]}.{time.time_ns():x}"
        self.client.create_event(ev.pod.namespace, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ev.pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ev.pod.namespace,
                               "name": ev.pod.name, "uid": ev.pod.uid},
            "type": ev.type, "reason": ev.reason, "message": ev.message,
            "source": {"component": SOURCE_COMPONENT, "host": self.node},
            "reportingComponent": REPORTING_COMPONENT, "reportingInstance": self.node,
            "firstTimestamp": first, "lastTimestamp": now, "count": count,
        })
        self._remember(key, (name, count, first))
        return "posted"

    def _remember(self, key: tuple, value: tuple) -> None:
        self._posted[key] = value
        self._posted.move_to_end(key)
        while len(self._posted) > CACHE_SIZE:
            self._posted.popitem(last=False)

    # -- the decisions, worded once ---------------------------------------------------

    def restored(self, pod: PodRef | None, key: str, seconds: float, lease=None) -> None:
        how = ("" if lease is None else " (streamed from the store)" if getattr(lease, "streamed", False)
               else " (from the node cache)" if getattr(lease, "hit", False) else " (pulled from the store)")
        self.post(pod, "ThawRestored", f"restored from image {key} in {seconds:.2f}s{how}")

    def cold(self, pod: PodRef | None, reason: str) -> None:
        self.post(pod, "ThawColdStart", f"started cold: {reason}")

    def restore_failed(self, pod: PodRef | None, reason: str) -> None:
        self.post(pod, "ThawRestoreFailed", f"restore failed; the pod is re-created and starts cold: {reason}",
                  WARNING)

    def checkpointed(self, pod: PodRef | None, key: str, nbytes: int, seconds: float) -> None:
        self.post(pod, "ThawCheckpointed", f"checkpointed as image {key}: {nbytes / (1 << 20):.1f} MiB "
                  f"in {seconds:.2f}s, published")

    def checkpoint_failed(self, pod: PodRef | None, reason: str) -> None:
        self.post(pod, "ThawCheckpointFailed", f"automatic checkpoint failed (the pod runs on): {reason}", WARNING)

    def quarantined(self, pod: PodRef | None, key: str, reason: str) -> None:
        self.post(pod, "ThawQuarantined", f"image {key} quarantined after repeated failed restores: pods of it "
                  f"start cold until `thaw evict {key}` ({reason})", WARNING)
