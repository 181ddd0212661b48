"""What the streamed-restore tests share (tests/integration/test_stream.py,
tests/integration/faults/test_stream_faults.py): a real runsc checkpoint of
control/dev/workloads/memory_server.py published to a real SeaweedFS through
the CLI, and the CLI environment that restores it from there."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from control import config
from tests.conftest import REPO
from tests.integration.conftest import THAW, cli_env, thaw_env

WORKLOAD = REPO / "control" / "dev" / "workloads" / "memory_server.py"
PORT = 8080


def env_for(base: Path, s: config.Settings, **extra) -> dict[str, str]:
    """A `thaw` subprocess's environment: sandboxes under `base`, the store and cache of `s`."""
    env = thaw_env(base) | cli_env(s)
    env.update({"THAW_STORE_GOFER": str(s.store_gofer), "THAW_STORE_RETRIES": str(s.store_retries)})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(THAW), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def start(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(THAW), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)


def get(host: str, path: str, timeout: float = 2.0) -> dict:
    with urllib.request.urlopen(f"http://{host}:{PORT}{path}", timeout=timeout) as r:
        return json.loads(r.read())


class NoAnswer(OSError):
    """first_answer gave up: what it saw, for the failure message."""


def first_answer(host: str, deadline_s: float, restoring: subprocess.Popen | None = None) -> tuple[dict, float]:
    """The first /ping answer and how long it took (50 ms connect timeouts, as docs/notes/2026-11-30-stream-restore.md).
    With `restoring` (the `thaw restore` that should make the answer), it stops as soon as
    that command failed: nothing will answer then. NoAnswer says which errors came, how
    often, first and last (seconds from the start): EHOSTUNREACH alone means nothing was
    plumbed at the address (the subnet's unreachable route); timeouts, a closed gate."""
    t0 = time.monotonic()
    seen: dict[str, list] = {}
    while True:
        try:
            return get(host, "/ping", 0.5), time.monotonic() - t0
        except OSError as e:
            why = getattr(e, "reason", e)
            key = f"HTTP {e.code}" if isinstance(e, urllib.error.HTTPError) else \
                errno.errorcode.get(getattr(why, "errno", None) or 0) or \
                (why if isinstance(why, str) else type(why).__name__)
            t = round(time.monotonic() - t0, 2)
            seen.setdefault(key, [0, t, t])[0] += 1
            seen[key][2] = t
            failed = restoring is not None and restoring.poll() not in (None, 0)
            if failed or time.monotonic() - t0 > deadline_s:
                raise NoAnswer(f"no answer from {host} in {t} s"
                               + (f" (thaw restore exited {restoring.returncode})" if failed else "")
                               + "; errors (count, first s, last s): "
                               + ", ".join(f"{k} {v}" for k, v in seen.items())) from e
            time.sleep(0.02)


def publish(env: dict, key: str, sid: str, mb: int, work: Path) -> dict:
    """Run the memory server (MB of seeded random bytes) in a sandbox, checkpoint it
    (the sandbox goes), push the image under `key`; its /ping answer and address."""
    r = run(env, "run", "--id", sid, "--json", "--bind", str(WORKLOAD.parent), "--bind", str(REPO / ".venv"),
            "--bind", sys.base_prefix, "--probe", f"http:{PORT}/ping", "--",
            str(REPO / ".venv" / "bin" / "python"), str(WORKLOAD), str(PORT), str(mb))
    assert r.returncode == 0, r.stderr
    host = json.loads(r.stdout)["address"]
    before, _ = first_answer(host, 240)
    image = work / f"{sid}-image"
    r = run(env, "checkpoint", sid, "--out", str(image))
    assert r.returncode == 0, r.stderr
    # --allow-node-local: the bind mounts are this machine's paths, and every "node" here is this machine
    r = run(env, "push", str(image), "--key", key, "--no-cache", "--allow-node-local", "--json")
    assert r.returncode == 0, r.stderr
    subprocess.run(["rm", "-rf", str(image)], check=True)
    return {**before, "host": host}


def cache_state(cache_dir: Path, key: str) -> dict:
    """What the node cache holds for `key`: ready entries (index rows), partial
    directories, streamed-restore directories."""
    import sqlite3
    db = cache_dir / "index.sqlite"
    rows = []
    if db.exists():
        c = sqlite3.connect(db)
        try:
            rows = [r[0] for r in c.execute("SELECT id FROM entries WHERE key = ? AND state = 'ready'", (key,))]
        finally:
            c.close()
    return {"ready": rows,
            "partials": sorted(p.name for p in (cache_dir / "tmp").glob(f"{key}@*")) if (cache_dir / "tmp").exists()
            else [],
            "streams": sorted(p.name for p in (cache_dir / "streams").glob(f"{key}@*"))
            if (cache_dir / "streams").exists() else []}


def gofer_logs(base: Path) -> str:
    return "".join(p.read_text() for p in sorted((base / "log" / "streams").glob("*.gofer.log")))


def wait_for(pred, timeout_s: float, what: str, step: float = 0.05):
    t0 = time.monotonic()
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(step)


def no_thaw_gofer_streams(cache_dir: Path) -> bool:
    """No `thaw-gofer stream` process writes into this cache."""
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = p.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"thaw-gofer") and b"stream" in argv:
            try:
                fds = os.listdir(p.parent / "fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if str(cache_dir) in os.readlink(p.parent / "fd" / fd):
                        return False
                except OSError:
                    pass
    return True
