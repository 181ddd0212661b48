"""A server whose worth is its memory: MB of seeded random bytes, for the
streamed-restore tests and benchmark (tests/integration/test_stream.py,
bench/stream.py). A restored copy must hand back exactly the bytes the
original held, which this server can prove from live memory:

  GET /ping -> {"boot", "mb", "digest"}   boot id (random per start) and the
               SHA-256 of the block taken at start, both kept in memory;
               touches only the interpreter's own pages (a first answer)
  GET /sum  -> {"boot", "digest"}          SHA-256 of the block recomputed
               now: every page of it read, so the restore must have loaded
               all of it, right

argv: PORT MB [SEED]
"""
import hashlib
import json
import os
import random
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MB = int(sys.argv[1]), int(sys.argv[2])
SEED = int(sys.argv[3]) if len(sys.argv) > 3 else 18
rng = random.Random(SEED)
BLOCK = [bytearray(rng.randbytes(1 << 20)) for _ in range(MB)]


def digest() -> str:
    h = hashlib.sha256()
    for piece in BLOCK:
        h.update(piece)
    return h.hexdigest()


DIGEST = digest()
BOOT = os.urandom(8).hex()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/ping":
            body = {"boot": BOOT, "mb": MB, "digest": DIGEST}
        elif self.path == "/sum":
            body = {"boot": BOOT, "digest": digest()}
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
server.daemon_threads = True
server.serve_forever()
