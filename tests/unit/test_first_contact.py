"""The first-contact traps of issue 31, piece by piece (the real sandboxes:
tests/integration/test_cli_lifecycle.py and test_release_install.py)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from click.testing import CliRunner

from control import config
from control.cli import sandbox as clisb
from control.cli.common import Context
from control.errors import WorkloadExited
from control.lifecycle import logs as logsmod
from control.lifecycle.image_meta import IMAGE_LOG
from control.lifecycle.logs import keep_log, replay_log
from control.lifecycle.sandbox import Record, Sandboxes, State
from control.node import provision
from runsc_hooks import spec as specmod


# -- HOME and PATH ---------------------------------------------------------------------

def test_a_command_sandbox_has_a_private_writable_home():
    spec = specmod.command_spec(["/bin/true"], rootfs="/r")
    assert "HOME=/root" in spec["process"]["env"]
    home = [m for m in spec["mounts"] if m["destination"] == "/root"]
    assert home == [{"destination": "/root", "type": "tmpfs", "source": "tmpfs",
                     "options": ["nosuid", "nodev", "mode=700"]}]
    assert spec["root"]["readonly"] is True   # the rest stays read-only


def test_the_sandbox_path_is_the_callers_less_what_the_sandbox_cannot_see(tmp_path):
    bound = tmp_path / "tools"
    bound.mkdir()
    hidden = tmp_path / "venv" / "bin"
    hidden.mkdir(parents=True)
    caller = f"{hidden}:/usr/local/bin:{bound}:/usr/bin:/usr/bin:relative:/no/such/dir"
    path = specmod.sandbox_path(caller, [str(bound)]).split(":")
    assert path[:3] == ["/usr/local/bin", str(bound), "/usr/bin"]     # the caller's order, deduplicated
    assert str(hidden) not in path and "relative" not in path and "/no/such/dir" not in path
    assert path[3:] == [d for d in specmod.DEFAULT_PATH.split(":") if d not in path[:3]]
    assert specmod.sandbox_path("") == specmod.DEFAULT_PATH


def test_thaw_run_gives_the_sandbox_that_path(tmp_path, monkeypatch):
    seen = {}

    class FakeSandboxes:
        def run(self, sid, spec, **kw):
            seen["env"] = spec["process"]["env"]
            raise SystemExit(0)
    monkeypatch.setattr(clisb, "_sandboxes", lambda obj, debug=False: FakeSandboxes())
    monkeypatch.setattr(specmod, "prepare_host_rootfs", lambda p: p)
    obj = Context({}, False, 0)
    obj._settings = config.load(overrides={"node.state_dir": str(tmp_path)}, environ={})
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin")
    try:
        clisb.run_sandbox(obj, clisb.RunOptions("s1", None, ("true",), (), False, ()))
    except SystemExit:
        pass
    env = dict(kv.split("=", 1) for kv in seen["env"])
    assert env["PATH"].startswith("/usr/sbin:/usr/bin:") and env["HOME"] == "/root"


# -- the log across a restore ------------------------------------------------------------

def test_keep_log_keeps_the_last_bytes_from_a_line_start(tmp_path):
    logs = logsmod.SandboxLogs(tmp_path / "logs")
    logs.dir.mkdir()
    logs.rotated.write_bytes(b"".join(b"old %d\n" % i for i in range(100)))
    logs.log.write_bytes(b"new 1\nnew 2\n")
    (tmp_path / "img").mkdir()   # the image directory runsc made
    keep_log(logs, tmp_path / "img" / IMAGE_LOG, 1 << 20)
    assert (tmp_path / "img" / IMAGE_LOG).read_bytes().endswith(b"old 99\nnew 1\nnew 2\n")
    keep_log(logs, tmp_path / "small.log", 18)
    assert (tmp_path / "small.log").read_bytes() == b"new 1\nnew 2\n"       # of "ld 99\nnew 1...": from the next line
    empty = logsmod.SandboxLogs(tmp_path / "none")
    keep_log(empty, tmp_path / "empty.log", 1 << 20)
    assert not (tmp_path / "empty.log").exists()


def test_replay_log_writes_the_checkpointed_log_into_the_pipe_first(tmp_path):
    src = tmp_path / IMAGE_LOG
    src.write_bytes(b"x" * 200_000)   # more than a pipe holds: a reader drains it meanwhile
    r, w = os.pipe()
    import threading
    got = bytearray()
    reader = threading.Thread(target=_drain, args=(r, got))
    reader.start()
    replay_log(src, w, 1 << 20)
    os.close(w)
    reader.join(10)
    assert bytes(got) == b"x" * 200_000
    replay_log(tmp_path / "absent", 1, 1 << 20)   # an image without a log: nothing, no error


def _drain(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 65536):
        into.extend(chunk)
    os.close(fd)


# -- a workload that dies during `thaw run` -----------------------------------------------

def _record(settings, sid: str) -> None:
    d = settings.state_dir / "sandboxes"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{sid}.json").write_text(json.dumps(Record(sid, State.RUNNING, "/b").to_dict()))


def test_watch_returns_the_exit_of_a_workload_that_exits(tmp_path):
    s = config.load(overrides={"node.state_dir": str(tmp_path / "state"), "node.log_dir": str(tmp_path / "log")},
                    environ={})
    _record(s, "w1")
    logs = logsmod.SandboxLogs.of(s, "w1")
    logs.dir.mkdir(parents=True)
    logs.exit_file.write_text(json.dumps({"exit_status": 3, "finished_at": time.time()}))
    t0 = time.monotonic()
    ex = Sandboxes(s).watch("w1", 5.0)
    assert ex is not None and ex.status == 3 and time.monotonic() - t0 < 1   # at once, not after the grace


def test_thaw_run_fails_with_the_workloads_last_lines(monkeypatch):
    def died(obj, o):
        raise WorkloadExited(o.id, "exit status 1", 0.4, ["Traceback (most recent call last):",
                                                          "PermissionError: [Errno 30] Read-only file system"])
    monkeypatch.setattr(clisb, "run_sandbox", died)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    from control.cli.main import main
    r = CliRunner().invoke(main, ["run", "--id", "w1", "--", "/bin/true"])
    assert r.exit_code == 1
    lines = r.output.splitlines()   # CliRunner mixes stderr in
    assert "  | PermissionError: [Errno 30] Read-only file system" in lines
    assert lines[-1] == ("thaw: error: sandbox 'w1': the workload exited 0.4 s after it started (exit status 1); "
                         "`thaw logs w1` has its output, `thaw delete w1` removes it")
    assert sum(1 for ln in lines if ln.startswith("thaw: error:")) == 1
    r = CliRunner().invoke(main, ["run", "--json", "--id", "w1", "--", "/bin/true"])
    assert json.loads(r.output.split("\nthaw: error:")[0])["log_tail"][1].startswith("PermissionError")


def test_the_grace_is_a_setting():
    k = config.key("node.run_grace_s")
    assert k.default == 2.0 and k.range == (0, 600)


# -- host huge pages on a GPU node ---------------------------------------------------------

def _thp(tmp_path: Path, shmem: str, defrag: str) -> Path:
    d = tmp_path / "thp"
    d.mkdir(exist_ok=True)
    (d / "shmem_enabled").write_text(shmem)
    (d / "defrag").write_text(defrag)
    return d


def test_huge_pages_off_says_which_setting_is_wrong(tmp_path):
    assert provision.huge_pages_off(_thp(tmp_path, "always within_size [advise] never deny force",
                                         "always [defer] defer+madvise madvise never")) == ""
    assert provision.huge_pages_off(_thp(tmp_path, "always within_size advise [never] deny force",
                                         "always defer defer+madvise [madvise] never")) == \
        "shmem_enabled is never, defrag is madvise"
    assert "cannot read" in provision.huge_pages_off(tmp_path / "absent")


class _Sb:
    def __init__(self, rec):
        self.rec = rec

    def get(self, sid):
        return self.rec


def test_a_gpu_sandbox_on_a_host_without_huge_pages_gets_one_warning(tmp_path, capsys):
    obj = Context({}, False, 0)
    obj._settings = config.load(environ={})
    off = _thp(tmp_path, "[never]", "[madvise]")
    gpu = Record("g", State.RUNNING, "/b", gpus=["nvidia.com/gpu=0"], nvproxy=True)
    msg = clisb.warn_huge_pages(obj, "g", _Sb(gpu), off)
    assert msg.startswith("thaw: warning: host huge pages are off (shmem_enabled is never, defrag is madvise)")
    assert "node.huge_pages" in msg and capsys.readouterr().err.count("warning") == 1
    assert clisb.warn_huge_pages(obj, "c", _Sb(Record("c", State.RUNNING, "/b")), off) == ""   # a CPU sandbox
    on = _thp(tmp_path, "[advise]", "[defer]")
    assert clisb.warn_huge_pages(obj, "g", _Sb(gpu), on) == ""
    obj._settings = config.load(overrides={"node.huge_pages": "no"}, environ={})
    assert clisb.warn_huge_pages(obj, "g", _Sb(gpu), off) == ""
