"""The demo's workload: an inference-style HTTP server with a costly cold start.

Runs inside a runsc sandbox. At start it pays what real model servers pay:
heavy imports (boto3/botocore with its service models, grpc, much of the
standard library), building in-memory model state (a trigram language model
"trained" on a fixed-seed synthetic corpus, plus a block of fixed-seed
"weights"), and a warm-up. Nothing is downloaded. Then it serves:

  GET  /health  -> {"ok": true}
  POST /infer   {"prompt": "w1 w2", "n": 16} -> {"text": ..., "score": ...}
  GET  /state   -> {"boot_id", "requests", "model_digest", "startup_s"}

`boot_id` is random per process start and `requests` counts answered
requests, so a restored server proves it carries the saved state: same
boot_id, the counter continues, the model digest (recomputed from live
memory on every /state call) is unchanged.
"""
import os
import sys
import time

T0 = time.monotonic()

# -- heavy imports (what a real server's cold start spends seconds on) ------
import asyncio  # noqa: E402,F401
import decimal  # noqa: E402,F401
import email.mime.multipart  # noqa: E402,F401
import hashlib  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402,F401
import random  # noqa: E402
import sqlite3  # noqa: E402,F401
import ssl  # noqa: E402,F401
import tarfile  # noqa: E402,F401
import threading  # noqa: E402
import unittest  # noqa: E402,F401
import urllib.request  # noqa: E402,F401
import xml.etree.ElementTree  # noqa: E402,F401
import zipfile  # noqa: E402,F401
from array import array  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

import boto3  # noqa: E402
import grpc  # noqa: E402,F401

# botocore loads and parses the S3 service model (a multi-MB JSON) here.
boto3.session.Session().client("s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
                                aws_access_key_id="x", aws_secret_access_key="x")
IMPORTS_S = time.monotonic() - T0

MODEL_MB = int(os.environ.get("THAW_DEMO_MODEL_MB", "96"))
SEED = 20261129
VOCAB = [f"w{i}" for i in range(4096)]


def build_model(model_mb: int) -> tuple[dict, array]:
    rng = random.Random(SEED)
    # Zipf-ish corpus: low word ids are common, like real text.
    n_tokens = model_mb * 16_000
    weights = [1.0 / (i + 1) for i in range(len(VOCAB))]
    corpus = rng.choices(range(len(VOCAB)), weights=weights, k=n_tokens)
    table: dict = {}
    for a, b, c in zip(corpus, corpus[1:], corpus[2:]):
        nxt = table.get((a, b))
        if nxt is None:
            table[(a, b)] = {c: 1}
        else:
            nxt[c] = nxt.get(c, 0) + 1
    # "Weights": fixed-seed floats, half the model budget.
    n = (model_mb << 20) // 2 // 8
    w = array("d", bytes(8 * n))
    h = hashlib.blake2b(str(SEED).encode())
    for i in range(0, n, 4096):
        h.update(i.to_bytes(8, "little"))
        seed = int.from_bytes(h.digest()[:8], "little")
        r = random.Random(seed)
        for j in range(i, min(i + 4096, n)):
            w[j] = r.random()
    return table, w


def model_digest(table: dict, weights: array) -> str:
    h = hashlib.sha256()
    h.update(memoryview(weights).cast("B"))
    buf = []
    for k, v in table.items():
        buf.append(f"{k[0]},{k[1]}:{sorted(v.items())};")
        if len(buf) >= 4096:
            h.update("".join(buf).encode())
            buf.clear()
    h.update("".join(buf).encode())
    return h.hexdigest()


def infer(table: dict, weights: array, prompt: str, n: int) -> dict:
    ids = [int(t[1:]) for t in prompt.split() if t.startswith("w") and t[1:].isdigit()]
    ids = ([0, 0] + ids)[-2:]
    out = []
    score = 0.0
    for _ in range(max(1, min(n, 256))):
        nxt = table.get((ids[-2], ids[-1]))
        step = len(out)
        if nxt:  # greedy over counts re-weighted by the model's weights
            c = max(nxt, key=lambda t: (nxt[t] * (0.25 + weights[(t * 7919 + step) % len(weights)]), -t))
        else:
            c = (ids[-1] + 1) % len(VOCAB)
        score += weights[(c * 7919 + step) % len(weights)]
        out.append(c)
        ids.append(c)
    return {"text": " ".join(VOCAB[c] for c in out), "score": round(score, 9)}


TABLE, WEIGHTS = build_model(MODEL_MB)
BUILD_S = time.monotonic() - T0 - IMPORTS_S
for i in range(200):  # warm-up: exercise the hot paths once
    infer(TABLE, WEIGHTS, f"w{i} w{i + 1}", 16)
BOOT_ID = os.urandom(8).hex()
STARTUP_S = time.monotonic() - T0
STATE = {"requests": 0}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {"ok": True})
        elif self.path == "/state":
            with LOCK:
                n = STATE["requests"]
            self._send(200, {"boot_id": BOOT_ID, "requests": n, "model_digest": model_digest(TABLE, WEIGHTS),
                             "startup_s": STARTUP_S, "imports_s": IMPORTS_S, "build_s": BUILD_S,
                             "model_mb": MODEL_MB, "pid": os.getpid()})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/infer":
            self._send(404, {"error": "not found"})
            return
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            res = infer(TABLE, WEIGHTS, str(req.get("prompt", "")), int(req.get("n", 16)))
        except (ValueError, TypeError) as e:
            self._send(400, {"error": str(e)})
            return
        with LOCK:
            STATE["requests"] += 1
            res["request"] = STATE["requests"]
        self._send(200, res)


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    server.serve_forever()
