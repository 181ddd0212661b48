"""SIGKILL of the runsc stand-in at random points of a restoring `create` and
`start`, under the real stack: containerd, gVisor's shim, thaw-runsc (exec'ing
thaw-runsc-hooks), runsc, thawd and SeaweedFS. Containers start with plain
`ctr run`, as an operator's would.

A kill lands at a random delay after the stand-in process for that container
and phase appears: before thawd answered PrepareRestore, while its `runsc
create` child runs, while thawd runs `runsc restore` for `start`, or after.
After each kill, and after containerd has done what it does about a failed
create or start, the test checks:

- no runsc sandbox or process outlives its stand-in: a container containerd
  has no task for has no runsc state and no runsc process (the leak of
  issue 14: a `created` sandbox nothing reclaims);
- containerd's view and the task agree: `ctr run` succeeded exactly when the
  task is RUNNING, and containerd says RUNNING exactly when runsc does;
- after the operator's cleanup (`ctr task rm -f`, `ctr container rm`) nothing
  of the container is left (runsc state, processes, cgroup directories), and
  `ctr run` of the same id works;
- thawd recorded the outcome of every restore decision it made: restored,
  failed (restore undone) or abandoned (released before any restore), in its
  log, and its counters add up.

The counts go to $THAW_FAULTS_OUT (tests/integration/faults/results.py).
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from control.dev.containerd import NAMESPACE, RUNTIME
from control.dev.testbed import ANNOTATIONS, IMAGE, Stack
from tests.conftest import BUILD, require
from tests.integration.faults.results import write_results

# Kills per phase ($THAW_FAULTS_KILLS to measure more; the suite's default is 10 each).
KILLS = {p: int(os.environ.get("THAW_FAULTS_KILLS", "10")) for p in ("create", "start")}
MAX_ATTEMPTS = 4 * sum(KILLS.values())
# Random delay after the stand-in appears, seconds. A restoring create lives
# ~0.1 s on this 2-core VM (PrepareRestore, then `runsc create`), a restoring
# start ~0.1 s (thawd's `runsc restore`, health check, the stand-in's commit);
# a kill that comes after the stand-in exited does not count.
DELAY_S = {"create": (0.0, 0.15), "start": (0.0, 0.12)}


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _children(pid: int) -> list[int]:
    out = []
    try:   # the stand-in may exit under us: its /proc/<pid>/task goes (CI of stop 22)
        tasks = list(Path(f"/proc/{pid}/task").glob("*/children"))
    except OSError:
        return out
    for t in tasks:
        try:
            out += [int(c) for c in t.read_text().split()]
        except OSError:
            pass
    return out


def _runsc_subcommand(argv: list[str]) -> str:
    from runsc_hooks.runsc import subcommand_of
    return subcommand_of(argv) if argv else "?"


def runsc_processes(cid: str, root: Path) -> list[str]:
    """runsc processes (the CLI, the sandbox, the gofer) working on container `cid` under `root`."""
    flag = f"--root={root}"
    out = []
    for pid in _pids():
        argv = _cmdline(pid)
        if argv and flag in argv and cid in argv and Path(argv[0]).name.startswith("runsc"):
            out.append(f"{pid} {Path(argv[0]).name} {_runsc_subcommand(argv)}")
    return out


def cgroup_dirs(cid: str) -> list[str]:
    """The cgroup directories of container `cid` (ctr's cgroups path /<namespace>/<id>):
    a create killed inside runsc's cgroup set-up leaves them, and the next create of
    the id fails to join the empty cpuset one with ENOSPC (CI of stop 24)."""
    return sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{NAMESPACE}/{cid}") if p.is_dir())


class Killer(threading.Thread):
    """SIGKILL the stand-in of `cid` in `phase`, `delay_s` after it appears."""

    def __init__(self, cid: str, phase: str, delay_s: float, runsc_root: Path, standin_state: Path) -> None:
        super().__init__(daemon=True)
        self.cid, self.phase, self.delay_s = cid, phase, delay_s
        self.runsc_root, self.standin_state = runsc_root, standin_state
        self.landed = False
        self.point: dict = {}
        self.stop = threading.Event()

    def _find(self, seen: set[int]) -> int | None:
        for pid in _pids():
            if pid in seen:
                continue
            argv = _cmdline(pid)
            if not argv or Path(argv[0]).name == "thaw-runsc":
                continue          # not yet exec'ed into thaw-runsc-hooks (same pid): look again
            seen.add(pid)
            if Path(argv[0]).name == "thaw-runsc-hooks" and argv[-1] == self.cid and self.phase in argv[1:]:
                return pid
        return None

    def run(self) -> None:
        seen: set[int] = set()
        end = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < end:
            pid = self._find(seen)
            if pid is None:
                time.sleep(0.001)
                continue
            t_seen = time.monotonic()
            time.sleep(self.delay_s)
            argv = _cmdline(pid)
            if not argv or Path(argv[0]).name != "thaw-runsc-hooks":
                self.point = {"missed": "the stand-in had exited"}
                return
            children = [_runsc_subcommand(_cmdline(c)) for c in _children(pid)]
            markers = list(self.standin_state.glob(f"*-{self.cid}.json"))
            thawd_restoring = any("restore" in p for p in runsc_processes(self.cid, self.runsc_root))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                self.point = {"missed": "the stand-in had exited"}
                return
            self.landed = True
            self.point = {"after_s": round(time.monotonic() - t_seen, 4), "runsc_child": children,
                          "marker": json.loads(markers[0].read_text())["decision"] if markers else None,
                          "runsc_restore_running": thawd_restoring}
            return


def _task_status(s: Stack, cid: str) -> str:
    p = s.ctrd.ctr("task", "ls", check=False)
    for line in p.stdout.splitlines()[1:]:
        parts = line.split()
        if parts and parts[0] == cid:
            return parts[-1]
    return "absent"


def _runsc_status(root: Path, cid: str) -> str:
    p = subprocess.run([str(BUILD / "runsc"), f"--root={root}", "state", cid], capture_output=True, text=True,
                       timeout=30)
    if p.returncode != 0:
        return "absent"
    return json.loads(p.stdout).get("status", "?")


def _ctr_run(s: Stack, cid: str) -> subprocess.CompletedProcess:
    argv = ["run", "-d", "--null-io", "--runtime", RUNTIME, "--runtime-config-path", str(s.ctrd.runsc_toml)]
    for k, v in {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": cid,
                 **ANNOTATIONS}.items():
        argv += ["--annotation", f"{k}={v}"]
    return s.ctrd.ctr(*argv, IMAGE, cid, check=False, timeout_s=180)


def _thawd_lines(s: Stack, cid: str, start: int) -> list[str]:
    out = []
    for line in (s.base / "thawd.log").read_text().splitlines()[start:]:
        try:
            msg = json.loads(line)["msg"]
        except (ValueError, KeyError):
            continue
        if re.match(rf"^(prepare|restore|outcome) {re.escape(cid)} ", msg):
            out.append(msg)
    return out


def _wait(cond, timeout_s: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def _ctr(s: Stack, *args: str, timeout_s: float = 20) -> str:
    """A ctr call's outcome in a word: ok, failed or hung (it did not return in time)."""
    try:
        return "ok" if s.ctrd.ctr(*args, check=False, timeout_s=timeout_s).returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        return "hung"


def _cleanup(s: Stack, cid: str) -> list[str]:
    """What an operator does with a container whose start failed: stop the task, delete
    it, delete the container. Not `ctr task rm -f`: on a sandbox-type task whose start
    failed it waits forever for an exit gVisor's shim never sends (the shim starts its
    exit waiter only after a successful start: pkg/shim/v1/proc/init.go start,
    init_state.go createdState.Start), with plain runsc as with thaw's stand-in
    (docs/containerd.md)."""
    steps = []
    if _task_status(s, cid) in ("RUNNING", "CREATED", "PAUSED"):
        steps.append("kill:" + _ctr(s, "task", "kill", "--signal", "SIGKILL", cid))
        _wait(lambda: _task_status(s, cid) not in ("RUNNING", "CREATED", "PAUSED"), 20, 0.2)
    if _task_status(s, cid) != "absent":
        steps.append("task rm:" + _ctr(s, "task", "rm", cid))
    if cid in s.ctrd.ctr("containers", "ls", "-q", check=False).stdout.split():
        steps.append("container rm:" + _ctr(s, "containers", "rm", cid))
    return steps


def _one_kill(s: Stack, cid: str, phase: str, delay_s: float) -> dict:
    root = s.ctrd.runsc_root / "thaw"
    log_mark = len((s.base / "thawd.log").read_text().splitlines())
    killer = Killer(cid, phase, delay_s, root, s.ctrd.base / "standin")
    killer.start()
    run = _ctr_run(s, cid)
    killer.stop.set()
    killer.join(10)
    row = {"id": cid, "phase": phase, "delay_s": round(delay_s, 4), "landed": killer.landed, **killer.point,
           "ctr_run_rc": run.returncode,
           "ctr_run_error": (run.stderr.strip().splitlines() or [""])[-1][-300:] if run.returncode else ""}
    # Let what was started finish: the stand-ins containerd runs for its own
    # cleanup, and a restore thawd ran for the killed stand-in (it is undone
    # once thawd sees the call cancelled).
    hooks = lambda: any(Path(a[0]).name == "thaw-runsc-hooks" and a[-1] == cid  # noqa: E731
                        for a in map(_cmdline, _pids()) if a)
    _wait(lambda: not hooks(), 30)
    started = lambda: any(m.startswith(f"restore {cid} ") for m in _thawd_lines(s, cid, log_mark))  # noqa: E731
    if started():
        _wait(lambda: any(m.startswith(f"outcome {cid} ") for m in _thawd_lines(s, cid, log_mark)), 60)
    _wait(lambda: not any("restore" in p for p in runsc_processes(cid, root)), 30)
    task, rs = _task_status(s, cid), _runsc_status(root, cid)
    procs = runsc_processes(cid, root)
    row.update(task=task, runsc=rs, runsc_processes=len(procs))
    # A sandbox containerd has no task for is one nothing will ever reclaim.
    row["orphaned"] = task == "absent" and (rs != "absent" or bool(procs))
    row["views_agree"] = ((run.returncode == 0) == (task == "RUNNING")) and ((task == "RUNNING") == (rs == "running"))
    # The operator's cleanup, then: nothing of the container is left, and the id is free.
    row["cleanup"] = _cleanup(s, cid)
    _wait(lambda: not runsc_processes(cid, root) and _runsc_status(root, cid) == "absent", 20, 0.2)
    row["left_after_cleanup"] = runsc_processes(cid, root) + (
        [f"runsc state {_runsc_status(root, cid)}"] if _runsc_status(root, cid) != "absent" else []) + \
        cgroup_dirs(cid)
    lines = _thawd_lines(s, cid, log_mark)
    decided = [m for m in lines if m.startswith(f"prepare {cid} ") and "-> restore" in m]
    outcomes = [m.split()[3] for m in lines if m.startswith(f"outcome {cid} ")]
    row.update(restore_decisions=len(decided), thawd_outcomes=outcomes,
               outcome_recorded=len(outcomes) == len(decided))
    again = _ctr_run(s, cid)
    row["id_reusable"] = again.returncode == 0 and _wait(lambda: _task_status(s, cid) == "RUNNING", 30)
    if not row["id_reusable"]:
        row["reuse_error"] = again.stderr.strip()[-300:]
    s.ctrd.remove(cid)
    return row


def test_standin_killed_at_random_points_of_create_and_start(name, runsc_bin):
    require((BUILD / "thaw-runsc").is_file() and (BUILD / "thaw-runsc-hooks").is_file(),
            "the stand-in built at build/thaw-runsc and build/thaw-runsc-hooks")
    require((BUILD / "busybox").is_file(), "build/busybox (make setup)")
    seed = int(os.environ.get("THAW_FAULTS_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    base = Path(f"/tmp/thaw-it/{name}")
    subprocess.run(["rm", "-rf", str(base)])
    for cid in ["seed", *(f"k{i}" for i in range(MAX_ATTEMPTS))]:
        for d in cgroup_dirs(cid):   # an earlier run's: rmdir takes only empty cgroups
            subprocess.run(["rmdir", d], capture_output=True)
    s = Stack(base, name)
    rows: list[dict] = []
    try:
        s.start()
        s.ctrd.run(IMAGE, "seed", ANNOTATIONS)
        s.state("seed")
        s.wait_published()
        s.ctrd.remove("seed")
        landed = {p: 0 for p in KILLS}
        attempt = 0
        while any(landed[p] < KILLS[p] for p in KILLS) and attempt < MAX_ATTEMPTS:
            phase = next(p for p in KILLS if landed[p] < KILLS[p]) if attempt % 2 == 0 else \
                next(p for p in reversed(list(KILLS)) if landed[p] < KILLS[p])
            row = _one_kill(s, f"k{attempt}", phase, rng.uniform(*DELAY_S[phase]))
            rows.append(row)
            landed[phase] += row["landed"]
            attempt += 1
        counters = s.stats()["counters"]
        entries = s.stats()["entries"]
    finally:
        s.stop()
        subprocess.run(["rm", "-rf", str(base)])
    kills = [r for r in rows if r["landed"]]
    summary = {
        "seed": seed, "attempts": len(rows), "kills": len(kills),
        "kills_by_phase": {p: sum(r["phase"] == p for r in kills) for p in KILLS},
        "orphaned_sandboxes": sum(r["orphaned"] for r in kills),
        "left_after_cleanup": sum(bool(r["left_after_cleanup"]) for r in kills),
        "views_disagree": sum(not r["views_agree"] for r in kills),
        "id_not_reusable": sum(not r["id_reusable"] for r in rows),
        "outcome_not_recorded": sum(not r["outcome_recorded"] for r in rows),
        "ctr_run_failed": sum(r["ctr_run_rc"] != 0 for r in kills),
        "thawd_outcomes_of_killed": {o: sum(o in r["thawd_outcomes"] for r in kills)
                                     for o in ("RESTORED", "RESTORE_FAILED", "ABANDONED")},
        "cleanup_steps_not_ok": sum(any(not c.endswith(":ok") for c in r["cleanup"]) for r in kills),
    }
    decisions = counters.get("thaw_restore_decisions_total", 0)
    ended = (counters.get("thaw_restores_total", 0) + counters.get("thaw_restores_abandoned_total", 0)
             + sum(v for k, v in counters.items() if k.startswith("thaw_fallbacks_total")))
    summary["thawd_counters"] = {"restore_decisions": decisions, "outcomes": ended}
    write_results("standin-kills", {"summary": summary, "kills": rows, "thawd_counters": counters})
    print(json.dumps(summary, indent=2))
    assert summary["kills"] == sum(KILLS.values()), summary
    bad = [r for r in kills if r["orphaned"] or r["left_after_cleanup"] or not r["views_agree"]
           or any(not c.endswith(":ok") for c in r["cleanup"])]
    bad += [r for r in rows if not r["id_reusable"] or not r["outcome_recorded"]]
    assert not bad, json.dumps(bad, indent=1)
    assert decisions == ended, counters    # every restore decision ended in exactly one outcome
    assert all(e["leases"] == 0 for e in entries), entries


def test_delete_removes_the_cgroups_a_killed_create_left(name, runsc_bin):
    """What a `runsc create` SIGKILLed inside its cgroup set-up leaves (CI of stop 24):
    the container's cpuset cgroup made, its cpuset.cpus never written. runsc takes an
    existing directory for one its caller made and writes nothing into it, so the create
    of that id fails (ENOSPC joining the empty cpuset). containerd's delete after the
    failed create reaches the stand-in, which removes it: the id starts the next time."""
    require((BUILD / "thaw-runsc-hooks").is_file(), "the stand-in built at build/thaw-runsc-hooks")
    require(Path("/sys/fs/cgroup/cpuset").is_dir(), "a cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset")
    cid = "killed-cgroup"
    base = Path(f"/tmp/thaw-it/{name}")
    subprocess.run(["rm", "-rf", str(base)])
    for d in cgroup_dirs(cid):
        subprocess.run(["rmdir", d], capture_output=True)
    s = Stack(base, name)
    try:
        s.start()
        left = Path(f"/sys/fs/cgroup/cpuset/{NAMESPACE}/{cid}")
        left.mkdir(parents=True)          # as runsc's Install does, killed before it set the cpus
        assert left.joinpath("cpuset.cpus").read_text().strip() == ""
        first = _ctr_run(s, cid)
        assert first.returncode != 0, "runsc joins a pre-existing cgroup as it is: the create must fail"
        assert "no space left on device" in first.stderr, first.stderr[-500:]
        assert not left.exists(), "containerd's delete after the failed create must remove the left cgroup"
        assert cgroup_dirs(cid) == []
        s.ctrd.remove(cid)
        again = _ctr_run(s, cid)
        assert again.returncode == 0, again.stderr[-500:]
        assert _wait(lambda: _task_status(s, cid) == "RUNNING", 30)
        reaped = [d for d in s.decisions() if d.get("id") == cid and d.get("decision") == "reaped-cgroups"]
        assert len(reaped) == 1 and str(left) in reaped[0]["reason"], s.decisions()
        s.ctrd.remove(cid)
        assert cgroup_dirs(cid) == [], "runsc removes the cgroups it made at delete"
    finally:
        s.stop()
        for d in cgroup_dirs(cid):
            subprocess.run(["rmdir", d], capture_output=True)
        subprocess.run(["rm", "-rf", str(base)])
