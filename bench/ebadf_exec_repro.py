"""Does `runsc exec` close a host FD under a sandbox that is listing a bind mount?

CPU reproduction attempt for the EBADF/ENOTDIR on a bind-mounted directory in a GPU
sandbox (docs/gvisor-notes.md, "EBADF listing a bind-mounted directory after a GPU
restore"): every occurrence came within ~2 s of the CUDA helper running inside the
sandbox. Real runsc (build/runsc), systrap, no containerd, no GPU.

The sandbox's workload (bench/ebadf_exec_repro.c `serve`, static) lists, reads, writes,
renames and removes files in a bind-mounted host directory (/share/spool) as fast as it
can, answering the driver's NAME.req files with NAME.resp; it exits 3 on EBADF and 4 on
ENOTDIR. Meanwhile the host runs `runsc exec` again and again with the stdio thaw gives
its CUDA helper (runsc_hooks/runsc.py `Runsc._run`: stdin /dev/null, stdout and stderr
anonymous temporary files, no --detach, no pid file) of a static binary on a read-only
bind mount (thaw's /thaw/bin), in one of these shapes (`--kinds`, rotated):
  fast    prints and exits at once (--get-state)
  mmap    maps a 32 MiB file from a second bind mount and exits mapped (libcuda)
  fds     opens 64 files and directories of that mount and exits with them open
  spool   lists the workload's own spool and stats every entry
  kill    sleeps; the driver SIGKILLs the `runsc exec` client after 0.2 s, as thaw's
          timeout does (the process inside runs on, holding the donated stdio)
  dirstdin  not thaw's shape: a directory as stdin, which the sentry refuses to import
          (host.NewFD -> EPERM), the one exec path found to close a host FD number twice
`--parallel N` runs N execs at once (thaw toggles a sandbox's CUDA processes in parallel
threads, nvproxy/cuda.py `restore`). `--start restore` runs the exec loop in a sandbox
restored from a checkpoint of the workload (the 2026-11-30/12-01 occurrences);
`--leave-running-every K` checkpoints it with --leave-running every K execs (2026-12-01
07:27). Every `--probe-every` execs the driver drops a request and waits for the answer
(the workload is alive and its listing works).

    flock /tmp/thaw-heavy.lock .venv/bin/python bench/ebadf_exec_repro.py --execs 200 --start run
    ... --start restore --kinds fast,mmap,fds,spool,kill --parallel 2 --leave-running-every 25
    ... --kinds dirstdin --strace /tmp/ebadf.strace    # the double close, at the first exec

The counts of 2026-12-05 (2,050 execs in thaw's shape, no failure; dirstdin fails at once)
are in docs/gvisor-notes.md.

Prints one JSON summary line (and writes it to --out); exit 1 when the workload failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from runsc_hooks.runsc import remove_root  # noqa: E402

SOURCE = HERE / "ebadf_exec_repro.c"
CID = "ebadf-exec-repro"
KINDS = ("fast", "mmap", "fds", "spool", "kill", "dirstdin")


class Sandbox:
    """One runsc root holding the sandbox under test; every call as thaw makes it."""

    def __init__(self, runsc: Path, work: Path, debug: bool) -> None:
        self.work = work
        self.root = work / "runsc-root"
        self.base = [str(runsc), f"--root={self.root}", "--platform=systrap", "--network=none"]
        if debug:
            self.base += ["--debug", f"--debug-log={work}/logs/%ID%.%COMMAND%.log"]

    def run(self, *args: str, timeout: float = 120.0, check: bool = True,
            stdio: int | None = None) -> subprocess.CompletedProcess:
        # Anonymous files, never pipes: create/restore fork the sandbox, which inherits them.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            p = subprocess.run([*self.base, *args], stdin=subprocess.DEVNULL,
                               stdout=stdio if stdio is not None else out,
                               stderr=stdio if stdio is not None else err, timeout=timeout)
            out.seek(0)
            err.seek(0)
            res = subprocess.CompletedProcess(p.args, p.returncode, out.read().decode(errors="replace"),
                                              err.read().decode(errors="replace"))
        if check and res.returncode != 0:
            raise RuntimeError(f"runsc {' '.join(args[:2])}: exit {res.returncode}: {res.stderr.strip()[-400:]}")
        return res

    def exec_(self, argv: list[str], kill_after: float | None = None, stdin_dir: bool = False) -> int:
        """`runsc exec` with thaw's stdio shape; SIGKILL the client after `kill_after` s.
        `stdin_dir`: a directory as stdin instead of /dev/null (not thaw's shape: the
        sentry refuses to import it, an error path that closes the number twice)."""
        stdin = os.open(self.work, os.O_RDONLY | os.O_DIRECTORY) if stdin_dir else subprocess.DEVNULL
        try:
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                p = subprocess.Popen([*self.base, "exec", CID, *argv], stdin=stdin, stdout=out, stderr=err)
                if kill_after is not None:
                    time.sleep(kill_after)
                    p.send_signal(signal.SIGKILL)
                return p.wait(timeout=60)
        finally:
            if stdin_dir:
                os.close(stdin)

    def status(self) -> str:
        r = self.run("state", CID, check=False)
        return json.loads(r.stdout).get("status", "?") if r.returncode == 0 else "gone"

    def cleanup(self) -> None:
        if self.root.is_dir():
            self.run("delete", "--force", CID, check=False)
            remove_root(self.root)   # runsc leaves its null-netns bind mount there


def build(work: Path) -> Path:
    exe = work / "ebadf"
    subprocess.run(["gcc", "-static", "-O2", "-Wall", "-o", str(exe), str(SOURCE)], check=True)
    return exe


def layout(work: Path, exe: Path) -> Path:
    """rootfs + the three bind mounts (spool rw, helper dir ro, library dir ro); the bundle."""
    rootfs, share, helper, lib = work / "rootfs", work / "share", work / "helper", work / "lib"
    for d in (rootfs / "bin", rootfs / "proc", rootfs / "share", rootfs / "thaw/bin", rootfs / "lib",
              share / "spool", helper, lib, work / "logs", work / "bundle"):
        d.mkdir(parents=True, exist_ok=True)
    shutil.copy(exe, rootfs / "bin/ebadf")
    shutil.copy(exe, helper / "helper")
    with open(lib / "big.so", "wb") as f:
        f.write(os.urandom(32 << 20))
    for n in range(48):
        (lib / f"small.{n}").write_text("x" * n)
    (lib / "sub").mkdir(exist_ok=True)
    spec = {
        "ociVersion": "1.0.0",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/ebadf", "serve", "/share/spool"],
                    "env": ["PATH=/bin"], "cwd": "/"},
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": "ebadf",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/share", "type": "bind", "source": str(share), "options": ["rbind", "rw"]},
            {"destination": "/thaw/bin", "type": "bind", "source": str(helper), "options": ["rbind", "ro"]},
            {"destination": "/lib", "type": "bind", "source": str(lib), "options": ["rbind", "ro"]},
        ],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "ipc", "uts", "network")]},
    }
    (work / "bundle/config.json").write_text(json.dumps(spec))
    return work / "bundle"


def probe(spool: Path, n: int, timeout: float = 5.0) -> float | None:
    """Drop request n and wait for its answer: seconds, or None when none came."""
    t0 = time.monotonic()
    req = spool / f"p{n}.req"
    req.with_suffix(".partial").write_text("{}")
    os.rename(req.with_suffix(".partial"), req)
    resp = spool / f"p{n}.resp"
    while time.monotonic() - t0 < timeout:
        if resp.exists():
            resp.unlink()
            return time.monotonic() - t0
        time.sleep(0.002)
    return None


def helper_argv(kind: str) -> tuple[list[str], float | None, bool]:
    """argv, seconds after which the client is killed, stdin a directory."""
    h = "/thaw/bin/helper"
    return {
        "fast": ([h, "helper", "fast"], None, False),
        "mmap": ([h, "helper", "mmap", "/lib/big.so"], None, False),
        "fds": ([h, "helper", "fds", "/lib", "64"], None, False),
        "spool": ([h, "helper", "spool", "/share/spool"], None, False),
        "kill": ([h, "helper", "sleep", "2"], 0.2, False),
        "dirstdin": ([h, "helper", "fast"], None, True),
    }[kind]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runsc", type=Path, default=HERE.parent / "build/runsc")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-ebadf-exec-repro"))
    ap.add_argument("--execs", type=int, default=100)
    ap.add_argument("--kinds", default="fast", help=f"comma-separated, rotated: {','.join(KINDS)}")
    ap.add_argument("--start", choices=("run", "restore"), default="run")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--leave-running-every", type=int, default=0)
    ap.add_argument("--probe-every", type=int, default=10)
    ap.add_argument("--debug", action="store_true", help="runsc --debug logs under WORK/logs")
    ap.add_argument("--strace", type=Path, help="strace -f the sandbox's close/dup calls into this file "
                    "and count closes that failed with EBADF (a number closed twice)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    if bad := [k for k in kinds if k not in KINDS]:
        ap.error(f"--kinds: unknown {bad}; known: {','.join(KINDS)}")

    work = a.work.resolve()
    sb = Sandbox(a.runsc.resolve(), work, a.debug)
    sb.cleanup()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bundle = layout(work, build(work))
    spool, faillog = work / "share/spool", work / "share/fail.log"
    result = {"start": a.start, "kinds": kinds, "parallel": a.parallel,
              "leave_running_every": a.leave_running_every, "execs": 0, "exec_failures": 0,
              "checkpoints": 0, "probes": 0, "probe_misses": 0, "workload_failure": None}
    t_start = time.monotonic()
    try:
        with open(work / "workload.out", "wb") as wout:
            sb.run("create", "--bundle", str(bundle), CID, stdio=wout.fileno())
            sb.run("start", CID)
            if a.start == "restore":
                time.sleep(1)
                sb.run("checkpoint", "--leave-running", f"--image-path={work}/img0", CID)
                sb.run("kill", CID, "KILL", check=False)
                sb.run("delete", "--force", CID)
                for p in spool.iterdir():
                    p.unlink()
                sb.run("restore", f"--image-path={work}/img0", "--bundle", str(bundle), "--detach", CID,
                       stdio=wout.fileno())
        time.sleep(0.5)
        tracer = None
        if a.strace:
            pid = json.loads(sb.run("state", CID).stdout)["pid"]
            tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=close,dup2,dup3", "-o", str(a.strace),
                                       "-p", str(pid)], stdin=subprocess.DEVNULL)
            time.sleep(1)
        n = 0
        with ThreadPoolExecutor(max_workers=a.parallel) as pool:
            while n < a.execs and not faillog.exists():
                batch = [helper_argv(kinds[(n + i) % len(kinds)]) for i in range(min(a.parallel, a.execs - n))]
                rcs = list(pool.map(lambda x: sb.exec_(*x), batch))
                n += len(batch)
                result["execs"] = n
                # A killed client and a refused directory stdin fail by design.
                result["exec_failures"] += sum(1 for rc, (_, k, d) in zip(rcs, batch) if rc != 0 and k is None and not d)
                if a.leave_running_every and n % a.leave_running_every < len(batch):
                    img = work / "img"
                    shutil.rmtree(img, ignore_errors=True)
                    sb.run("checkpoint", "--leave-running", f"--image-path={img}", CID)
                    result["checkpoints"] += 1
                if a.probe_every and n % a.probe_every < len(batch):
                    result["probes"] += 1
                    if probe(spool, n) is None and not faillog.exists():
                        result["probe_misses"] += 1
                        print(f"exec {n}: no answer within 5 s (status {sb.status()})", file=sys.stderr)
                if n % 50 < len(batch):
                    print(f"{n} execs, status {sb.status()}", file=sys.stderr)
        time.sleep(2.5)   # the last execs' ~2 s window
        if tracer:
            tracer.terminate()
            tracer.wait(timeout=30)
            result["strace_close_ebadf"] = sum(1 for line in a.strace.read_text().splitlines()
                                               if "close(" in line and "EBADF" in line)
    finally:
        if faillog.exists():
            result["workload_failure"] = faillog.read_text().strip()
        result["status_at_end"] = sb.status()
        result["seconds"] = round(time.monotonic() - t_start, 1)
        sb.cleanup()
    line = json.dumps(result)
    print(line)
    if a.out:
        a.out.write_text(line + "\n")
    return 1 if result["workload_failure"] or result["status_at_end"] != "running" else 0


if __name__ == "__main__":
    sys.exit(main())
