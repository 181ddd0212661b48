"""Network probes against a real HTTP server on loopback (no sandbox, no mark)."""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runsc_hooks import probe as h


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        routes = {"/health": (200, b"ok ready"), "/down": (503, b"draining"),
                  "/gpu": (200, json.dumps({"gpu": {"name": "fake", "sum": 42.0}}).encode()),
                  "/nogpu": (200, json.dumps({"gpu": None}).encode()), "/text": (200, b"not json")}
        if self.path == "/slow":
            time.sleep(1.0)
        status, body = routes.get(self.path, (404, b"no"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


T = h.Target(address="127.0.0.1")


def test_http_probe_checks_status_and_body(server):
    assert h.HttpProbe(server, "/health").attempt(T, 2) == "200"
    assert h.HttpProbe(server, "/health", body="ready").attempt(T, 2) == "200"
    assert h.HttpProbe(server, "/down", status=503).attempt(T, 2) == "503"
    with pytest.raises(h.ProbeFailed, match="answered 503, expected 200"):
        h.HttpProbe(server, "/down").attempt(T, 2)
    with pytest.raises(h.ProbeFailed, match="lacks 'llama'"):
        h.HttpProbe(server, "/health", body="llama").attempt(T, 2)


def test_gpu_probe_needs_the_gpu_field(server):
    assert h.GpuProbe(server, "/gpu").attempt(T, 2).startswith("gpu=")
    with pytest.raises(h.ProbeFailed, match="missing or false"):
        h.GpuProbe(server, "/nogpu").attempt(T, 2)
    with pytest.raises(h.ProbeFailed, match="did not answer JSON"):
        h.GpuProbe(server, "/text").attempt(T, 2)


def test_tcp_probe_and_refused_port(server):
    assert h.TcpProbe(server).attempt(T, 2) == "connected"
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(h.ProbeFailed, match="refused"):
        h.TcpProbe(free).attempt(T, 2)
    assert time.monotonic() - t0 < 1


def test_attempt_timeout_bounds_a_slow_answer(server):
    t0 = time.monotonic()
    with pytest.raises(h.ProbeFailed, match="timed out"):
        h.HttpProbe(server, "/slow").attempt(T, 0.2)
    assert time.monotonic() - t0 < 0.6


def test_check_passes_once_the_server_comes_up():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler, bind_and_activate=False)
    srv.allow_reuse_address = True

    def later():
        time.sleep(0.3)
        srv.server_bind()
        srv.server_activate()
        srv.serve_forever()
    threading.Thread(target=later, daemon=True).start()
    try:
        r = h.check([h.parse(f"http:{port}/health~ready")], T, h.Policy(timeout_s=5, attempt_timeout_s=0.5))
        assert r.healthy and r.probes[0].attempts > 1 and 0.25 < r.seconds < 3
    finally:
        srv.shutdown()
        srv.server_close()


class ChunkedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for part in (b"ok ", b"ready"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")


def test_http_request_decodes_a_chunked_body():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), ChunkedHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert h.http_request(T, srv.server_address[1], "/", 2) == (200, b"ok ready")
    finally:
        srv.shutdown()
        srv.server_close()


def _local_exec(without=()):
    """Stands in for `runsc exec` into an image lacking `without`: runs the argv here."""
    import subprocess
    import sys

    def run(argv, timeout_s):
        if argv[0] in without:
            return 127, f'exec: "{argv[0]}": executable file not found in $PATH'
        argv = [sys.executable if argv[0] == "python3" else argv[0], *argv[1:]]
        # As Runsc.exec's output comes: bytes decoded as UTF-8, newlines as they are.
        p = subprocess.run(argv, capture_output=True, timeout=timeout_s)
        return p.returncode, (p.stdout + p.stderr).decode(errors="replace")
    return run


def test_http_probe_without_an_address_runs_inside_the_sandbox(server):
    inside = h.Target(exec=_local_exec())
    assert h.HttpProbe(server, "/health", body="ready").attempt(inside, 2) == "200"
    assert h.HttpProbe(server, "/down", status=503).attempt(inside, 2) == "503"


def test_in_sandbox_get_falls_back_to_wget_without_python3(server):
    import shutil
    assert shutil.which("wget"), "wget is needed to test the fallback for images without python3"
    inside = h.Target(exec=_local_exec(without=("python3",)))
    assert h.HttpProbe(server, "/health", body="ready").attempt(inside, 2) == "200"
    with pytest.raises(h.ProbeFailed, match="from inside the sandbox failed"):
        h.HttpProbe(server, "/down", status=503).attempt(inside, 2)  # wget cannot say which status
    with pytest.raises(h.ProbeFailed, match="POST .* from inside the sandbox failed .*127"):
        h.http_request(inside, server, "/health", 2, method="POST")  # wget only GETs here
