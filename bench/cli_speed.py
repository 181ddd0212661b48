"""How much the `thaw` command line costs over the work it runs (issue 11.6).

Side by side, alternating, in one run on one machine:
- `thaw --help` against `python -c pass` (the interpreter's own start);
- `thaw restore IMAGE --id X` of a small image against `runsc restore`
  of the same image with the same bundle and the same global flags run
  directly, for an image without a network (the work is runsc alone) and for
  one with thaw's network (the direct side restores into a netns plumbed
  before its clock starts; thaw's side plumbs, gates and health-checks inside
  its time: that row is the whole cost of the network door, pyroute2's import
  and the netlink calls included).

    .venv/bin/python bench/cli_speed.py [--runs 7] [--out bench/results/cli-speed-<date>.json]

Needs root and the build (runsc). Prints one JSON object; medians with min/max.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
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
from control.lifecycle.image_meta import IMAGE_META  # noqa: E402
from control.lifecycle.sandbox import Sandboxes  # noqa: E402
from runsc_hooks import network as netmod  # noqa: E402
from runsc_hooks import spec as specmod  # noqa: E402
from runsc_hooks.runsc import remove_root  # noqa: E402

THAW = Path(sys.executable).parent / "thaw"
SUBNET = "10.215.0.0/24"   # its own range: never collides with tests or a demo


def _timed(argv: list[str], env: dict | None = None) -> float:
    # Files, not pipes: a detached sandbox inherits the caller's stdio and would
    # hold a pipe open forever (the reason runsc_hooks/runsc.py uses files too).
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                           timeout=300)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{argv} failed ({p.returncode}): {err.read().decode(errors='replace')[-800:]}")
    return dt


def _env(base: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env.update({"THAW_NODE_STATE_DIR": str(base / "state"), "THAW_NODE_LOG_DIR": str(base / "log"),
                "THAW_RUNSC_ROOT": str(base / "root"), "THAW_NETWORK_SUBNET": SUBNET,
                "THAW_CACHE_DIR": str(base / "cache"), "THAW_CONFIG": str(base / "empty.toml")})
    return env


def _image(sb: Sandboxes, sid: str, out: Path, network: bool) -> Path:
    """A checkpoint of busybox-like `sleep` under the host layout: small and quick to restore."""
    rootfs = specmod.prepare_host_rootfs(sb.settings.state_dir / "rootfs" / sid)
    spec = specmod.command_spec(["/bin/sleep", "infinity"], rootfs=str(rootfs),
                                extra_mounts=specmod.host_layout([]))
    sb.run(sid, spec, network=network)
    sb.checkpoint(sid, out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="thaw-cli-speed-", dir="/var/tmp"))
    (base / "empty.toml").write_text("")
    env = _env(base)
    settings = configmod.load(environ=env, config_file=base / "empty.toml")
    sb = Sandboxes(settings)
    result: dict = {"benchmark": "cli-speed", "date": time.strftime("%Y-%m-%d"),
                    "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)"}
    try:
        # 1. --help vs the bare interpreter
        helps, bare = [], []
        for _ in range(a.runs):
            bare.append(_timed([sys.executable, "-c", "pass"], env))
            helps.append(_timed([str(THAW), "--help"], env))
        result["help"] = {"thaw_help": spread(helps, 4, runs=True), "python_pass": spread(bare, 4, runs=True),
                          "overhead_median_s": round(statistics.median(helps) - statistics.median(bare), 4)}

        # 2. restore: thaw vs runsc direct, same image, same bundle, same flags
        for network in (False, True):
            label = "network" if network else "no_network"
            img = _image(sb, f"speed-src-{label}", base / f"img-{label}", network)
            meta = json.loads((img / IMAGE_META).read_text())
            r = sb.runsc(meta["network"], meta.get("nvproxy", False))
            thaw_s, runsc_s = [], []
            for i in range(a.runs):
                sid = f"speed-{label}-{i}"
                thaw_s.append(_timed([str(THAW), "restore", str(img), "--id", sid, "--json"], env))
                sb.delete(sid, force=True)
                # The direct side: the bundle thaw would write (without thaw's netns), runsc restore alone.
                bundle = base / "direct" / f"{label}-{i}"
                spec = dict(meta["spec"])
                spec["root"] = dict(spec["root"], path=str(specmod.prepare_host_rootfs(base / "rootfs-direct" / str(i))))
                name = f"speed-direct-{i}"
                netns = None
                if network:  # the direct side gets a plain netns, plumbed outside the timing
                    host_ip, sandbox_ip, plen = netmod.slot_addresses(SUBNET, 40 + i)
                    netns = netmod.plumb(name, host_ip, sandbox_ip, plen, subnet=SUBNET).netns_path
                specmod.Bundle(bundle).write(specmod.with_netns(spec, netns))
                cid = f"direct-{label}-{i}+"
                argv = r.argv("restore", f"--image-path={img}", f"--bundle={bundle}", "--detach", cid)
                try:
                    runsc_s.append(_timed(argv, env))
                finally:
                    subprocess.run(r.argv("delete", "--force", cid), capture_output=True)
                    if network:
                        netmod.unplumb(name)
            result[f"restore_{label}"] = {
                "thaw_restore": spread(thaw_s, 4, runs=True), "runsc_restore": spread(runsc_s, 4, runs=True),
                "overhead_median_s": round(statistics.median(thaw_s) - statistics.median(runsc_s), 4)}
    finally:
        for rec in sb.list_records():
            try:
                sb.delete(rec.id, force=True)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass
        remove_root(settings.runsc_root)  # runsc's null-netns bind mounts first
        shutil.rmtree(base, ignore_errors=True)
    result["load_average_at_end"] = os.getloadavg()
    return emit(result, a.out)


if __name__ == "__main__":
    sys.exit(main())
