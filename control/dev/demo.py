"""The demo: cold start vs restore of a real model server in a runsc sandbox.

1. run the demo server (control/dev/workloads/demo_server.py) in a sandbox and
   time it to its first correct answer (cold start);
2. send a few requests, read its state (boot id, request counter, a digest
   of its in-memory model recomputed from live memory);
3. checkpoint it into a new image directory (the sandbox exits), delete it;
4. restore the image under a new id and time it to its first correct answer;
5. verify: same boot id, the request counter continues, the model digest is
   unchanged, and the answer equals the cold server's.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import sys
import time
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from control import config as configmod
from control.config import Settings
from control.errors import ThawError, Timeout
from control.lifecycle.sandbox import Sandboxes
from runsc_hooks import spec as specmod

WORKLOAD = Path(__file__).resolve().parent / "workloads" / "demo_server.py"
PORT = 8080
PROMPT = {"prompt": "w17 w42", "n": 24}
DEFAULT_MODEL_MB = 128


def http_json(host: str, method: str, path: str, body: dict | None = None, timeout: float = 10.0) -> dict:
    conn = http.client.HTTPConnection(host, PORT, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status != 200:
            raise ThawError(f"{method} {path} answered {resp.status}: {payload[:200]!r}")
        return json.loads(payload)
    finally:
        conn.close()


def first_answer(host: str, deadline_s: float) -> tuple[dict, float]:
    """Poll POST /infer until it answers; (answer, seconds waited)."""
    t0 = time.monotonic()
    while True:
        try:
            return http_json(host, "POST", "/infer", PROMPT, timeout=5.0), time.monotonic() - t0
        except (OSError, http.client.HTTPException, socket.timeout):
            if time.monotonic() - t0 > deadline_s:
                raise Timeout(f"demo server at {host}:{PORT} answering", deadline_s) from None
            time.sleep(0.01)


def demo_spec(settings: Settings, sid: str, model_mb: int) -> dict:
    python = sys.executable
    rootfs = specmod.prepare_host_rootfs(settings.state_dir / "rootfs" / sid)
    binds = [sys.prefix, sys.base_prefix, str(configmod.REPO_ROOT), str(WORKLOAD.parent)]
    return specmod.command_spec(
        [python, str(WORKLOAD), str(PORT)], rootfs=str(rootfs),
        env={"THAW_DEMO_MODEL_MB": str(model_mb), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"},
        extra_mounts=specmod.host_layout(binds), hostname="thaw-demo")


class Steps(Protocol):
    """What the demo reports its steps to (the CLI's control/cli/progress.py Progress)."""

    def step(self, what: str) -> AbstractContextManager: ...


def run(settings: Settings, progress: Steps, keep: bool = False, model_mb: int | None = None) -> dict:
    model_mb = model_mb or DEFAULT_MODEL_MB
    sb = Sandboxes(settings)
    tag = uuid.uuid4().hex[:6]
    cold_id, warm_id = f"thaw-demo-{tag}-cold", f"thaw-demo-{tag}-restored"
    work = settings.state_dir / "demo"
    work.mkdir(parents=True, exist_ok=True)
    image = work / f"image-{tag}"
    result: dict = {"model_mb": model_mb, "verified": False, "image": str(image)}
    try:
        with progress.step("cold start: run the model server in a sandbox"):
            t0 = time.monotonic()
            sb.run(cold_id, demo_spec(settings, cold_id, model_mb))
            host = sb.address(cold_id)
            cold_answer, _ = first_answer(host, 300)
            result["cold_start_s"] = round(time.monotonic() - t0, 3)
        for _ in range(4):
            http_json(host, "POST", "/infer", PROMPT)
        before = http_json(host, "GET", "/state")
        result["in_sandbox_startup_s"] = round(before["startup_s"], 3)
        with progress.step("checkpoint the warm sandbox"):
            ck = sb.checkpoint(cold_id, image)
        result["checkpoint_s"] = round(ck.seconds, 3)
        result["image_bytes"] = ck.image_bytes
        with progress.step("restore it under a new id, to its first answer"):
            t0 = time.monotonic()
            rs = sb.restore(image, warm_id)
            warm_answer, _ = first_answer(rs.sandbox_ip or host, 60)
            result["restore_s"] = round(time.monotonic() - t0, 3)
            result["runsc_restore_s"] = round(rs.seconds, 3)
        after = http_json(rs.sandbox_ip or host, "GET", "/state")
        checks = {
            "same_process": after["boot_id"] == before["boot_id"],
            "counter_continues": warm_answer["request"] == before["requests"] + 1 and
            after["requests"] == before["requests"] + 1,
            "model_digest_equal": after["model_digest"] == before["model_digest"],
            "answer_equal": {k: warm_answer[k] for k in ("text", "score")} ==
            {k: cold_answer[k] for k in ("text", "score")},
        }
        result["checks"] = checks
        result["requests_before"] = before["requests"]
        result["requests_after"] = after["requests"]
        result["model_digest"] = before["model_digest"]
        result["verified"] = all(checks.values())
        result["speedup"] = round(result["cold_start_s"] / result["restore_s"], 2)
    finally:
        for sid in (cold_id, warm_id):
            if sb.get(sid) is not None:
                sb.delete(sid, force=True)
            shutil.rmtree(settings.state_dir / "rootfs" / sid, ignore_errors=True)
        if not keep:
            shutil.rmtree(image, ignore_errors=True)
    return result


def table(r: dict) -> str:
    rows = [
        ("cold start to first answer", f"{r['cold_start_s']:.2f} s"),
        ("checkpoint", f"{r['checkpoint_s']:.2f} s"),
        ("image size", f"{r['image_bytes'] / 1e6:.1f} MB"),
        ("restore to first answer", f"{r['restore_s']:.2f} s"),
        ("speedup", f"{r['speedup']:.1f}x"),
        ("restored state verified", "yes" if r["verified"] else f"NO: {r.get('checks')}"),
    ]
    w = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)
