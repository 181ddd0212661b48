"""The pods of a label selector as a watch on the API server delivers them, with
the moment this process saw each change: when a pod appeared, was bound to a
node and became Ready as its kubelet reported it. For benchmarks of the dev
cluster (bench/cluster.py: a Deployment scaled out, cold vs restored).

Why a watch and our own clock: the API's timestamps (creationTimestamp, a
condition's lastTransitionTime) are metav1.Time, RFC 3339 in whole seconds,
too coarse for a restore of about a second; a watch event reaches us a few
milliseconds after the API server stored the kubelet's status. The API's
timestamps are kept beside ours, as a cross-check.

    w = PodWatch(cluster.api_url, ca, cert, key, "default", "app=server").start()
    ...                                   # scale the Deployment
    pods = w.wait(lambda ps: ready(ps) == 6, 300, "6 pods Ready")
    w.stop()

The watch opens from the resourceVersion of a list made first (the API's
list-then-watch), so it misses no event; `start` returns once the API server
answered the watch's request, so changes made after it are all seen.
"""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from control.errors import ThawError, Timeout

WATCH_TIMEOUT_S = 1800     # the API server ends a watch after this (timeoutSeconds); a benchmark round is minutes


@dataclass
class PodSeen:
    """One pod (by uid) as seen so far; times are time.monotonic() of this process."""
    name: str
    uid: str
    first_seen: float
    node: str = ""
    bound_seen: float | None = None       # nodeName first set (the scheduler's binding)
    ready_seen: float | None = None       # the Ready condition first True (the kubelet's status)
    deleted_seen: float | None = None     # deletionTimestamp first set, or the DELETED event
    gone_seen: float | None = None        # the DELETED event: the pod object is gone
    created: str = ""                     # metadata.creationTimestamp (whole seconds, the API's)
    ready_transition: str = ""            # the Ready condition's lastTransitionTime when first True
    phase: str = ""
    restarts: int = 0                     # sum of the containers' restartCount (last seen)

    @property
    def live(self) -> bool:
        return self.deleted_seen is None


def is_ready(pod: dict) -> tuple[bool, str]:
    """(the Ready condition is True, its lastTransitionTime)."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True", c.get("lastTransitionTime") or ""
    return False, ""


def fold(pods: dict[str, PodSeen], kind: str, pod: dict, now: float) -> None:
    """One watch event (`kind` ADDED, MODIFIED or DELETED, `pod` its object) into `pods`, seen at `now`."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    uid = meta.get("uid", "")
    if not uid:
        return
    p = pods.get(uid)
    if p is None:
        p = pods[uid] = PodSeen(meta.get("name", ""), uid, now, created=meta.get("creationTimestamp", ""))
    if spec.get("nodeName") and p.bound_seen is None:
        p.node, p.bound_seen = spec["nodeName"], now
    ready, since = is_ready(pod)
    if ready and p.ready_seen is None:
        p.ready_seen, p.ready_transition = now, since
    p.phase = status.get("phase", p.phase)
    p.restarts = sum(c.get("restartCount", 0) for c in status.get("containerStatuses") or [])
    if (kind == "DELETED" or meta.get("deletionTimestamp")) and p.deleted_seen is None:
        p.deleted_seen = now
    if kind == "DELETED" and p.gone_seen is None:
        p.gone_seen = now


def ready_count(pods: dict[str, PodSeen]) -> int:
    """Live pods that have been Ready (a benchmark's pods do not turn unready)."""
    return sum(1 for p in pods.values() if p.live and p.ready_seen is not None)


def all_gone(pods: dict[str, PodSeen]) -> bool:
    """Every pod seen has been removed from the API server."""
    return all(p.gone_seen is not None for p in pods.values())


class PodWatch:
    def __init__(self, server: str, ca: Path, cert: Path, key: Path, namespace: str, selector: str,
                 timeout_s: float = 10) -> None:
        u = urllib.parse.urlsplit(server)
        self.host, self.port = u.hostname or "", u.port or 443
        self.namespace, self.selector, self.timeout_s = namespace, selector, timeout_s
        self._ctx = ssl.create_default_context(cafile=str(ca))
        self._ctx.load_cert_chain(str(cert), str(key))
        self.pods: dict[str, PodSeen] = {}
        self._cond = threading.Condition()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._error = ""
        self._closed = False

    def _path(self, **q: str) -> str:
        query = urllib.parse.urlencode({"labelSelector": self.selector, **q})
        return f"/api/v1/namespaces/{urllib.parse.quote(self.namespace)}/pods?{query}"

    def start(self) -> "PodWatch":
        conn = http.client.HTTPSConnection(self.host, self.port, context=self._ctx, timeout=self.timeout_s)
        try:
            conn.request("GET", self._path())
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise ThawError(f"list pods {self.selector} in {self.namespace}: HTTP {r.status}: {body[:300]!r}")
        finally:
            conn.close()
        listed = json.loads(body)
        now = time.monotonic()
        with self._cond:
            for item in listed.get("items") or []:
                fold(self.pods, "ADDED", item, now)
        conn = http.client.HTTPSConnection(self.host, self.port, context=self._ctx, timeout=self.timeout_s)
        conn.request("GET", self._path(watch="1", resourceVersion=listed["metadata"]["resourceVersion"],
                                       timeoutSeconds=str(WATCH_TIMEOUT_S)))
        self._sock = conn.sock
        r = conn.getresponse()    # the API server answers a watch's headers once it is open
        if r.status != 200:
            raise ThawError(f"watch pods {self.selector} in {self.namespace}: HTTP {r.status}: {r.read()[:300]!r}")
        self._sock.settimeout(None)
        self._thread = threading.Thread(target=self._read, args=(r,), daemon=True, name="podwatch")
        self._thread.start()
        return self

    def _read(self, r: http.client.HTTPResponse) -> None:
        try:
            while line := r.readline():
                ev = json.loads(line)
                now = time.monotonic()
                with self._cond:
                    if ev.get("type") == "ERROR":
                        self._error = json.dumps(ev.get("object"))[:500]
                    elif ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        fold(self.pods, ev["type"], ev.get("object") or {}, now)
                    self._cond.notify_all()
        except (OSError, ValueError, http.client.HTTPException) as e:
            if not self._closed:
                self._error = f"{type(e).__name__}: {e}"
        finally:
            with self._cond:
                if not self._closed and not self._error:
                    self._error = "the API server ended the watch"
                self._cond.notify_all()

    def wait(self, done: Callable[[dict[str, PodSeen]], bool], timeout_s: float, what: str) -> dict[str, PodSeen]:
        """Block until `done(pods)` holds (checked on every event); the pods then (a copy)."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while not done(self.pods):
                if self._error:
                    raise ThawError(f"watch of pods {self.selector} broke while waiting for {what}: {self._error}")
                left = end - time.monotonic()
                if left <= 0:
                    raise Timeout(f"{what} (pods {self.selector}: "
                                  f"{ {p.name: (p.node, p.phase, p.ready_seen is not None) for p in self.pods.values()} })",
                                  timeout_s)
                self._cond.wait(min(left, 1.0))
            return {k: PodSeen(**vars(v)) for k, v in self.pods.items()}

    def stop(self) -> None:
        self._closed = True
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        if self._thread is not None:
            self._thread.join(5)
