"""Chained checkpoints (docs/gvisor-notes.md, "Chained checkpoints grow the saved kernel
state"): how the sentry's saved state grows when a restored sandbox is checkpointed again,
generation after generation.

The test server of tests/integration/test_cli_lifecycle.py is run and checkpointed once (generation
0); then each generation `thaw restore`s the last image, asks it once over HTTP and
`thaw checkpoint`s it into a new directory. Per generation: checkpoint.img's bytes, thaw's
`restore_s`, and the TCP endpoints in the saved state by state (tcp.EndpointState numbers,
from `thaw-statediff -dump`). At the pin each generation keeps the previous ones' closed
connections: the stack's resumableEndpoints list is saved with the kernel and never emptied
after a restore.

    .venv/bin/python bench/chain_growth.py [--generations 20] [--runsc PATH [--note TEXT]] [--keep DIR] [--out FILE]

--runsc: a runsc to run instead of build/runsc (a patched build, to check a fix; it must carry
the same version label). --keep DIR: every generation's checkpoint.img is copied there as
gN.img, for `build/thaw-statediff DIR/g1.img DIR/gN.img`. Needs root, the build and
`build/thaw-statediff`. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.report import emit, spread  # noqa: E402
from control import config as configmod  # noqa: E402
from control.lifecycle.sandbox import Sandboxes  # noqa: E402
from runsc_hooks import network as netmod  # noqa: E402
from runsc_hooks.runsc import remove_root  # noqa: E402
from tests.integration.test_cli_lifecycle import PORT, PYTHON, SERVER, ask  # noqa: E402

THAW = Path(sys.executable).parent / "thaw"
STATEDIFF = REPO / "build" / "thaw-statediff"
SUBNET = "10.215.48.0/24"   # its own range: never collides with tests or another benchmark
_ENDPOINT = re.compile(r"^g\d+r\d+ = struct\[g\d+t\d+=pkg/tcpip/transport/tcp\.Endpoint\]\{$")
_STATE = re.compile(r"^\tstate: (\w+),$")


def _env(base: Path, runsc: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env.update({"THAW_NODE_STATE_DIR": str(base / "state"), "THAW_NODE_LOG_DIR": str(base / "log"),
                "THAW_RUNSC_ROOT": str(base / "root"), "THAW_NETWORK_SUBNET": SUBNET,
                "THAW_CACHE_DIR": str(base / "cache"), "THAW_CONFIG": str(base / "empty.toml"),
                "THAW_RUNSC_PATH": str(runsc)})
    return env


def _thaw(env: dict, *args: str) -> dict:
    # --json right after the subcommand: `run`'s workload argv follows its "--".
    p = subprocess.run([str(THAW), args[0], "--json", *args[1:]], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"thaw {' '.join(args)} failed ({p.returncode}): {p.stderr[-800:]}")
    return json.loads(p.stdout) if p.stdout.strip() else {}


def tcp_endpoints(image: Path) -> dict[str, int]:
    """The tcp.Endpoint objects in an image's saved state, counted by their saved state number."""
    p = subprocess.run([str(STATEDIFF), "-dump", str(image)], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"thaw-statediff -dump {image}: {p.stderr.strip()}")
    states: collections.Counter = collections.Counter()
    inside = False
    for line in p.stdout.splitlines():
        if _ENDPOINT.match(line):
            inside = True
        elif inside and (m := _STATE.match(line)):
            states[m.group(1)] += 1
            inside = False
    return dict(sorted(states.items()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--generations", type=int, default=20, help="at least 2")
    ap.add_argument("--runsc", type=Path, default=REPO / "build" / "runsc")
    ap.add_argument("--keep", type=Path, help="copy each generation's checkpoint.img here (gN.img)")
    ap.add_argument("--note", default="", help="recorded in the result: what --runsc is")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.generations < 2:
        raise SystemExit(f"--generations {a.generations}: at least 2 (a growth needs two restored generations)")
    for need in (THAW, STATEDIFF, a.runsc):
        if not need.is_file():
            raise SystemExit(f"{need} missing (make setup)")
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="thaw-chain-growth-", dir="/var/tmp"))
    (base / "empty.toml").write_text("")
    env = _env(base, a.runsc)
    settings = configmod.load(environ=env, config_file=base / "empty.toml")
    rows = []
    try:
        out = _thaw(env, "run", "--id", "chain-0", "--probe", f"http:{PORT}/health", "--",
                    PYTHON, "-c", SERVER, "chain", str(PORT), "4")
        ask(out["address"], timeout_s=60)
        img = base / "img-0"
        _thaw(env, "checkpoint", "chain-0", "--out", str(img))
        rows.append({"generation": 0, "kernel_bytes": (img / "checkpoint.img").stat().st_size,
                     "tcp_endpoints_by_state": tcp_endpoints(img)})
        if a.keep:
            shutil.copy(img / "checkpoint.img", a.keep / "g0.img")
        for g in range(1, a.generations + 1):
            out = _thaw(env, "restore", str(img), "--id", f"chain-{g}")
            ask(out["address"], timeout_s=30)
            nxt = base / f"img-{g}"
            _thaw(env, "checkpoint", f"chain-{g}", "--out", str(nxt))
            shutil.rmtree(img)
            img = nxt
            rows.append({"generation": g, "kernel_bytes": (img / "checkpoint.img").stat().st_size,
                         "restore_s": out["restore_s"], "tcp_endpoints_by_state": tcp_endpoints(img)})
            if a.keep:
                shutil.copy(img / "checkpoint.img", a.keep / f"g{g}.img")
    finally:
        sb = Sandboxes(settings)
        for rec in sb.list_records():
            try:
                sb.delete(rec.id, force=True)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass
        remove_root(settings.runsc_root)  # runsc's null-netns bind mounts first
        netmod.remove_subnet_route(SUBNET)
        shutil.rmtree(base, ignore_errors=True)
    # The slope over generations 1..N: one generation's size swings by an endpoint (~1.4 KB)
    # with how many of its connections are in TIME_WAIT when it is saved.
    slope = statistics.linear_regression([r["generation"] for r in rows[1:]],
                                         [r["kernel_bytes"] for r in rows[1:]]).slope
    tenth = max(1, a.generations // 10)
    restores = [r["restore_s"] for r in rows[1:]]
    result = {
        "benchmark": "chain-growth", "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)",
        "runsc": str(a.runsc), "note": a.note, "generations": a.generations,
        "kernel_bytes_per_generation": round(slope, 1),
        "restore_s_first_tenth": spread(restores[:tenth], 4), "restore_s_last_tenth": spread(restores[-tenth:], 4),
        "rows": rows, "load_average_at_end": os.getloadavg(),
    }
    return emit(result, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
