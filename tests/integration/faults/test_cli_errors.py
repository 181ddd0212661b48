"""The CLI's promise: every error is ONE line on stderr naming what is wrong,
with the exit code control.errors.EXIT_STATUSES documents.

Every command of the click group is walked with bad input (the table below
must name each one, so a new command cannot escape), as root and as an
unprivileged user (setpriv to uid 65534: for most commands being non-root is
the bad input). The real CLI runs in a subprocess against real runsc and
real directories; the store is a closed port.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from control.cli.main import main
from control.errors import EXIT_STATUSES
from tests.conftest import BUILD, REPO, require
from tests.integration.conftest import THAW, thaw_env
from tests.integration.faults.results import write_results

DOCUMENTED = {code for code, _ in EXIT_STATUSES}
NOBODY = 65534


def _env(base: Path, **extra: str) -> dict[str, str]:
    env = thaw_env(base)
    env.update({"THAW_THAWD_SOCKET": str(base / "thawd" / "thawd.sock"), "THAW_CONFIG": "/dev/null",
                "THAW_STORE_ENDPOINT": "http://127.0.0.1:9", "THAW_STORE_RETRIES": "1",
                "THAW_STORE_TIMEOUT_S": "2", "THAW_THAWD_METRICS_ADDR": "", **extra})
    return env


def _bad_inputs(base: Path, name: str) -> dict[str, list[tuple[list[str], dict, int, str]]]:
    """command -> [(argv, extra env, exit code, text the one line must hold)]."""
    img = base / "image-without-meta"
    nodir = base / "no-such-dir"
    return {
        "config": [(["config", "--no-such-flag"], {}, 2, "No such option"),
                   (["config"], {"THAW_RUNSC_TIMEOUT_S": "abc"}, 78, "runsc.timeout_s")],
        "health": [(["health", "../../x"], {}, 2, "is invalid"),
                   (["health", f"{name}-none"], {}, 2, "not found"),
                   (["health", f"{name}-none", "--probe", "bogus:1"], {}, 2, "unknown kind")],
        "logs": [(["logs", "../../x"], {}, 2, "is invalid"),
                 (["logs", f"{name}-none"], {}, 2, "not found"),
                 (["logs", f"{name}-none", "--tail", "-1"], {}, 2, "--tail")],
        "run": [(["run"], {}, 2, "Missing option '--id'"),
                (["run", "--id", "../../escape", "--", "/bin/true"], {}, 2, "is invalid"),
                (["run", "--id", f"{name}-r"], {}, 2, "either --bundle"),
                (["run", "--id", f"{name}-r", "--bind", "/no/such/path", "--", "/bin/true"], {}, 2, "--bind"),
                (["run", "--id", f"{name}-r", "--", "/no/such/command"], {}, 2, "no such executable"),
                (["run", "--id", f"{name}-r", "--", "no-such-command-anywhere"], {}, 2, "PATH"),
                (["run", "--id", f"{name}-r", "-p", "70000:80", "--", "/bin/true"], {}, 2, "1-65535"),
                (["run", "--id", f"{name}-r", "--probe", "tcp:", "--", "/bin/true"], {}, 2, "probe")],
        "checkpoint": [(["checkpoint", f"{name}-none"], {}, 2, "Missing option '--out'"),
                       (["checkpoint", f"{name}-none", "--out", str(base / "img")], {}, 2, "not found"),
                       (["checkpoint", "../../x", "--out", str(base / "img")], {}, 2, "is invalid")],
        "restore": [(["restore", str(nodir), "--id", f"{name}-x"], {}, 2, "no such directory"),
                    (["restore", str(img), "--id", f"{name}-x"], {}, 2, "thaw.json is missing"),
                    (["restore", str(img), "--id", "../../x"], {}, 2, "is invalid")],
        "ps": [(["ps", "extra"], {}, 2, "unexpected extra argument")],
        "delete": [(["delete", f"{name}-none"], {}, 2, "not found"),
                   (["delete", "../../x"], {}, 2, "is invalid")],
        "sandbox-gc": [(["sandbox-gc", "--no-such-flag"], {}, 2, "No such option")],
        "demo": [(["demo", "--model-mb", "1"], {}, 2, "--model-mb")],
        "serve": [(["serve", "--socket", str(nodir / "deeper" / "thawd.sock")], {}, 78, "does not exist"),
                  (["serve", "--socket", "relative.sock"], {}, 78, "thawd.socket")],
        "stats": [(["stats"], {}, 69, "thawd is not running")],
        "evict": [(["evict", "k"], {}, 69, "thawd is not running")],
        "provision": [(["provision", "--root", str(base / "a-file")], {}, 2, "is a file")],
        "doctor": [(["doctor", "--root", str(base / "empty-root")], {}, 69, "failing check")],
        "uninstall": [(["uninstall", "--root", str(base / "a-file")], {}, 2, "is a file")],
        "push": [(["push", str(nodir), "--key", "k"], {}, 2, "does not exist"),
                 (["push", str(img), "--key", "k"], {}, 2, "checkpoint.img"),
                 (["push", str(img), "--key", "../k"], {}, 2, "key")],
        "pull": [(["pull", "../bad"], {}, 2, "key"),
                 (["pull", "some-key"], {}, 2, "is not tenant 'user-root''s"),   # keys carry their tenant
                 (["pull", "user-root.some-key"], {}, 69, "store")],
        "ls": [(["ls"], {}, 69, "store")],
        "gc": [(["gc", "--budget", "abc"], {}, 78, "cache.budget_bytes")],
        "rm": [(["rm", "../k"], {}, 2, "key"),
               (["rm", "other-tenant.k"], {}, 2, "is not tenant 'user-root''s"),
               (["rm", "user-root.k"], {}, 69, "store")],
        "verify": [(["verify", "no-such-key"], {}, 2, "no entry")],
    }


def _assert_one_line(p: subprocess.CompletedProcess, argv: list[str], code: int, text: str) -> None:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    shown = f"thaw {' '.join(argv)} -> exit {p.returncode}\nstderr: {p.stderr}\nstdout: {p.stdout[-2000:]}"
    assert p.returncode == code, shown
    assert p.returncode in DOCUMENTED, shown
    assert len(lines) == 1 and lines[0].startswith("thaw: error: "), shown
    assert text in lines[0], shown
    assert "Traceback" not in p.stdout + p.stderr, shown


@pytest.fixture
def walk_base(base: Path) -> Path:
    (base / "image-without-meta").mkdir()
    (base / "a-file").write_text("")
    (base / "empty-root").mkdir()
    return base


def test_every_command_refuses_bad_input_in_one_line(walk_base: Path, name: str):
    base = walk_base
    table = _bad_inputs(base, name)
    commands = set(main.commands)
    assert commands - set(table) == set(), "commands with no bad-input case in this walk"
    assert set(table) - commands == set(), "cases for commands that do not exist"
    rows = []
    for cmd in sorted(table):
        for argv, extra, code, text in table[cmd]:
            p = subprocess.run([str(THAW), *argv], env=_env(base, **extra), capture_output=True, text=True,
                               timeout=120, stdin=subprocess.DEVNULL)
            _assert_one_line(p, argv, code, text)
            rows.append({"argv": argv, "exit": p.returncode, "line": p.stderr.strip()})
    write_results("cli-bad-input", {"commands": len(table), "cases": len(rows), "one_line_documented_exit": len(rows),
                                    "cases_by_exit": {str(c): sum(r["exit"] == c for r in rows)
                                                      for c in sorted({r["exit"] for r in rows})},
                                    "rows": rows})
    # An invalid id is refused before any path is made from it.
    assert not (base / "escape").exists() and not (base.parent / "escape").exists()
    assert not (base / "state" / "rootfs").exists(), list((base / "state").rglob("*"))


def _python_for_nobody() -> str:
    """An interpreter an unprivileged user can run with this venv's packages:
    the venv's own may live under /root (0700)."""
    want = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for cand in (shutil.which(want, path="/usr/local/bin:/usr/bin:/bin"), sys.executable):
        if cand and subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                    cand, "-c", "import click, grpc, boto3"],
                                   env={"PYTHONPATH": _nobody_path(), "PATH": "/usr/bin:/bin"},
                                   capture_output=True).returncode == 0:
            return cand
    require(False, f"a {want} that uid {NOBODY} can run (e.g. /usr/bin/{want}) and setpriv")
    return ""


def _nobody_path() -> str:
    site = REPO / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    return f"{REPO}:{site}"


# The unprivileged walk: what each command needs that an ordinary user lacks.
NON_ROOT = {
    "config": (["config"], 0, ""),
    "health": (["health", "x"], 69, "needs root"),
    "run": (["run", "--id", "x", "--", "/bin/true"], 69, "needs root"),
    "checkpoint": (["checkpoint", "x", "--out", "/tmp/x-img"], 69, "needs root"),
    "restore": (["restore", "/tmp", "--id", "x"], 69, "needs root"),
    "ps": (["ps"], 69, "needs root"),
    "logs": (["logs", "x"], 69, "needs root"),
    "delete": (["delete", "x"], 69, "needs root"),
    "sandbox-gc": (["sandbox-gc"], 69, "needs root"),
    "demo": (["demo"], 69, "needs root"),
    "serve": (["serve"], 69, "needs root"),
    "stats": (["stats"], 69, "thawd"),
    "evict": (["evict", "k"], 69, "thawd"),
    "provision": (["provision", "--dry-run"], 69, "root"),
    "doctor": (["doctor"], 69, "failing check"),
    "uninstall": (["uninstall", "--dry-run"], 69, "needs root"),
    "push": (["push", "/tmp", "--key", "k"], 69, "permission denied"),
    "pull": (["pull", "k"], 69, "permission denied"),
    "ls": (["ls", "--local"], 69, "permission denied"),
    "gc": (["gc"], 69, "permission denied"),
    "rm": (["rm", "user-nobody.k"], 69, "store"),
    "verify": (["verify"], 69, "permission denied"),
}


def test_every_command_as_non_root_says_one_line(walk_base: Path):
    base = walk_base
    require(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    py = _python_for_nobody()
    assert set(main.commands) == set(NON_ROOT), "every command has a non-root case"
    # thaw's directories as a node has them: root's, closed to others.
    for d in ("state", "cache", "thawd"):
        (base / d).mkdir(mode=0o700, exist_ok=True)
    env = _env(base) | {"PYTHONPATH": _nobody_path(), "HOME": "/tmp", "PATH": "/usr/bin:/bin"}
    rows = []
    for cmd, (argv, code, text) in sorted(NON_ROOT.items()):
        p = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            py, "-m", "control.cli.main", *argv], env=env, capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL, cwd="/")   # cwd: no other checkout on sys.path
        rows.append({"argv": argv, "exit": p.returncode, "line": p.stderr.strip()})
        if code == 0:
            assert p.returncode == 0 and not p.stderr.strip(), (cmd, p.returncode, p.stderr)
            continue
        _assert_one_line(p, argv, code, text)
    write_results("cli-non-root", {"uid": NOBODY, "commands": len(rows), "rows": rows})
