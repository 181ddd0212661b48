"""The inference server of the GPU benchmark; runs inside a runsc sandbox.

Loads a causal LM with `from_pretrained(--model-dir, dtype=float16)` straight
onto the device, warms it up, and answers one request: greedy decoding of a
fixed prompt (fixed token ids; no tokenizer), returning the new token ids and
a SHA-256 digest of the logits of every decoding step, so "the answer after
restore is bit-identical to the one before" is one string comparison.

Two doors to the same handler (bench/gpu/README.md says why):
- HTTP on --port: GET /health, GET /gpu (a small computation on the device;
  the JSON field "gpu" names it: the `gpu:PORT/gpu` probe of
  runsc_hooks/probe.py), POST /generate, and the workload profiles'
  hooks (control/lifecycle/profiles.py): POST /thaw/pre-checkpoint (pytorch:
  release cached GPU memory, end torch.compile's worker processes), POST
  /thaw/offload-weights[?mode=register|alloc|staged|drop] before the checkpoint and
  POST /thaw/restore-weights after the restore (pytorch-offload: the weights
  leave the GPU before the checkpoint and come back at pinned-copy speed;
  bench/gpu/offload.py);
- a spool directory (--spool, a bind mount shared with the driver): the driver
  writes `<id>.req` (JSON {"op": "health"|"generate"|"pre-checkpoint"|
  "offload-weights"|"restore-weights", "mode": ...}), the server answers with
  `<id>.resp` (written to a temp name, then renamed) and removes the request.
  This needs no network, and bind mounts work across checkpoint/restore (the
  GPU smoke used one).

A failing operation answers {"error": ...} (HTTP 500), and the server goes on.
`generate` while the weights are off the GPU is such an error: the
post-restore hook has to bring them back first.

`--backend fake` answers from a hash of the model directory instead of a
model: the same protocol without torch, for tests on machines without it.
Only the standard library is imported before the backend is chosen.
"""
from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import socketserver
import sys
import threading
import time
import urllib.parse
from pathlib import Path

BOOT = os.urandom(8).hex()        # a restored process keeps it; a fresh start gets a new one
T0 = time.time()
NONCE = "nonce"                  # twin: bench/gpu/channels.py NONCE
POLL_S = 0.002                    # spool poll interval: bounds the channel's added latency


class FakeBackend:
    """Deterministic answers without torch: a hash chain over the model files."""

    def __init__(self, model_dir: str, prompt: list[int], new_tokens: int) -> None:
        h = hashlib.sha256()
        for name in sorted(os.listdir(model_dir)):
            with open(os.path.join(model_dir, name), "rb") as f:
                h.update(f.read())
        self.seed = h.digest()
        self.model_dir, self.prompt, self.new_tokens = model_dir, prompt, new_tokens
        self.offloaded: str | None = None
        self.host: bytes | None = None
        self.state = bytearray(4 << 20)   # some memory for the checkpoint to carry
        self.state[::4096] = self.seed[:1] * len(self.state[::4096])

    def generate(self) -> dict:
        if self.offloaded:
            raise RuntimeError("the weights are off the device: POST /thaw/restore-weights first")
        h = hashlib.sha256(self.seed + bytes(self.state[::4096][:64]))
        tokens = []
        for _ in range(self.new_tokens):
            h = hashlib.sha256(h.digest())
            tokens.append(int.from_bytes(h.digest()[:4], "big") % 50257)
        return {"tokens": tokens, "digest": h.hexdigest(), "finite": True}

    def release(self) -> dict:
        return {"released_bytes": 0, "compile_workers_ended": end_compile_workers()}

    # The weights' round trip (pytorch-offload), on the fake's state: "host"
    # keeps a copy, "drop" recomputes it from the model files.
    def offload(self, mode: str) -> dict:
        if mode not in ("register", "alloc", "staged", "drop"):   # twin: bench/gpu/offload.py MODES
            raise ValueError(f"unknown offload mode {mode!r}")
        if self.offloaded:
            raise RuntimeError(f"the weights are already off the device (mode {self.offloaded})")
        self.host = None if mode == "drop" else bytes(self.state)
        self.state = bytearray(len(self.state))
        self.offloaded = mode
        return {"mode": mode, "bytes": len(self.state)}

    def restore_weights(self) -> dict:
        if not self.offloaded:
            return {"restored": False, "why": "the weights are on the device"}
        t = time.time()
        if self.host is None:
            self.state = FakeBackend(self.model_dir, self.prompt, self.new_tokens).state
        else:
            self.state = bytearray(self.host)
        mode, self.offloaded = self.offloaded, None
        return {"restored": True, "mode": mode, "bytes": len(self.state), "seconds": round(time.time() - t, 4)}

    def weights(self) -> str:
        return "device" if not self.offloaded else ("dropped" if self.host is None else "host")

    def gpu(self) -> dict:
        # The fake GPU of CPU rehearsals (bench/gpu/node.py and lifecycle.py
        # on CPU): the same route and probe, answered without a device.
        return {"gpu": "fake", "fake": True, "value": self.seed[0]}

    def info(self) -> dict:
        return {"backend": "fake"}


class TorchBackend:
    def __init__(self, model_dir: str, device: str, prompt: list[int], new_tokens: int) -> None:
        t = time.time()
        import torch
        from transformers import AutoModelForCausalLM
        self.timings = {"import_s": time.time() - t}
        self.torch = torch
        self.device = device
        dtype = torch.float16 if device == "cuda" else torch.float32
        t = time.time()
        # Straight onto the device: no second copy in the caching allocator
        # (docs/notes/h200-facts.md: load_state_dict into a model built on the GPU
        # doubled the memory in use).
        try:
            import accelerate  # noqa: F401  (device_map needs it; the H200 image has it)
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=device)
            self.timings["loaded_via_device_map"] = 1
        except ImportError:
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
            self.timings["loaded_via_device_map"] = 0
        self.model.eval()
        if device == "cuda":
            torch.cuda.synchronize()
        self.timings["load_s"] = time.time() - t
        from offload import Stash   # bench/gpu/offload.py, beside this file
        self.stash = Stash(self.model, device, sorted(Path(model_dir).glob("*.safetensors")))
        self.prompt = torch.tensor([prompt], dtype=torch.long, device=device)
        self.new_tokens = new_tokens
        t = time.time()
        for _ in range(3):
            self.generate()
        self.timings["warmup_s"] = time.time() - t

    def generate(self) -> dict:
        """The request: `new_tokens` greedy steps. Its `timing` splits the
        server's time: `cuda_wait_s`, the first device call (a request that
        arrives while runsc is still restoring the CUDA state waits here until
        the process is unlocked), then all steps and each (what the request
        itself costs after a restore, vs a warm server's)."""
        if self.stash.mode is not None:
            raise RuntimeError("the weights are off the device: POST /thaw/restore-weights first")
        torch = self.torch
        h = hashlib.sha256()
        tokens = []
        finite = True
        t0 = time.perf_counter()
        if self.device == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        steps = []
        with torch.inference_mode():
            ids, past = self.prompt, None
            for _ in range(self.new_tokens):
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                logits = out.logits[:, -1, :]
                past = out.past_key_values
                finite = finite and bool(torch.isfinite(logits).all())
                h.update(logits.float().cpu().numpy().tobytes())
                ids = logits.argmax(dim=-1, keepdim=True)
                tokens.append(int(ids[0, 0]))
                steps.append(time.perf_counter())
        return {"tokens": tokens, "digest": h.hexdigest(), "finite": finite,
                "timing": {"cuda_wait_s": round(t1 - t0, 6), "steps_s": round(steps[-1] - t1, 6) if steps else 0.0,
                           "each_step_s": [round(b - a, 5) for a, b in zip([t1, *steps], steps)]}}

    def release(self) -> dict:
        """Give cached-but-unused device memory back before a checkpoint."""
        import gc
        torch = self.torch
        workers = end_compile_workers()
        if self.device != "cuda":
            gc.collect()
            return {"released_bytes": 0, "compile_workers_ended": workers}
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        after = torch.cuda.memory_reserved()
        return {"released_bytes": before - after, "reserved_bytes": after,
                "allocated_bytes": torch.cuda.memory_allocated(), "compile_workers_ended": workers}

    def offload(self, mode: str) -> dict:
        return self.stash.offload(mode)

    def restore_weights(self) -> dict:
        return self.stash.restore()

    def weights(self) -> str:
        return self.stash.state()

    def gpu(self) -> dict:
        """A computation on the device, and which device answered (the probe's
        proof that the GPU works after a restore, and on which GPU): its name
        and UUID as CUDA sees them."""
        torch = self.torch
        x = torch.arange(1024, dtype=torch.float32, device=self.device)
        value = float((x * x).sum().item())
        if self.device != "cuda":
            return {"gpu": "cpu", "value": value}
        props = torch.cuda.get_device_properties(0)
        uuid = str(getattr(props, "uuid", ""))
        return {"gpu": props.name, "uuid": f"GPU-{uuid}" if uuid else "", "value": value}

    def info(self) -> dict:
        d = {"backend": "transformers", "device": self.device, **{k: round(v, 3) for k, v in self.timings.items()},
             "params": sum(p.numel() for p in self.model.parameters())}
        if self.device == "cuda":
            d.update(gpu=self.torch.cuda.get_device_name(0), allocated_bytes=self.torch.cuda.memory_allocated(),
                     reserved_bytes=self.torch.cuda.memory_reserved())
        return d


def end_compile_workers() -> int:
    """End torch.compile's compile-worker processes (torch._inductor's
    subprocess pool), if any were started: they hold no state the server
    needs, but a checkpoint would save each of them (a torch.compile'd server's
    image was ~9x that of the same model with CUDA graphs: docs/notes/gvisor-facts.md).
    Inductor starts a new pool when it compiles again. Returns how many of this
    process's children went away."""
    mod = sys.modules.get("torch._inductor.async_compile")
    if mod is None or not hasattr(mod, "shutdown_compile_workers"):
        return 0
    pools = len(getattr(mod, "_pool_set", ()) or ())
    before = _children()
    mod.shutdown_compile_workers()
    deadline = time.time() + 10
    # The pool's shutdown may return before its processes are gone.
    while pools and before and _children() >= before and time.time() < deadline:
        time.sleep(0.05)
    return len(before - _children())


def _children() -> set[int]:
    out: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                out.update(int(x) for x in f.read().split())
    except OSError:
        pass
    return out


class Server:
    OPS = ("health", "gpu", "generate", "pre-checkpoint", "offload-weights", "restore-weights")

    def __init__(self, backend) -> None:
        self.backend = backend
        self.lock = threading.Lock()     # one forward pass at a time

    def handle(self, op: str, args: dict | None = None) -> dict:
        args = args or {}
        t = time.time()
        if op not in self.OPS:
            return {"error": f"unknown op {op!r}", "boot": BOOT}
        with self.lock:
            try:
                if op == "health":
                    out = {"ok": True, "weights": self.backend.weights()}
                elif op == "generate":
                    out = self.backend.generate()
                elif op == "pre-checkpoint":
                    out = self.backend.release()
                elif op == "gpu":
                    out = self.backend.gpu()
                elif op == "offload-weights":
                    out = self.backend.offload(str(args.get("mode") or "register"))
                else:
                    out = self.backend.restore_weights()
            except Exception as e:  # noqa: BLE001 - the caller gets the error; the server goes on
                out = {"error": f"{type(e).__name__}: {e}"}
        out.update(boot=BOOT, pid=os.getpid(), server_s=round(time.time() - t, 6), t=time.time())
        return out


def serve_http(server: Server, port: int) -> http.server.ThreadingHTTPServer:
    routes = {("GET", "/health"): "health", ("GET", "/gpu"): "gpu", ("POST", "/generate"): "generate",
              ("POST", "/thaw/pre-checkpoint"): "pre-checkpoint",
              ("POST", "/thaw/offload-weights"): "offload-weights",
              ("POST", "/thaw/restore-weights"): "restore-weights"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _do(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            path, _, query = self.path.partition("?")
            op = routes.get((self.command, path))
            args = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
            body = server.handle(op, args) if op else {"error": f"no route {self.command} {self.path}"}
            data = json.dumps(body).encode()
            self.send_response(404 if not op else 500 if "error" in body else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _do

        def log_message(self, *args) -> None:
            pass

    class Httpd(http.server.ThreadingHTTPServer):
        def server_bind(self) -> None:
            # HTTPServer.server_bind asks socket.getfqdn(), a DNS lookup that
            # waits ~10 s for a resolver a sandbox without a route out never reaches.
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = "thaw-bench", self.server_address[1]

    httpd = Httpd(("0.0.0.0", port), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True).start()
    return httpd


def serve_spool(server: Server, spool: str) -> None:
    while True:
        try:
            names = sorted(n for n in os.listdir(spool) if n.endswith(".req"))
        except FileNotFoundError:
            names = []
        for name in names:
            path = os.path.join(spool, name)
            try:
                with open(path) as f:
                    req = json.load(f)
            except (OSError, ValueError):
                continue   # half-written or already taken
            os.unlink(path)
            # What the driver wrote into this spool just before the request, read now: only a
            # process that sees this directory can report it (bench/gpu/channels.py FileChannel).
            try:
                with open(os.path.join(spool, NONCE)) as f:
                    nonce = f.read()
            except OSError as e:
                nonce = f"unreadable: {e.strerror}"
            resp = server.handle(str(req.get("op", "")), {k: v for k, v in req.items() if k != "op"})
            resp["spool_nonce"] = nonce
            out = os.path.join(spool, name[:-4] + ".resp")
            with open(out + ".partial", "w") as f:
                json.dump(resp, f)
            os.rename(out + ".partial", out)
        time.sleep(POLL_S)


def fixed_prompt(length: int) -> list[int]:
    """The request's prompt: token ids 1, 8, 15, ... below 998 (inside every vocabulary here)."""
    return [(7 * i) % 997 + 1 for i in range(length)]


def emit(events: str, **kv) -> None:
    kv["t"] = time.time()
    with open(events, "a") as f:
        f.write(json.dumps(kv) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--backend", choices=("transformers", "fake"), default="transformers")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--spool", required=True)
    ap.add_argument("--events", required=True)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--log", help="append stdout and stderr (C libraries' too) to this file")
    args = ap.parse_args()
    if args.log:
        fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    prompt = fixed_prompt(args.prompt_len)
    emit(args.events, event="starting", boot=BOOT, pid=os.getpid())
    try:
        # A line on stdout at start, as every real server logs one: a container whose stdout
        # cannot be written (`ctr run --null-io` under runsc: EBADF, docs/gvisor-notes.md)
        # fails here on CPU too, not only where a GPU library happens to print.
        print(f"server: pid {os.getpid()} boot {BOOT} backend {args.backend} on {args.device}", flush=True)
        if args.backend == "fake":
            backend = FakeBackend(args.model_dir, prompt, args.new_tokens)
        else:
            backend = TorchBackend(args.model_dir, args.device, prompt, args.new_tokens)
    except Exception as e:  # noqa: BLE001 - reported to the driver, then fatal
        emit(args.events, event="error", boot=BOOT, error=f"{type(e).__name__}: {e}")
        raise
    server = Server(backend)
    serve_http(server, args.port)
    emit(args.events, event="ready", boot=BOOT, pid=os.getpid(), startup_s=round(time.time() - T0, 3),
         **backend.info())
    serve_spool(server, args.spool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
