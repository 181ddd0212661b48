"""thawd's Kubernetes API client: the few requests it makes (get a pod, create and
patch an Event) over the standard library's http.client and ssl, no client library.

Where the API server is and who thawd is there, as client-go's rest.InClusterConfig
and clientcmd decide it:
- in a pod (the chart's DaemonSet): the service account's files the kubelet mounts,
  `token` and `ca.crt` under SA_DIR, and the server from KUBERNETES_SERVICE_HOST/PORT
  (config.kubernetes_service). The token is projected and bound to the pod; the kubelet
  rotates it, so it is read again every TOKEN_REREAD_S (client-go's
  transport.NewCachedFileTokenSource does the same each minute);
- outside one: `kubernetes.kubeconfig`, its current context (server, CA, a token, a
  token file or a client certificate; exec and auth-provider plugins are refused with
  the reason);
- `kubernetes.server` overrides the server of either.

Every failure is an ApiError naming the request, its HTTP status (0: none came back)
and the server. Requests are bounded by `kubernetes.timeout_s`; callers on a
container's path (control/thawd/podspecs.py) fall back when one fails, and Events go
through a worker thread (control/thawd/events.py).
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import ssl
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

from control import config
from control.errors import ApiError, ConfigError

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0
MAX_RESPONSE_BYTES = 4 << 20     # a pod with a large spec is well below (etcd's object limit is 1.5 MiB)


class Client:
    """Requests to one API server. `token_file` is re-read every TOKEN_REREAD_S;
    `token` is fixed; with neither, the TLS client certificate of `context` authenticates."""

    def __init__(self, server: str, context: ssl.SSLContext | None, token: str = "",
                 token_file: Path | None = None, timeout_s: float = 1.0) -> None:
        u = urllib.parse.urlsplit(server)
        if u.scheme not in ("https", "http") or not u.hostname:
            raise ConfigError("kubernetes.server", f"{server!r} is not an http(s)://host[:port] URL")
        self.server = server.rstrip("/")
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port or (443 if self._https else 80)
        self._base = u.path.rstrip("/")
        self._context = context
        self._token, self._token_file, self._token_read = token, token_file, 0.0
        self.timeout_s = timeout_s
        self._lock = threading.Lock()

    # -- the requests thawd makes ------------------------------------------------

    def get_pod(self, namespace: str, name: str, timeout_s: float | None = None) -> dict:
        return self.request("GET", f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}", op="get pod",
                            timeout_s=timeout_s)

    def create_event(self, namespace: str, event: dict) -> dict:
        return self.request("POST", f"/api/v1/namespaces/{_seg(namespace)}/events", event, op="create event")

    def patch_event(self, namespace: str, name: str, patch: dict) -> dict:
        """A strategic merge patch, as client-go's EventSink.Patch sends a repeat's count."""
        return self.request("PATCH", f"/api/v1/namespaces/{_seg(namespace)}/events/{_seg(name)}", patch,
                            op="patch event", content_type="application/strategic-merge-patch+json")

    # -- the one choke point -----------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, *, op: str = "",
                content_type: str = "application/json", timeout_s: float | None = None) -> dict:
        """One request; the decoded JSON answer of a 2xx, else ApiError with the status and
        the API's own message (a metav1.Status)."""
        op = op or f"{method} {path}"
        headers = {"Accept": "application/json", "User-Agent": "thawd"}
        token = self._bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        t = self.timeout_s if timeout_s is None else timeout_s
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=t, context=self._context)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=t)
        try:
            conn.request(method, self._base + path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read(MAX_RESPONSE_BYTES + 1)
        except (OSError, http.client.HTTPException) as e:   # refused, timed out, TLS, a broken answer
            raise ApiError(op, f"{type(e).__name__}: {e}", 0, self.server) from None
        finally:
            conn.close()
        if len(raw) > MAX_RESPONSE_BYTES:
            raise ApiError(op, f"answer larger than {MAX_RESPONSE_BYTES} bytes", resp.status, self.server)
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = None
        if not 200 <= resp.status < 300:
            msg = doc.get("message") if isinstance(doc, dict) else ""
            raise ApiError(op, f"{resp.status} {resp.reason}: {msg or raw[:200].decode(errors='replace')}",
                           resp.status, self.server)
        if not isinstance(doc, dict):
            raise ApiError(op, f"not a JSON object: {raw[:80]!r}", resp.status, self.server)
        return doc

    def _bearer(self) -> str:
        if self._token_file is None:
            return self._token
        with self._lock:
            if time.monotonic() - self._token_read >= TOKEN_REREAD_S or not self._token:
                try:
                    self._token = self._token_file.read_text().strip()
                except OSError as e:
                    if not self._token:
                        raise ApiError("read token", f"{self._token_file}: {e.strerror or e}") from None
                self._token_read = time.monotonic()
            return self._token


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def from_settings(settings, environ: Mapping[str, str] | None = None, sa_dir: Path = SA_DIR) -> Client:
    """The client `settings` describe (module docstring); ConfigError naming the key when
    neither a kubeconfig nor a pod's service account says where the API server is."""
    if settings.kubernetes_kubeconfig is not None:
        return from_kubeconfig(Path(settings.kubernetes_kubeconfig), settings.kubernetes_server,
                               settings.kubernetes_timeout_s)
    server = settings.kubernetes_server or config.kubernetes_service(environ)
    token = sa_dir / "token"
    if not server or not token.is_file():
        raise ConfigError("kubernetes.kubeconfig", f"not in a pod (no KUBERNETES_SERVICE_HOST or no {token}) and "
                          "no kubeconfig: thawd does not know where the API server is")
    ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt")) if (sa_dir / "ca.crt").is_file() else None
    return Client(server, ctx, token_file=token, timeout_s=settings.kubernetes_timeout_s)


def from_kubeconfig(path: Path, server: str = "", timeout_s: float = 1.0) -> Client:
    """The client of a kubeconfig's current context (`server` overrides its cluster's)."""
    import yaml   # a dependency already (CDI specs); here only, so thawd without a kubeconfig never loads it
    key = "kubernetes.kubeconfig"
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(key, f"{path}: {getattr(e, 'strerror', None) or e}") from None

    def named(kind: str, name: str) -> dict:
        for item in doc.get(kind + "s") or []:
            if item.get("name") == name:
                return item.get(kind) or {}
        raise ConfigError(key, f"{path}: no {kind} {name!r}")

    ctx_name = doc.get("current-context") or ""
    if not ctx_name:
        raise ConfigError(key, f"{path}: no current-context")
    ctx = named("context", ctx_name)
    cluster, user = named("cluster", ctx.get("cluster", "")), named("user", ctx.get("user", ""))
    if user.get("exec") or user.get("auth-provider"):
        raise ConfigError(key, f"{path}: user {ctx.get('user')!r} authenticates through a plugin (exec or "
                          "auth-provider), which thawd does not run: give it a token, a tokenFile or a client "
                          "certificate")
    here = path.parent

    def file_of(field: str, data_field: str, where: dict, tmp: Path) -> str | None:
        if where.get(data_field):
            f = tmp / field
            f.write_bytes(base64.b64decode(where[data_field]))
            return str(f)
        return str(here / where[field]) if where.get(field) else None

    url = server or cluster.get("server") or ""
    context = None
    if url.startswith("https"):
        tmp = Path(tempfile.mkdtemp(prefix="thawd-kubeconfig-"))   # 0700: the key lives there a moment
        try:
            ca = file_of("certificate-authority", "certificate-authority-data", cluster, tmp)
            context = ssl.create_default_context(cafile=ca)
            if cluster.get("insecure-skip-tls-verify"):
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            cert = file_of("client-certificate", "client-certificate-data", user, tmp)
            if cert:
                context.load_cert_chain(cert, file_of("client-key", "client-key-data", user, tmp))
        except (OSError, ssl.SSLError, ValueError) as e:
            raise ConfigError(key, f"{path}: {e}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    token_file = user.get("tokenFile")
    return Client(url, context, token=user.get("token") or "",
                  token_file=here / token_file if token_file else None, timeout_s=timeout_s)


def node_name(settings) -> str:
    """This node's name in Kubernetes: kubernetes.node_name, else the host name as the
    kubelet defaults it (lower case: kubelet's nodeutil.GetHostname)."""
    return settings.kubernetes_node_name or os.uname().nodename.lower()
