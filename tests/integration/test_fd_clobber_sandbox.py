"""bench/gpu/fd_clobber_sandbox.py on CPU (issue 32 item 1, the EBADF hunt's sandbox
step): the real runsc runs bench/gpu/fd_clobber.c as a sandbox's init with a
read-write bind-mounted spool, toggled through `runsc exec` of the (stand-in) CUDA
helper, checkpointed with --leave-running, and checkpointed and restored; the
program's listing threads never lose the directory, the restored program goes on,
and a clobber the program makes itself (the control) is reported. On the GPU the
same script runs with --device cuda and the real helper (bench/gpu/README.md)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
NAME = "test-fd-clobber-sandbox"


def test_fd_clobber_in_a_sandbox_through_exec_toggles_checkpoints_and_restores(runsc_bin, tmp_path):
    require(shutil.which("gcc") is not None, "gcc (builds bench/gpu/fd_clobber.c)")
    out, work = tmp_path / "out", tmp_path / NAME
    p = subprocess.run([sys.executable, str(REPO / "bench/gpu/fd_clobber_sandbox.py"), "--runsc", str(runsc_bin),
                        "--device", "cpu", "--out", str(out), "--work", str(work), "--name", NAME,
                        "--rounds", "4", "--leave", "3", "--restores", "2", "--rounds-after-restore", "2",
                        "--control"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    r = json.loads((out / "fd_clobber_sandbox.json").read_text())
    # The detection works: the program's own takeover of a held number was reported as HELD ...
    assert r["control"]["done"] and r["control"]["reported"] and "now=/dev/null" in r["control"]["line"], r["control"]
    # ... and nothing else was: no CLOBBER (a failed getdents64, or the number naming another file) or HELD line.
    assert r["bad_lines"] == [] and r["toggle_errors"] == [], (r["bad_lines"], r["toggle_errors"])
    m = re.match(r"summary passes=(\d+) clobbers=0 held_bad=1 reidents=\d+$", r["summary"] or "")
    assert m and int(m.group(1)) > 1000, r["summary"]
    whats = [s["what"] for s in r["steps"]]
    per_round = ["exec-toggle-to-checkpointed", "exec-toggle-to-running"]
    assert whats == per_round * 4 + ["checkpoint-leave-running"] * 3 + \
        (["checkpoint", "restore"] + per_round * 2) * 2, whats
    # Each toggle's FD tables were read on both sides: the sentry's host table and the application's.
    for s in r["steps"]:
        if s["what"].startswith("exec-toggle") or s["what"] == "checkpoint-leave-running":
            assert {"host", "app"} <= set(s) and "after_error" not in s, s
            # On CPU nothing a toggle does moves the application's numbers (the helper is a stand-in).
            assert s["app"] == {"released": {}, "took": {}, "changed": {}}, s
    # The program lived through every leave-running checkpoint and came back after every restore.
    assert r["not_alive"] == [] and r["alive_at_end"], r
    restores = [s for s in r["steps"] if s["what"] == "restore"]
    assert [s["sandbox"] for s in restores] == [f"fdc-{NAME}-2", f"fdc-{NAME}-3"]
    assert all(s["alive_after"] for s in restores) and all("/spool" in " ".join(s["fds"]["host"].values())
                                                          for s in restores)
    prog = (out / "prog.out").read_text()
    assert prog.count("ready ") == 1, "the restored program is the checkpointed one, not a new start"
    assert prog.count("HOLD ") == prog.count("CHECKED ") == 4, prog[-2000:]
    # Nothing left: the runsc root (and its null-netns binds) and the image are gone.
    assert not (work / "runsc-root").exists() and not (work / "image").exists()
