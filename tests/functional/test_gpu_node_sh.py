"""bench/gpu/node.sh's call protocol on the GPU machine, with a stand-in driver:
the same command in consecutive device calls unpacks the part a call carries
(exit 3 until both are there), starts the run detached, waits at most
THAW_NODE_WAIT_S (exit 4 while it runs on), and hands back node.json each
time; a finished run is collected, not started again. node.py's arguments
(--repeat) reach the driver, and each call hands back the rounds done so far
(node.py saves its headline with every start)."""
from __future__ import annotations

import json
import lzma
import hashlib
import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DRIVER = """import argparse, json, os, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--out"); ap.add_argument("--mode"); ap.add_argument("--bin"); ap.add_argument("--work")
ap.add_argument("--model", default=""); ap.add_argument("--repeat", type=int, default=1)
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
with open(os.environ["FAKE_COUNT"], "a") as f:
    f.write("run\\n")
def done(n):
    return {"repeat": {"asked": a.repeat, "done": {"cold": n, "store": n, "cache": n}}}
json.dump({"ok": None, "model": a.model, "bin_has_tool": os.path.isfile(os.path.join(a.bin, "tool-b")),
           "headline": done(1)}, open(os.path.join(a.out, "node.json"), "w"))
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
os.makedirs(os.path.join(a.out, "evidence"), exist_ok=True)
open(os.path.join(a.out, "evidence", "003-cache-c3-cache-r3.tar.xz"), "w").write("logs")
json.dump({"ok": True, "model": a.model, "headline": done(a.repeat)}, open(os.path.join(a.out, "node.json"), "w"))
print("driver done", flush=True)
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


def _setup(tmp: Path) -> dict[str, str]:
    (tmp / "driver.py").write_text(DRIVER)
    (tmp / "list.txt").write_text("a bin tool-a\nb bin tool-b\n")
    for part, name in (("a", "tool-a"), ("b", "tool-b")):
        d = tmp / "parts" / part
        d.mkdir(parents=True)
        data = f"#!/bin/sh\necho {name}\n".encode()
        (d / f"{name}.xz").write_bytes(lzma.compress(data))
        (d / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()} {name}\n")
    return {**os.environ, "OUT": str(tmp / "out"), "THAW_NODE_STATE": str(tmp / "state"),
            "THAW_NODE_PARTS": str(tmp / "parts"), "THAW_NODE_LIST": str(tmp / "list.txt"),
            "THAW_NODE_DRIVER": str(tmp / "driver.py"), "FAKE_COUNT": str(tmp / "count")}


def _call(env: dict, *args: str, timeout: float = 60) -> tuple[int, str, dict | None]:
    p = subprocess.run(["bash", "bench/gpu/node.sh", *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=timeout)
    out = Path(env["OUT"]) / "node.json"
    return p.returncode, p.stdout + p.stderr, json.loads(out.read_text()) if out.exists() else None


def _wait_gone(env: dict) -> None:
    pid = int((Path(env["THAW_NODE_STATE"]) / "driver.pid").read_text())
    end = time.monotonic() + 20
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def test_parts_then_a_detached_run_then_collection(tmp_path):
    env = _setup(tmp_path)
    b = tmp_path / "parts" / "b"
    b.rename(tmp_path / "held-b")                     # call 1 carries part a only
    rc, out, doc = _call(env)
    assert rc == 3 and "waiting for the other carry part" in out and doc is None, out
    (tmp_path / "parts" / "a").rename(tmp_path / "held-a")
    (tmp_path / "held-b").rename(b)                   # call 2 carries part b only
    env2 = {**env, "FAKE_SLEEP": "3", "THAW_NODE_WAIT_S": "1"}
    rc, out, doc = _call(env2, "--model", "tiny", "--repeat", "3")
    assert rc == 4 and "still running" in out, out
    round1 = {"repeat": {"asked": 3, "done": {"cold": 1, "store": 1, "cache": 1}}}
    assert doc == {"ok": None, "model": "tiny", "bin_has_tool": True, "headline": round1}, \
        "the partial result comes back, with the rounds done so far"
    rc, out, doc = _call({**env2, "THAW_NODE_WAIT_S": "30"})     # call 3 waits for the end
    every = {"repeat": {"asked": 3, "done": {"cold": 3, "store": 3, "cache": 3}}}
    assert rc == 0 and "run finished, exit 0" in out and doc == {"ok": True, "model": "tiny", "headline": every}, out
    assert "driver done" in (tmp_path / "out" / "node.log").read_text()
    # soak.py's failed restores' logs (Node.evidence) come back with the report
    assert (tmp_path / "out/evidence/003-cache-c3-cache-r3.tar.xz").read_text() == "logs"
    rc, out, doc = _call(env2)                        # a finished run is collected, not run again
    assert rc == 0 and (tmp_path / "count").read_text() == "run\n"
    _wait_gone(env)


def test_a_failed_run_exits_1_and_again_starts_a_new_one(tmp_path):
    env = {**_setup(tmp_path), "FAKE_RC": "1", "THAW_NODE_WAIT_S": "20"}
    rc, out, doc = _call(env)
    assert rc == 1 and "run finished, exit 1" in out, out
    rc, out, doc = _call({**env, "FAKE_RC": "0", "THAW_NODE_AGAIN": "1"})
    assert rc == 0 and (tmp_path / "count").read_text() == "run\nrun\n", out
    _wait_gone(env)
