"""Is memory a process filled before a checkpoint slow to read the first time
after `runsc restore`, once runsc has loaded every page? (CPU only; the
question behind docs/gpu.md: right after the restore, the CUDA restore copies
the process's host backup to the GPU at half the rate it reaches in a
sandbox that has run since, and strace shows no syscall in that copy.)

    python3 bench/first_touch.py --runsc build/runsc --mib 2048 --out /tmp/ft.json

A static probe (bench/first_touch.c) fills --mib of one anonymous mapping,
then on each trigger reads it all twice and reports both times. Sequence: the
cold sandbox reads it (the baseline: mapped, warm), is checkpointed, and the
image is restored --repeat times with --background; each restored probe is
triggered only after the boot log says every page was loaded, so the first
pass measures what a first touch costs after a restore (the sentry's fault
handling and the host's page tables of the stub), the second the same
memory already mapped. --thp sets the host's shmem huge pages as `thaw
provision` does on GPU nodes (advise / defer) for the run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from control.node.provision import THP_DEFRAG, THP_DIR, THP_SHMEM, thp_read, thp_write  # noqa: E402
from probe_sandbox import make, read_once, sh  # noqa: E402


def wait_for(what: str, ok, timeout: float = 300) -> None:
    end = time.time() + timeout
    while not ok():
        if time.time() > end:
            raise TimeoutError(what)
        time.sleep(0.02)


def trigger(share: Path, k: int, mib: int) -> dict:
    (share / f"go-{k}").write_text("")
    res = share / f"result-{k}"
    wait_for(f"result-{k}", res.exists, 120)
    p1, p2, _ = (int(x) for x in res.read_text().split())
    gb = (mib << 20) / 1e9
    return {"first_s": round(p1 / 1e9, 4), "second_s": round(p2 / 1e9, 4),
            "first_gb_s": round(gb / (p1 / 1e9), 2), "second_gb_s": round(gb / (p2 / 1e9), 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runsc", required=True)
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--thp", action="store_true", help="host shmem huge pages as provision sets them")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-first-touch"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    runsc = str(Path(a.runsc).resolve())
    saved = thp_read(THP_DIR)
    if a.thp:
        thp_write(THP_DIR, {"shmem_enabled": THP_SHMEM, "defrag": THP_DEFRAG})
    try:
        return run(a, runsc)
    finally:
        thp_write(THP_DIR, saved)


def run(a, runsc: str) -> int:
    box = make(a.work, runsc, HERE / "first_touch.c", ["/share", str(a.mib)])
    share, logs, img, bundle, g = box.share, box.logs, box.image, box.bundle, box.runsc
    res: dict = {"benchmark": "first-touch", "date": time.strftime("%Y-%m-%d"), "mib": a.mib, "cpus": os.cpu_count(),
                 "runsc": sh(runsc, "--version").splitlines()[0], "host_thp": thp_read(THP_DIR), "restores": []}
    try:
        sh(*g, "run", "--bundle", str(bundle), "--detach", "ft-cold")
        wait_for("probe ready", (share / "ready").exists)
        res["cold_sandbox"] = trigger(share, 1, a.mib)
        sh(*g, "checkpoint", f"--image-path={img}", "ft-cold", timeout=600)
        res["image_bytes"] = sum(p.stat().st_size for p in img.iterdir())
        sh(*g, "delete", "--force", "ft-cold")
        for r in range(a.repeat):
            for p in share.glob("*-2"):
                p.unlink()
            read_once(img)                  # warm page cache, as on the H200 runs
            cid = f"ft-restore-{r}"
            sh(*g, "restore", f"--image-path={img}", "--bundle", str(bundle), "--detach", "--background", cid,
               timeout=600)
            boot = logs / f"{cid}.boot.log"
            wait_for("pages loaded", lambda: boot.exists() and "All MemoryFile pages have been loaded"
                     in boot.read_text(errors="replace"))
            huge = next((ln.split("] ", 1)[-1] for ln in boot.read_text(errors="replace").splitlines()
                         if "application huge pages" in ln), None)
            res["restores"].append({**trigger(share, 2, a.mib), "huge_pages": huge})
            print(json.dumps(res["restores"][-1]), flush=True)
            sh(*g, "kill", cid, "KILL")
            time.sleep(0.3)
            sh(*g, "delete", "--force", cid)
    finally:
        for c in ["ft-cold", *(f"ft-restore-{r}" for r in range(a.repeat))]:
            subprocess.run([*g, "delete", "--force", c], capture_output=True)
    rs = res["restores"]
    if rs:
        res["median"] = {k: statistics.median(x[k] for x in rs) for k in ("first_gb_s", "second_gb_s")}
        res["first_vs_second"] = round(res["median"]["first_gb_s"] / res["median"]["second_gb_s"], 3)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))
    print(json.dumps({k: res.get(k) for k in ("cold_sandbox", "median", "first_vs_second", "host_thp")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
