"""A small Kubernetes API server for functional tests: a real HTTPS server on a
TCP port of 127.0.0.1 (a CA and a certificate made per test), answering the
requests thawd makes (get a pod, create and patch an Event) with the API's
status codes, bearer-token authentication and a switch that makes it stop
answering. Not a fake client: thawd's kubeapi.Client talks to it over TLS."""
from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import ssl
import threading
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def make_tls(dirpath: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, server.crt, server.key) for 127.0.0.1."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "thaw-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = dirpath / "ca.crt", dirpath / "server.crt", dirpath / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class ApiServer:
    """pods: {(ns, name): pod}; events: {(ns, name): event}; requests: (method, path, token) seen;
    `tokens` accepted (empty: any); `down`: close connections unanswered; `delay_s` before answering;
    `forbid`: (method, resource) pairs answered 403."""

    def __init__(self, dirpath: Path, tokens: tuple[str, ...] = ("t0k3n",)) -> None:
        self.ca, cert, key = make_tls(dirpath)
        self.pods: dict[tuple[str, str], dict] = {}
        self.events: dict[tuple[str, str], dict] = {}
        self.requests: list[tuple[str, str, str]] = []
        self.tokens = set(tokens)
        self.down = False
        self.delay_s = 0.0
        self.forbid: set[tuple[str, str]] = set()
        self.lock = threading.Lock()
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, code: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _status(self, code: int, reason: str, msg: str) -> None:
                self._answer(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": msg,
                                    "reason": reason, "code": code})

            def _handle(self, method: str) -> None:
                if api.down:
                    self.close_connection = True
                    return
                time.sleep(api.delay_s)
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                with api.lock:
                    api.requests.append((method, self.path, token))
                if api.tokens and token not in api.tokens:
                    return self._status(401, "Unauthorized", "Unauthorized")
                parts = self.path.strip("/").split("/")
                # /api/v1/namespaces/<ns>/<resource>[/<name>]
                if parts[:3] != ["api", "v1", "namespaces"] or len(parts) not in (5, 6):
                    return self._status(404, "NotFound", f"no route {self.path}")
                ns, res, name = parts[3], parts[4], parts[5] if len(parts) == 6 else ""
                if (method, res) in api.forbid:
                    return self._status(403, "Forbidden", f"{res} is forbidden: thawd cannot {method.lower()} it")
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with api.lock:
                    if res == "pods" and method == "GET" and name:
                        pod = api.pods.get((ns, name))
                        return self._answer(200, pod) if pod else self._status(404, "NotFound",
                                                                               f'pods "{name}" not found')
                    if res == "events" and method == "POST" and not name:
                        n = body["metadata"]["name"]
                        if (ns, n) in api.events:
                            return self._status(409, "AlreadyExists", f'events "{n}" already exists')
                        api.events[(ns, n)] = body
                        return self._answer(201, body)
                    if res == "events" and method == "PATCH" and name:
                        ev = api.events.get((ns, name))
                        if ev is None:
                            return self._status(404, "NotFound", f'events "{name}" not found')
                        assert self.headers["Content-Type"] == "application/strategic-merge-patch+json"
                        ev.update(body)
                        return self._answer(200, ev)
                return self._status(405, "MethodNotAllowed", f"{method} {self.path}")

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PATCH(self):
                self._handle("PATCH")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def add_pod(self, ns: str, name: str, uid: str, containers: list[dict], init: list[dict] = ()) -> dict:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": ns, "name": name, "uid": uid},
               "spec": {"containers": containers, "initContainers": list(init), "nodeName": "node-a"}}
        with self.lock:
            self.pods[(ns, name)] = pod
        return pod

    def pod_events(self, ns: str, name: str) -> list[dict]:
        with self.lock:
            return [e for (n, _), e in sorted(self.events.items()) if n == ns and e["involvedObject"]["name"] == name]
