"""One readiness: a Kubernetes pod's own readinessProbes as thaw's probes, with the
thaw.dev annotations as overrides (issue 29).

CRI hands the runtime no probe (the kubelet runs them itself: kuberuntime
prober), so thawd reads the pod's spec from the API server when the pod's sandbox
is created (control/thawd/podspecs.py) and this module turns it into the
containers thaw expects and their probes (pod.Member), as pod.declared does from
annotations alone:

- a container's probe is its thaw.dev/ready.<name> annotation (thaw.dev/ready for
  a pod of one container), else its readinessProbe translated, else, when some
  other container of the pod says when it is ready, "running": the kubelet counts a
  container without a readinessProbe ready once it runs
  (pkg/kubelet/prober/prober_manager.go UpdatePodStatus), and so does thaw;
- a pod where no container says when it is ready declares none: it is never
  checkpointed (a model server would be saved before its model loaded);
- every app container is declared, and each sidecar (an init container with
  restartPolicy Always, which runs beside them); other init containers end before
  the pod is assembled (control/thawd/pods.py);
- the health probe after a restore is thaw.dev/health.<name>, else the readiness
  probe (a delay becomes "running", as for annotations).

Translation (Kubernetes' probe -> thaw's grammar, runsc_hooks/probe.py):
  httpGet  -> http:PORT/PATH=200-399 (the kubelet's success range: prober/http);
              an HTTPS scheme (thaw's probe speaks plain HTTP) -> tcp:PORT; a host
              or headers are dropped (thaw asks the pod itself), said in the notes
  tcpSocket -> tcp:PORT
  exec     -> exec:COMMAND (argv as the kubelet runs it, without a shell)
  grpc     -> tcp:PORT (thaw has no gRPC health client; said in the notes)
A named port is looked up in the container's ports; one that is not there makes
the whole pod's spec unusable (Untranslatable), and thawd falls back to the
annotations. The kubelet's timing fields (initialDelaySeconds, periodSeconds, ...)
are not used: thaw's checks run until thawd.ready_timeout_s / health_timeout_s.
"""
from __future__ import annotations

from control.errors import UserError
from control.lifecycle import pod as podmod
from control.lifecycle import workload
from runsc_hooks import probe as probemod


class Untranslatable(UserError):
    """A readinessProbe thaw cannot express; the message names the container and why."""


def translate(p: dict, container: dict) -> tuple["probemod.Probe", list[str]]:
    """One readinessProbe of `container` (the pod spec's objects, as JSON) as a thaw
    probe, and notes on what it dropped."""
    name = container.get("name", "?")
    notes: list[str] = []
    if p.get("httpGet") is not None:
        h = p["httpGet"]
        port = _port(h.get("port"), container)
        if str(h.get("scheme") or "HTTP").upper() == "HTTPS":
            notes.append(f"{name}: httpGet over HTTPS is checked as a TCP connect to port {port}")
            return probemod.TcpProbe(port), notes
        if h.get("host") or h.get("httpHeaders"):
            notes.append(f"{name}: httpGet's host and headers are not sent (thaw asks the pod itself)")
        path = h.get("path") or "/"
        if not path.startswith("/"):
            path = "/" + path
        return probemod.parse(f"http:{port}{path}=200-399"), notes
    if p.get("tcpSocket") is not None:
        return probemod.TcpProbe(_port(p["tcpSocket"].get("port"), container)), notes
    if p.get("exec") is not None:
        argv = p["exec"].get("command") or []
        if not argv:
            raise Untranslatable(f"container {name}: readinessProbe exec has no command")
        return probemod.ExecProbe(tuple(str(a) for a in argv)), notes
    if p.get("grpc") is not None:
        port = _port(p["grpc"].get("port"), container)
        notes.append(f"{name}: a gRPC health check is checked as a TCP connect to port {port}")
        return probemod.TcpProbe(port), notes
    raise Untranslatable(f"container {name}: readinessProbe has no httpGet, tcpSocket, exec or grpc")


def _port(port, container: dict) -> int:
    name = container.get("name", "?")
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        n = int(port)
    else:
        found = [cp.get("containerPort") for cp in container.get("ports") or [] if cp.get("name") == port]
        if not found:
            raise Untranslatable(f"container {name}: readinessProbe port {port!r} is no port of the container")
        n = int(found[0])
    if not 0 < n < 65536:
        raise Untranslatable(f"container {name}: readinessProbe port {n} outside 1-65535")
    return n


def containers(pod: dict) -> list[dict]:
    """The containers that run together once the pod is up: its sidecars (restartable
    init containers, started first) and its app containers."""
    spec = pod.get("spec") or {}
    sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    return sidecars + list(spec.get("containers") or [])


def declared(annotations: dict, pod: dict) -> tuple[dict[str, "podmod.Member"], list[str]]:
    """The containers the pod declares (pod.Member by name) from its spec `pod` and its
    thaw.dev annotations (overrides), and notes for the log and the pod's Event.
    UserError for a bad annotation; Untranslatable for a probe thaw cannot express."""
    ann = annotations or {}
    ctrs = containers(pod)
    names = [c.get("name", "") for c in ctrs]
    one = len(ctrs) == 1
    ready: dict[str, probemod.Probe] = {}
    notes: list[str] = []
    for c in ctrs:
        n = c.get("name", "")
        key = podmod.ANNOTATION_READY_PREFIX + n
        if key in ann:
            ready[n] = workload.parse_probe(ann[key], key)
        elif one and workload.ANNOTATION_READY in ann:
            ready[n] = workload.parse_probe(ann[workload.ANNOTATION_READY], workload.ANNOTATION_READY)
        elif c.get("readinessProbe"):
            ready[n], more = translate(c["readinessProbe"], c)
            notes += more
    for k in ann:   # a thaw.dev/ready.<name> of no container of the spec: declared still (pod.declared's rule)
        if k.startswith(podmod.ANNOTATION_READY_PREFIX) and k[len(podmod.ANNOTATION_READY_PREFIX):] not in names:
            n = k[len(podmod.ANNOTATION_READY_PREFIX):]
            notes.append(f"annotation {k} names no container of the pod")
            ready[n] = podmod.declared({"annotations": {k: ann[k]}})[n].ready
    if not ready:
        return {}, notes
    out: dict[str, podmod.Member] = {}
    for n in names + sorted(set(ready) - set(names)):
        r = ready.get(n, probemod.RunningProbe())
        hk = podmod.ANNOTATION_HEALTH_PREFIX + n
        if hk in ann:
            health = workload.parse_probe(ann[hk], hk)
        elif one and workload.ANNOTATION_HEALTH in ann:
            health = workload.parse_probe(ann[workload.ANNOTATION_HEALTH], workload.ANNOTATION_HEALTH)
        else:
            health = probemod.RunningProbe() if isinstance(r, probemod.DelayProbe) else r
        out[n] = podmod.Member(n, r, health)
    return out, notes


def describe(members: dict) -> str:
    """`name: probe` of each member, for a log line or an Event."""
    return ", ".join(f"{n or 'its one container'}: {m.ready}" for n, m in sorted(members.items())) or "none"

