"""Checkpoint to published: thawd's auto-checkpoint of the demo server, before and after
"one copy of every image" (issue 11.5), side by side in one run.

    sudo flock /tmp/thaw-heavy.lock .venv/bin/python bench/checkpoint_publish.py \
        [--runs 7] [--model-mb 128] [--page-cache full|as-is] [--sides both|after] \
        [--out bench/results/checkpoint-publish-<date>.json]

`--sides after` runs this tree alone: where its publish's time goes, with no ratios. The
before side no longer runs (2026-12-08): side() below builds Thawd with an `identify`
argument from control/thawd/ctrinfo.py, which 7b16fde predates.

One demo server (control/dev/workloads/demo_server.py, as `thaw demo` runs it) is
started in a real runsc sandbox and warmed up; SeaweedFS runs on loopback. Each
round then runs `Thawd.checkpoint(leave_running=True)` (the auto-checkpoint door:
runsc checkpoint, chunk, upload, publish the manifest, cache the image) once with
each code version, in a fresh subprocess, alternating which goes first:

- before: thaw at BEFORE_COMMIT (7b16fde, main before this change), extracted with
  `git archive` into the work directory and imported from there (PYTHONPATH): the
  image goes to state_dir/thawd/staging, is chunked there, the upload reads and
  SHA-256-hashes every missing chunk again, the install reads and hashes every
  chunk a third time and writes a second copy into the cache, staging is deleted.
- after: this tree: runsc writes into a cache partial, which is chunked, uploaded
  without hashing again and renamed into the cache.

Both use the same runsc, thaw-chunk, SeaweedFS, sandbox and settings; every run
gets an empty cache and its own store prefix, so every chunk is uploaded (nothing
is deduplicated against an earlier run). Before each run memory is put in one
state (`--page-cache full`, the default: nothing dirty, the page cache full of
clean pages, as on a node that has run a while, so every page a run writes is
reclaimed from it; SeaweedFS's volumes read last, as bench/store.py does; `as-is`:
only a sync), and the machine's CPUs have been >= 90% idle for 3 s (other work
on the machine that the lock does not cover would otherwise land in one side's
run; each run records how idle it was before and where the machine's CPU time
went during it). Without the fill, a second copy's cost depended on the state
the previous run left: on this VM, freshly freed memory is slow to touch again
(docs/store.md, Findings).

Timed inside the run (monotonic clock): the runsc checkpoint, chunking, upload,
the manifest's conditional put ("published"), and the whole call ("done": the
image is also in the node cache), and the upload's three phases (HEAD of every
chunk pointer, PUT of the packs, PUT of the new pointers: the span from the first
call's start to the last call's end, and the time summed over threads).
Counted: bytes Python read (pread) and wrote
(pwrite/pwritev/copy_file_range) from files, bytes SHA-256-hashed in Python by
thaw (chunk.sha256, which every image hash of both versions goes through) and by
botocore (SigV4 payload signing: S3SigV4Auth hashes every PUT body unless the
endpoint is https AND the request carries a checksum header, and thaw's client
turns checksums off, so it does on S3 too), bytes thaw-chunk read
and hashed (SHA-256 + BLAKE3: the files it was given, by construction), the
process tree's rchar/wchar (/proc/self/io: files and sockets, children included)
and the bytes written to the disk device during the run plus the sync after it
(/proc/diskstats; that includes SeaweedFS's own writes of the packs).
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
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "7b16fde"
SIDES = ("before", "after")
WORK = Path("/var/tmp/thaw-bench-checkpoint-publish")
KEYS = ("checkpoint_s", "chunk_s", "upload_s", "published_s", "done_s")


# -- one side, in its own process (imports whichever `control` PYTHONPATH names) ---------------

def side(cfg: dict) -> dict:
    import botocore.auth

    from control import config as configmod
    from control.images import chunk, transfer
    from control.images.cache import Cache
    from control.images.store import Store
    from control.thawd.ctrinfo import Identity
    from control.images.source import ImageSource
    from control.thawd.service import RuntimeRef, Thawd
    from runsc_hooks.runsc import Runsc

    s = configmod.load(overrides=cfg["overrides"], environ={})
    src = ImageSource(s)
    # The sandbox is thaw's own, not a containerd container: its tenant and image
    # are given, as containerd's records would give them (control/thawd/ctrinfo.py).
    t = Thawd(s, src, identify=lambda rt: Identity("ctr-bench", "sha256:" + "0" * 64, "bench"))
    rt = RuntimeRef.validate(cfg["sid"], cfg["bundle"], cfg["runsc_root"], cfg["flags"])
    marks: dict[str, float] = {}
    count = {"python_sha256_bytes": 0, "botocore_sha256_bytes": 0, "thaw_chunk_bytes": 0,
             "pread_bytes": 0, "pwrite_bytes": 0, "copy_file_range_bytes": 0}

    def timed(obj, name: str, label: str, on_call=None) -> None:
        real = getattr(obj, name)

        def wrapper(*a, **k):
            marks.setdefault(f"{label}_start", time.monotonic())
            if on_call:
                on_call(*a, **k)
            try:
                return real(*a, **k)
            finally:
                marks[f"{label}_end"] = time.monotonic()
        setattr(obj, name, wrapper)

    def chunked(paths, *_a, **_k) -> None:
        count["thaw_chunk_bytes"] += sum(os.stat(p).st_size for p in paths)

    timed(Runsc, "checkpoint", "checkpoint")
    # Where the upload's time goes: its three phases run one after the other (HEAD of
    # every chunk pointer, then the packs, then the new pointers), each on several threads.
    calls: dict[str, dict] = {}

    def spanned(obj, name: str) -> None:
        real = getattr(obj, name)
        c = calls.setdefault(name, {"n": 0, "busy_s": 0.0, "first": None, "last": None})

        def wrapper(*a, **k):
            t = time.monotonic()
            try:
                return real(*a, **k)
            finally:
                e = time.monotonic()
                c["n"] += 1
                c["busy_s"] += e - t
                c["first"] = t if c["first"] is None else min(c["first"], t)
                c["last"] = e if c["last"] is None else max(c["last"], e)
        setattr(obj, name, wrapper)
    for name in ("chunk_location", "put_pack", "put_chunk_pointer"):
        spanned(Store, name)
    timed(chunk, "chunk_files", "chunk", chunked)
    timed(transfer, "upload", "upload")
    timed(Store, "put_manifest_if_absent", "publish")
    timed(Cache, "install_locked", "install")

    real_sha = chunk.sha256

    def sha256(data):
        count["python_sha256_bytes"] += len(data)
        return real_sha(data)
    chunk.sha256 = sha256

    real_payload = botocore.auth.SigV4Auth.payload

    def payload(self, request):
        h = real_payload(self, request)
        if len(h) == 64 and h != botocore.auth.EMPTY_SHA256_HASH:   # it hashed the body
            body = request.body
            if hasattr(body, "seek"):
                pos = body.tell()
                body.seek(0, 2)
                count["botocore_sha256_bytes"] += body.tell() - pos
                body.seek(pos)
            else:
                count["botocore_sha256_bytes"] += len(body)
        return h
    botocore.auth.SigV4Auth.payload = payload

    real_pread, real_pwrite, real_pwritev, real_cfr = os.pread, os.pwrite, os.pwritev, os.copy_file_range

    def pread(fd, n, off):
        data = real_pread(fd, n, off)
        count["pread_bytes"] += len(data)
        return data

    def pwrite(fd, data, off):
        n = real_pwrite(fd, data, off)
        count["pwrite_bytes"] += n
        return n

    def pwritev(fd, bufs, off):
        n = real_pwritev(fd, bufs, off)
        count["pwrite_bytes"] += n
        return n

    def copy_file_range(*a, **k):
        n = real_cfr(*a, **k)
        count["copy_file_range_bytes"] += n
        return n
    os.pread, os.pwrite, os.pwritev, os.copy_file_range = pread, pwrite, pwritev, copy_file_range

    io0, disk0 = _proc_io(), _disk_written(cfg["disk"])
    cpu0, own0, weed0 = _system_cpu(), _own_cpu(), _pid_cpu(cfg["weed_pid"])
    t0 = time.monotonic()
    res = t.checkpoint(rt, leave_running=True)
    t1 = time.monotonic()
    cpu1, own1, weed1 = _system_cpu(), _own_cpu(), _pid_cpu(cfg["weed_pid"])
    io1 = _proc_io()
    os.sync()
    disk1 = _disk_written(cfg["disk"])
    t.close()
    entries = src.cache.entries()
    import control
    out = {"code": str(Path(control.__file__).resolve().parent.parent), "published": res["published"],
           "image_bytes": res["image_bytes"], "cached_entries": len(entries),
           "cached_bytes": sum(e.size for e in entries),
           "checkpoint_s": marks["checkpoint_end"] - marks["checkpoint_start"],
           "chunk_s": marks["chunk_end"] - marks["chunk_start"],
           "upload_s": marks["upload_end"] - marks["upload_start"],
           "published_s": marks["publish_end"] - t0, "done_s": t1 - t0,
           "after_publish_s": t1 - marks["publish_end"],
           "rchar_bytes": io1["rchar"] - io0["rchar"], "wchar_bytes": io1["wchar"] - io0["wchar"],
           "disk_written_bytes_incl_sync": disk1 - disk0, **count,
           # CPU-s of the whole machine while it ran: this process and its children, SeaweedFS,
           # and the rest (the sandbox's sentry writing the image, kernel writeback, and anything
           # foreign: the bench is meant to run on an otherwise idle machine).
           "cpu_s": {"machine_busy": round(cpu1[0] - cpu0[0], 2), "thaw": round(sum(own1) - sum(own0), 2),
                     "thaw_user": round(own1[0] - own0[0], 2), "thaw_system": round(own1[1] - own0[1], 2),
                     "seaweedfs": round(weed1 - weed0, 2),
                     "rest": round((cpu1[0] - cpu0[0]) - (sum(own1) - sum(own0)) - (weed1 - weed0), 2)},
           "upload_phases": {name: {"calls": c["n"], "span_s": round((c["last"] or 0) - (c["first"] or 0), 3),
                                    "busy_s_summed_over_threads": round(c["busy_s"], 3)}
                             for name, c in calls.items()}}
    staging = Path(cfg["overrides"]["node.state_dir"]) / "thawd" / "staging"
    out["staging_left"] = sorted(p.name for p in staging.iterdir()) if staging.is_dir() else []
    out["cache_tmp_left"] = sorted(p.name for p in (Path(cfg["overrides"]["cache.dir"]) / "tmp").iterdir())
    return out


def _proc_io() -> dict:
    """This process's I/O counters; reaped children (thaw-chunk, runsc) are added in by the kernel."""
    out = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        k, v = line.split(":")
        out[k] = int(v)
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def _system_cpu() -> tuple[float, float]:
    """(busy, idle) CPU-seconds of the machine since boot (/proc/stat; iowait counts as idle)."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / _TICK, idle / _TICK


def _own_cpu() -> tuple[float, float]:
    """(user, system) CPU-s of this process and its reaped children."""
    import resource
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + b.ru_utime, a.ru_stime + b.ru_stime


def _settle(page_cache: str) -> None:
    """Memory in one state before a run, the same for both sides (see the module docstring)."""
    os.sync()
    if page_cache == "as-is":
        return
    ballast = WORK / "page-cache-ballast"
    size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if not ballast.exists():
        with open(ballast, "wb") as f:
            f.truncate(size)
    for p in [ballast, *sorted(q for q in (WORK / "seaweed").rglob("*") if q.is_file())]:
        buf = bytearray(16 << 20)
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _pid_cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / _TICK


def _wait_idle(window_s: float = 3.0, idle_min: float = 0.9, give_up_s: float = 300.0) -> float:
    """Wait until the machine's CPUs were at least `idle_min` idle over a window; that fraction
    (below idle_min if it never got there within give_up_s)."""
    end = time.monotonic() + give_up_s
    while True:
        b0, i0 = _system_cpu()
        time.sleep(window_s)
        b1, i1 = _system_cpu()
        idle = (i1 - i0) / max((b1 - b0) + (i1 - i0), 1e-9)
        if idle >= idle_min or time.monotonic() > end:
            return round(idle, 3)


def _disk_written(dev: str) -> int:
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == dev:
            return int(f[9]) * 512
    raise SystemExit(f"no disk {dev} in /proc/diskstats")


# -- the driver --------------------------------------------------------------------------------

def _root_disk() -> str:
    dev = os.stat(WORK).st_dev
    name = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/uevent").read_text()
    return next(x.split("=", 1)[1] for x in name.splitlines() if x.startswith("DEVNAME="))


def _get(r: dict, k: str) -> float:
    return r["cpu_s"]["thaw"] if k == "thaw_cpu_s" else r[k]


def _summary(runs: list[dict], sides: tuple[str, ...] = SIDES) -> dict:
    out: dict = {}
    for sd in sides:
        mine = [r for r in runs if r["side"] == sd]
        out[sd] = {k: {"median": round(statistics.median(r[k] for r in mine), 3),
                       "min": round(min(r[k] for r in mine), 3), "max": round(max(r[k] for r in mine), 3)}
                   for k in KEYS}
        for k in ("python_sha256_bytes", "botocore_sha256_bytes", "thaw_chunk_bytes", "pread_bytes",
                  "pwrite_bytes", "copy_file_range_bytes", "rchar_bytes", "wchar_bytes",
                  "disk_written_bytes_incl_sync", "image_bytes"):
            out[sd][k] = statistics.median(r[k] for r in mine)
        out[sd]["cpu_s"] = {k: {"median": statistics.median(r["cpu_s"][k] for r in mine),
                                "min": min(r["cpu_s"][k] for r in mine), "max": max(r["cpu_s"][k] for r in mine)}
                            for k in mine[0]["cpu_s"]}
        out[sd]["upload_phase_span_s_median"] = {
            k: statistics.median(r["upload_phases"][k]["span_s"] for r in mine) for k in mine[0]["upload_phases"]}
        out[sd]["upload_phase_calls_median"] = {
            k: statistics.median(r["upload_phases"][k]["calls"] for r in mine) for k in mine[0]["upload_phases"]}
    if "before" not in sides:
        return out
    rounds = sorted({r["round"] for r in runs})
    for k in (*KEYS, "thaw_cpu_s"):
        per = []
        for n in rounds:
            b = next(r for r in runs if r["round"] == n and r["side"] == "before")
            a = next(r for r in runs if r["round"] == n and r["side"] == "after")
            per.append(_get(b, k) / _get(a, k))
        med = [statistics.median(_get(r, k) for r in runs if r["side"] == sd) for sd in ("before", "after")]
        out.setdefault("before_over_after", {})[k] = {
            "of_medians": round(med[0] / med[1], 3),
            "per_round": [round(x, 3) for x in per], "per_round_min": round(min(per), 3),
            "per_round_max": round(max(per), 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="rounds (each runs both sides once)")
    ap.add_argument("--model-mb", type=int, default=None, help="the demo model's size (thaw demo's default)")
    ap.add_argument("--page-cache", choices=("full", "as-is"), default="full",
                    help="memory state before each run (module docstring)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--sides", choices=("both", "after"), default="both",
                    help="after: this tree alone (where its publish's time goes; no before/after ratios)")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        print(json.dumps(side(json.loads(a.side))))
        return 0
    if a.runs < 3:
        ap.error("--runs must be at least 3 (medians with spread)")
    sides = SIDES if a.sides == "both" else ("after",)

    sys.path.insert(0, str(REPO))
    from control import config as configmod
    from control.dev import demo, seaweed
    from control.images.store import Store
    from control.lifecycle.sandbox import Sandboxes
    from runsc_hooks import spec as specmod
    from runsc_hooks.runsc import remove_root

    remove_root(WORK / "runsc-root")   # a runsc root holds null-netns mounts: rmtree alone cannot remove it
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    before_code = WORK / "before-code"
    if "before" in sides:
        before_code.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_COMMIT, "control", "runsc_hooks",
                                  "nvproxy"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before_code)], input=archive, check=True)
    after_commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=True,
                                  capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "control", "runsc_hooks"],
                           capture_output=True, text=True).stdout.strip()
    disk = _root_disk()

    sw = seaweed.Seaweed(WORK / "seaweed").start()
    sandbox_settings = configmod.load(overrides={"node.state_dir": str(WORK / "sandbox-state"),
                                                 "runsc.root": str(WORK / "runsc-root"),
                                                 "runsc.path": str(REPO / "build" / "runsc")}, environ={})
    sb = Sandboxes(sandbox_settings)
    sid = f"thaw-bench-ckpub-{os.getpid()}"
    runs: list[dict] = []
    result: dict = {"benchmark": "checkpoint_publish", "date": date.today().isoformat(),
                    "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
                               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB)",
                    "store": "SeaweedFS `weed server -s3` on 127.0.0.1, same machine",
                    "before": f"thaw {BEFORE_COMMIT} (git archive, imported via PYTHONPATH)" if "before" in sides else None,
                    "after": f"thaw {after_commit}" + (" + uncommitted changes" if dirty else ""),
                    "disk": disk, "page_cache": a.page_cache}
    try:
        creds = sw.credentials.write_aws_file(WORK / "aws-credentials")
        t = time.monotonic()
        sb.run(sid, demo.demo_spec(sandbox_settings, sid, a.model_mb or demo.DEFAULT_MODEL_MB))
        demo.first_answer(sb.address(sid), 300)
        for _ in range(4):
            demo.http_json(sb.address(sid), "POST", "/infer", demo.PROMPT)
        result["demo"] = {"model_mb": a.model_mb or demo.DEFAULT_MODEL_MB,
                          "cold_start_s": round(time.monotonic() - t, 2)}
        rec = sb.get(sid)
        bundle = specmod.Bundle(Path(rec.bundle))
        spec = bundle.load()
        spec.setdefault("annotations", {})["thaw.dev/workload"] = "bench-demo"   # opt in, as a pod would
        bundle.write(spec)
        flags = sb.runsc("sandbox" if rec.net else "none").options.argv()
        for n in range(a.runs):
            order = sides if n % 2 == 0 else sides[::-1]
            for sd in order:
                tag = f"{sd}-{n}"
                over = {"store.endpoint": sw.endpoint, "store.credentials_file": str(creds),
                        "store.bucket": "bench", "store.prefix": f"{tag}/",
                        "cache.dir": str(WORK / tag / "cache"), "cache.budget_bytes": str(64 << 30),
                        "node.state_dir": str(WORK / tag / "state"),
                        "runsc.path": str(REPO / "build" / "runsc"),
                        "pack.chunker": str(REPO / "build" / "thaw-chunk"),
                        "store.fetcher": str(REPO / "build" / "thaw-fetch")}
                cfg = {"overrides": over, "sid": sid, "bundle": rec.bundle, "weed_pid": sw.proc.pid,
                       "runsc_root": str(sandbox_settings.runsc_root), "flags": flags, "disk": disk}
                _settle(a.page_cache)
                idle = _wait_idle()
                env = dict(os.environ)
                if sd == "before":
                    env["PYTHONPATH"] = str(before_code)
                p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--side", json.dumps(cfg)],
                                   cwd=before_code if sd == "before" else REPO, env=env, capture_output=True,
                                   text=True, timeout=600)
                if p.returncode != 0:
                    raise SystemExit(f"{tag} failed ({p.returncode}):\n{p.stderr[-4000:]}")
                r = {"side": sd, "round": n, "first": order[0] == sd, "idle_before": idle, **json.loads(p.stdout)}
                want = str(before_code) if sd == "before" else str(REPO)
                if r["code"] != want:
                    raise SystemExit(f"{tag} ran thaw from {r['code']}, not {want}")
                print(f"{tag}: checkpoint {r['checkpoint_s']:.2f} s, published at {r['published_s']:.2f} s, "
                      f"done {r['done_s']:.2f} s; {r['image_bytes'] / 1e6:.0f} MB; python sha256 "
                      f"{r['python_sha256_bytes'] / 1e6:.0f} MB; idle before {idle:.2f}, cpu {r['cpu_s']}",
                      file=sys.stderr)
                runs.append(r)
                shutil.rmtree(WORK / tag, ignore_errors=True)
        result["runs"] = runs
        result["summary"] = _summary(runs, sides)
        result["load_average_at_end"] = os.getloadavg()
    finally:
        if sb.get(sid) is not None:
            sb.delete(sid, force=True)
        shutil.rmtree(sandbox_settings.state_dir / "rootfs" / sid, ignore_errors=True)
        try:
            Store(configmod.load(overrides={"store.endpoint": sw.endpoint, "store.bucket": "bench",
                                            "store.credentials_file": str(WORK / "aws-credentials")},
                                 environ={})).delete_bucket()
        except Exception:   # noqa: BLE001 - the store goes away with its work directory anyway
            pass
        sw.stop()
        remove_root(sandbox_settings.runsc_root)
        shutil.rmtree(WORK, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
