"""fd_clobber inside a runsc sandbox: the EBADF hunt's next step (docs/gvisor-notes.md,
"EBADF listing a bind-mounted directory after a GPU restore").

bench/gpu/fd_clobber.sh showed the native driver never takes over an application's FD
numbers across CUDA toggles (0 in 20 toggles, 2026-12-05). What is left is the sandbox's
path: the application's numbers are the sentry's, the directory is a gofer (directfs)
bind mount read through a host FD of the sentry, and the device files are nvproxy's
host FDs. This runs the same program (bench/gpu/fd_clobber.c: two threads listing the
spool, 32 numbers held while checkpointed) as the sandbox's init, with the spool
bind-mounted read-write as the GPU server's is, and toggles it the three ways the five
failures were toggled:

  exec      thaw's helper through `runsc exec` (the parked path: occurrences 4 and 5);
  leave     `runsc checkpoint --leave-running` (runsc's in-sentry toggle; occurrence 3);
  restore   checkpoint, delete, `runsc restore` of the image (the restore's toggle back,
            then exec toggles on the restored sandbox; occurrences 1 and 2).

Around every toggle it records the sentry's *host* FD table (/proc/<sandbox pid>/fd:
the spool's readFD and controlFD among nvproxy's device FDs) and the application's
(`runsc exec ls -l /proc/1/fd`), and diffs them. A CLOBBER line whose `now=` still names
the spool while getdents64 failed with EBADF means the sentry's host FD went away under
a live application FD; `now=` naming something else means the application's number was
taken over. Exit 0: nothing clobbered; 1: a CLOBBER or HELD line; 2: setup failed.

  python3 bench/gpu/fd_clobber_sandbox.py --runsc R --helper H --out DIR [--device cpu]

--device cpu (the rehearsal: tests/integration/test_fd_clobber_sandbox.py) builds the
program without libcuda and stages models.py's stand-in helper; the toggles are then
only the exec, the checkpoints and the restores, which is itself a CPU probe of those
paths with a C lister.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE)]

from runsc_hooks import spec as specmod  # noqa: E402
from runsc_hooks.runsc import (CheckpointOptions, CreateOptions, GlobalOptions, RestoreOptions,  # noqa: E402
                               Runsc, remove_root)
from control.errors import RunscError  # noqa: E402
from nvproxy import helper  # noqa: E402

HELD = 32                       # twin: fd_clobber.c held[32]
SPOOL_FILES = 40                # as fd_clobber.sh: a listing of some length
PROGRAM = "/fdc/fd_clobber"
BAD = re.compile(r"^(CLOBBER|HELD) ", re.M)


def place(line: str, steps: list[dict]) -> dict:
    """Where a CLOBBER/HELD line fell: inside a step (a toggle, a checkpoint, a restore:
    `during`), else after the last step that ended before it (`after`, with the gap)."""
    t = float(line.split()[1])
    rec: dict = {"line": line[:200], "t": t}
    for s in steps:
        if "t0" in s and s["t0"] <= t <= s.get("t1", s["t0"]):
            rec["during"] = f'{s["n"]} {s["what"]}'
            return rec
    ended = [s for s in steps if s.get("t1", 1e18) < t]
    if ended:
        last = max(ended, key=lambda s: s["t1"])
        rec["after"] = f'{last["n"]} {last["what"]}'
        rec["gap_s"] = round(t - last["t1"], 3)
    return rec


def host_fds(pid: int) -> dict[int, str]:
    """The host FD table of process `pid`: number -> what it names."""
    out = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for n in names:
        try:
            out[int(n)] = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            pass
    return out


def diff(before: dict[int, str], after: dict[int, str]) -> dict:
    """What a toggle did to an FD table: numbers released, taken, and re-pointed."""
    return {"released": {str(k): v for k, v in sorted(before.items()) if k not in after},
            "took": {str(k): v for k, v in sorted(after.items()) if k not in before},
            "changed": {str(k): [before[k], after[k]] for k in sorted(before) if k in after and before[k] != after[k]}}


class Sandbox:
    def __init__(self, o: argparse.Namespace) -> None:
        self.o = o
        self.work = Path(o.work)
        self.spool = self.work / "spool"
        self.outdir = self.work / "out"
        self.n = 0
        self.res: dict = {}
        self.cid = ""
        self.log: list[dict] = []
        self.registry, self.devices = None, []

    # -- setup --

    def build(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        for d in (self.spool, self.outdir, self.work / "fdc"):
            d.mkdir(parents=True)
        for i in range(1, SPOOL_FILES + 1):
            (self.spool / f"f{i}.req").write_text(f"{i}\n")
        flags = ["-DFD_CLOBBER_NO_CUDA", "-Wno-unused-variable"] if self.o.device == "cpu" else []
        subprocess.run(["gcc", "-O2", "-Wall", "-pthread", *flags, "-o", str(self.work / "fdc/fd_clobber"),
                        str(HERE / "fd_clobber.c"), "-ldl"], check=True)
        specmod.prepare_host_rootfs(self.work / "rootfs")
        cmd = f"exec {PROGRAM} /spool {self.o.seconds} {self.o.pause_us} >> /out/prog.out 2>&1"
        spec = specmod.command_spec(["/bin/sh", "-c", cmd], env={"PATH": "/usr/bin:/bin"},
                                    rootfs=str(self.work / "rootfs"), extra_mounts=[
            *specmod.host_layout(),
            specmod.bind_mount(str(self.spool), "/spool", readonly=False),
            specmod.bind_mount(str(self.outdir), "/out", readonly=False),
            specmod.bind_mount(str(self.work / "fdc"), "/fdc"),
        ])
        if self.o.device == "cuda":
            from nvproxy import cdi, gpu
            helper.stage(Path(self.o.helper), self.work / "helper")
            helper.add_to_spec(spec, self.work / "helper")
            self.registry = cdi.node_registry(gpu.probe())
            self.devices = [f"{cdi.NVIDIA_KIND}={gpu.probe().gpus[0].uuid}"]
            spec = cdi.inject(spec, self.registry, self.devices)
        else:
            import models  # noqa: E402 (bench/gpu/models.py: the CPU stand-in for the helper)
            fake = self.work / "fake-helper"
            fake.write_text(models.FAKE_HELPER)
            fake.chmod(0o755)
            helper.stage(fake, self.work / "helper")
            helper.add_to_spec(spec, self.work / "helper")
        self.spec = spec
        self.bundle = specmod.Bundle(self.work / "bundle")
        self.bundle.write(spec)
        extra = tuple(self.o.runsc_flag or ())
        self.runsc = Runsc(Path(self.o.runsc), GlobalOptions(
            root=self.work / "runsc-root", network="none", nvproxy=self.o.device == "cuda",
            debug=self.o.debug, debug_log=Path(f"{self.o.out}/runsc-logs/%ID%.%COMMAND%.log") if self.o.debug else None,
            extra=extra), timeout_s=600)

    def new_id(self) -> str:
        self.n += 1
        return f"fdc-{self.o.name}-{self.n}"

    # -- the program --

    def prog(self) -> str:
        p = self.outdir / "prog.out"
        return p.read_text(errors="replace") if p.exists() else ""

    def wait_line(self, pattern: str, since: int, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        rx = re.compile(pattern, re.M)
        while time.monotonic() < end:
            if rx.search(self.prog()[since:]):
                return True
            time.sleep(0.05)
        return False

    def alive(self, timeout_s: float = 5) -> bool:
        """The program still runs and lists: a new tick line within timeout_s."""
        return self.wait_line(r"^tick ", len(self.prog()), timeout_s)

    def sentry_pid(self) -> int:
        return self.runsc.state(self.cid).pid

    def app_fds(self) -> dict[int, str]:
        """The application's FD table, as the sandbox's /proc shows it, less the numbers
        its listing threads open and close all the time (the spool, /proc/self/status):
        what stays is what a toggle may move (device files, eventfds, the held numbers
        show in the program's own HOLD/HELD lines)."""
        # ls exits 1 when a listed number closed before its readlink: the listers' churn.
        p = self.runsc.exec(self.cid, ["/bin/sh", "-c", "ls -l /proc/1/fd 2>/dev/null; exit 0"], timeout_s=60)
        out = {}
        for line in p.stdout.splitlines():
            m = re.search(r" (\d+) -> (.*)$", line)
            if m and not m.group(2).startswith(("/spool", "/proc/")):
                out[int(m.group(1))] = m.group(2)
        return out

    def signal(self, sig: int) -> None:
        self.runsc.kill(self.cid, sig)

    # -- toggles --

    def around(self, what: str, fn, after: bool = True) -> dict:
        """Run one toggle, with both FD tables diffed around it (`after`: the sandbox
        still runs afterwards)."""
        rec: dict = {"n": len(self.log) + 1, "what": what, "sandbox": self.cid}
        spid = self.sentry_pid()
        hb, ab = host_fds(spid), self.app_fds()
        t0 = time.monotonic()
        rec["t0"] = round(time.time(), 6)       # epoch, as fd_clobber's lines: where each CLOBBER fell
        try:
            rec["result"] = fn()
        except Exception as e:  # noqa: BLE001 - a failed toggle is evidence, recorded
            rec["error"] = f"{type(e).__name__}: {str(e)[-400:]}"
        rec["s"] = round(time.monotonic() - t0, 3)
        rec["t1"] = round(time.time(), 6)
        if not after:
            self.log.append(rec)
            return rec
        try:
            rec["host"], rec["app"] = diff(hb, host_fds(self.sentry_pid())), diff(ab, self.app_fds())
        except Exception as e:  # noqa: BLE001
            rec["after_error"] = f"{type(e).__name__}: {str(e)[-400:]}"
        self.log.append(rec)
        return rec

    def exec_toggle(self) -> str:
        p = self.runsc.exec(self.cid, [helper.HELPER_PATH, "--toggle", "--pid", "1"], timeout_s=300)
        return p.stdout.strip()

    def exec_round(self, hold: bool, control: bool = False) -> None:
        self.around("exec-toggle-to-checkpointed", self.exec_toggle)
        if hold:
            self.signal(signal.SIGUSR1)
        time.sleep(0.5)
        if control:     # the detection's control: the program clobbers a held number itself
            self.signal(signal.SIGWINCH)
            time.sleep(0.1)
        self.around("exec-toggle-to-running", self.exec_toggle)
        if hold:
            self.signal(signal.SIGUSR2)
        time.sleep(0.3)

    def checkpoint(self, image: Path, leave_running: bool) -> None:
        shutil.rmtree(image, ignore_errors=True)
        self.runsc.checkpoint(self.cid, CheckpointOptions(
            image_path=image, leave_running=leave_running,
            cuda_checkpoint_path=helper.HELPER_PATH if self.o.device == "cuda" else None))

    def restore(self, image: Path) -> None:
        """Delete the checkpointed sandbox and restore the image as a new one (same GPU)."""
        self.runsc.delete(self.cid, force=True)
        bundle = self.bundle
        if self.o.device == "cuda":
            from nvproxy import restore_spec
            bundle = specmod.Bundle(self.work / "bundle-restore")
            bundle.write(restore_spec.for_restore(self.spec, self.spec, self.registry, self.devices))
        self.cid = self.new_id()
        self.runsc.restore(self.cid, RestoreOptions(image_path=image, create=CreateOptions(bundle=bundle.path),
                                                    detach=True))
        if self.o.device == "cuda":
            self.wait_cuda_running()

    def wait_cuda_running(self, timeout_s: float = 120) -> None:
        """A detached restore returns before runsc's own CUDA toggle back (post-restore
        work, in the sentry) has run; a helper toggle then races it, the in-sentry exec
        fails and runsc kills the sandbox (2026-12-05, both first GPU runs: "exec
        error", signal 9). thawd never toggles a restoring sandbox; nor does this."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                if "running" in self.runsc.exec(self.cid, [helper.HELPER_PATH, "--get-state", "--pid", "1"],
                                                timeout_s=60).stdout:
                    return
            except RunscError:      # the toggle holds the process locked: get-state fails meanwhile
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the restored program's CUDA state is not running after {timeout_s:.0f} s")

    # -- the run --

    def run(self) -> dict:
        ver = subprocess.run([self.o.runsc, "--version"], capture_output=True, text=True).stdout.splitlines()
        res = self.res = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runsc": ver[0] if ver else None,
            "cpus": os.cpu_count(), "device": self.o.device, "rounds": self.o.rounds, "leave": self.o.leave,
            "restores": self.o.restores, "pause_us": self.o.pause_us,
            "runsc_flags": list(self.o.runsc_flag or ()), "steps": self.log}
        self.build()
        self.cid = self.new_id()
        self.runsc.create(self.cid, CreateOptions(bundle=self.bundle.path))
        self.runsc.start(self.cid)
        if not self.wait_line(r"^ready ", 0, 120):
            raise SystemExit(f"fd_clobber did not start: {self.prog()[-2000:]}")
        if self.o.device == "cuda":
            res["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True).stdout.strip()
        res["fds_at_start"] = {"host": host_fds(self.sentry_pid()), "app": self.app_fds()}
        image = self.work / "image"
        for k in range(1, self.o.rounds + 1):
            self.exec_round(hold=k % 2 == 1, control=self.o.control and k == 1)
        for _ in range(self.o.leave):
            self.around("checkpoint-leave-running", lambda: self.checkpoint(image, True))
            self.log[-1]["alive_after"] = self.alive()
        for r in range(self.o.restores):
            self.around("checkpoint", lambda: self.checkpoint(image, False), after=False)
            t0, e0 = time.monotonic(), time.time()
            mark = len(self.prog())
            self.restore(image)
            step = {"n": len(self.log) + 1, "what": "restore", "sandbox": self.cid, "t0": round(e0, 6),
                    "s": round(time.monotonic() - t0, 3), "t1": round(time.time(), 6),
                    "fds": {"host": host_fds(self.sentry_pid())}}
            step["alive_after"] = self.wait_line(r"^tick ", mark, 10)
            self.log.append(step)
            for k in range(1, self.o.rounds_after_restore + 1):
                self.exec_round(hold=k % 2 == 1)
        res["alive_at_end"] = self.alive()
        mark = len(self.prog())
        self.signal(signal.SIGTERM)
        res["summary_seen"] = self.wait_line(r"^summary ", mark, 30)
        return self.read_out(res)

    def read_out(self, res: dict) -> dict:
        """What the program reported, each CLOBBER/HELD line placed against the steps."""
        out = self.prog()
        bad = [ln for ln in out.splitlines() if BAD.match(ln)]
        control = re.search(r"^CONTROL \S+ fd=(\d+)$", out, re.M)
        res["control"] = {"asked": self.o.control, "done": bool(control), "reported": False}
        if control:
            mine = next((ln for ln in bad if ln.startswith("HELD ") and f" fd={control.group(1)} " in ln
                         and "/dev/null" in ln), None)
            if mine:
                bad.remove(mine)
                res["control"].update(reported=True, line=mine)
        res["bad_lines"] = bad[:100]
        res["reidents"] = sum(1 for ln in out.splitlines() if ln.startswith("REIDENT"))
        m = re.findall(r"^summary .*$", out, re.M)
        res["summary"] = m[-1] if m else None
        res["toggle_errors"] = [s for s in self.log if "error" in s]
        res["not_alive"] = [s["n"] for s in self.log if s.get("alive_after") is False]
        res["placed"] = [place(ln, self.log) for ln in bad]
        return res

    def cleanup(self) -> None:
        root = self.work / "runsc-root"
        if not root.is_dir():
            return
        for cid in [f"fdc-{self.o.name}-{i}" for i in range(1, self.n + 1)]:
            try:
                self.runsc.delete(cid, force=True)
            except Exception:  # noqa: BLE001 - gone already
                pass
        remove_root(root)     # with its null-netns bind mounts (docs/gvisor-notes.md)
        shutil.rmtree(self.work / "image", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runsc", required=True)
    ap.add_argument("--helper", help="host path of thaw-cuda-checkpoint (--device cuda)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", required=True, help="fd_clobber_sandbox.json, prog.out and runsc logs go here")
    ap.add_argument("--work", default="/var/tmp/fd-clobber-sandbox")
    ap.add_argument("--name", default="run", help="in every sandbox id (a test names its own)")
    ap.add_argument("--rounds", type=int, default=10, help="exec toggle rounds (to checkpointed and back) first")
    ap.add_argument("--leave", type=int, default=5, help="`runsc checkpoint --leave-running`s after them")
    ap.add_argument("--restores", type=int, default=3, help="checkpoint + restore cycles after those")
    ap.add_argument("--rounds-after-restore", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=3600, help="the program's own time limit")
    ap.add_argument("--control", action="store_true",
                    help="in the first round the program takes over one held number itself, which must be "
                         "reported (and is not counted): proves the detection end to end")
    ap.add_argument("--pause-us", type=int, default=0,
                    help="the listing threads pause this long between listings (a traced run: --runsc-flag=--strace)")
    ap.add_argument("--debug", action="store_true", help="runsc --debug logs into OUT/runsc-logs")
    ap.add_argument("--runsc-flag", action="append",
                    help="one more global runsc flag, e.g. --strace (repeat the option for more)")
    o = ap.parse_args(argv)
    if o.device == "cuda" and not o.helper:
        ap.error("--device cuda needs --helper (thaw-cuda-checkpoint)")
    Path(o.out).mkdir(parents=True, exist_ok=True)
    sb = Sandbox(o)
    try:
        res = sb.run()
    except Exception as e:  # noqa: BLE001 - a run that broke off is evidence too (2026-12-05: the sandbox died)
        res = sb.read_out(sb.res) if sb.res else {"steps": sb.log}
        res["error"] = f"{type(e).__name__}: {str(e)[-600:]}"
        res.setdefault("summary", None)
        res.setdefault("alive_at_end", False)
        print(res["error"], file=sys.stderr)
    finally:
        sb.cleanup()
        if (sb.outdir / "prog.out").exists():
            shutil.copy(sb.outdir / "prog.out", Path(o.out) / "prog.out")
    (Path(o.out) / "fd_clobber_sandbox.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res.get(k) for k in ("summary", "bad_lines", "control", "reidents", "toggle_errors",
                                          "not_alive", "alive_at_end", "placed")}, indent=1))
    if "error" in res and not res.get("bad_lines"):
        return 2
    if o.control and not res.get("control", {}).get("reported"):
        print("the control's clobber was not reported: the detection does not work", file=sys.stderr)
        return 2
    return 1 if res["bad_lines"] else 0


if __name__ == "__main__":
    sys.exit(main())
