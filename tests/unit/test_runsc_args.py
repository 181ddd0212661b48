import json
from pathlib import Path

import pytest

from control.errors import RunscError
from runsc_hooks.runsc import (CheckpointOptions, CreateOptions, GlobalOptions, RestoreOptions, Runsc,
                                cgroup_dirs, remove_cgroups, subcommand_of)


def test_global_options_render_in_order():
    g = GlobalOptions(root=Path("/r"), platform="systrap", network="none", nvproxy=True, extra=("--debug",))
    assert g.argv() == ["--root=/r", "--platform=systrap", "--network=none", "--nvproxy=true", "--debug"]
    g = GlobalOptions(root=Path("/r"), log_path=Path("/l.json"))
    assert "--log=/l.json" in g.argv() and "--log-format=json" in g.argv()


def test_create_checkpoint_restore_argv():
    c = CreateOptions(bundle=Path("/b"), pid_file=Path("/b/pid"), console_socket=Path("/s"))
    assert c.argv() == ["--bundle=/b", "--pid-file=/b/pid", "--console-socket=/s"]
    k = CheckpointOptions(image_path=Path("/i"), leave_running=True, cuda_checkpoint_path="/thaw/bin/cc")
    assert k.argv() == ["--image-path=/i", "--compression=none", "--leave-running",
                        "--cuda-checkpoint-path=/thaw/bin/cc"]
    r = RestoreOptions(image_path=Path("/i"), create=CreateOptions(bundle=Path("/b")), background=True)
    assert r.argv() == ["--image-path=/i", "--bundle=/b", "--detach", "--background"]
    assert RestoreOptions(image_path=Path("/i"), detach=False).argv() == ["--image-path=/i"]


def test_full_argv_puts_global_flags_beforesubcommand_of():
    r = Runsc(Path("/bin/runsc"), GlobalOptions(root=Path("/r")))
    argv = r.argv("state", "c1")
    assert argv[0] == "/bin/runsc" and argv[-2:] == ["state", "c1"]
    assert argv.index("--root=/r") < argv.index("state")


def test_subcommand_skips_global_flags_with_separate_values():
    assert subcommand_of(["runsc", "--root", "/r", "--debug", "checkpoint", "--image-path=/i", "c"]) == "checkpoint"
    assert subcommand_of(["runsc", "--root=/r", "restore", "c"]) == "restore"
    assert subcommand_of(["runsc"]) == "?"


def test_runsc_error_carries_message_and_command():
    e = RunscError(["runsc", "--root=/r", "start", "c1"], 128, "W1129 11:00:00.0 noise\nboom: it broke\n",
                   "boom: it broke", subcommand="start")
    assert "runsc start failed (exit 128): boom: it broke" in str(e)
    assert "\n" not in str(e)  # one line: the command line is a field (logs, --json)
    assert e.to_dict()["command"] == "runsc --root=/r start c1"
    assert e.returncode == 128 and e.argv[-1] == "c1"
    t = RunscError(["runsc", "wait", "c"], None, "", "no answer within 5 s", subcommand="wait")
    assert "timed out" in str(t)


def test_error_message_prefers_json_log_then_plain_stderr(tmp_path):
    log = tmp_path / "log.json"
    log.write_text('{"msg":"old","level":"error","time":"x"}\nnot json\n'
                   '{"msg":"the real one","level":"error","time":"y"}\n{"msg":"info","level":"info"}\n')
    r = Runsc(Path("/x"), GlobalOptions(root=Path("/r"), log_path=log))
    assert r._error_message("whatever") == "the real one"
    r = Runsc(Path("/x"), GlobalOptions(root=Path("/r")))
    assert r._error_message("I1129 12:00:00.1 log line\nplain error\nW1129 12:00:00.2 warn\n") == "plain error"
    assert r._error_message("") == "runsc printed no error message"
    # A Go panic's stack frames are never the message; an errno text wins (issue 14: ENOSPC).
    panic = ("checkpoint failed: writing pages: write /img/pages.img: no space left on device\n"
             "goroutine 1 [running]:\nmain.main()\n\t/src/runsc/main.go:42 +0x1d\nexit status 2\n")
    assert r._error_message(panic) == "checkpoint failed: writing pages: write /img/pages.img: no space left on device"
    assert r._error_message("panic: boom\n\n\t/src/x.go:1 +0x2\n") == "panic: boom"


def test_error_message_skips_a_recovered_panics_goroutine_dump():
    """The sentry's urpc server returns a recovered panic with its stack: the
    message is the line above the frames, not the last frame."""
    r = Runsc(Path("/x"), GlobalOptions(root=Path("/r")))
    stderr = ("W1130 15:05:00.1 warn\n"
              "checkpoint failed: panic: write pages: no space left on device\n"
              "goroutine 123 [running]:\n"
              "reflect.Value.Call({0x1d4e096a07e0?, 0x1d4e0a9ba048?, 0x140?}, {0x1d4e0a94bea8?, 0x16?})\n"
              "gvisor.dev/gvisor/pkg/urpc.(*Server).handleOne.func1()\n"
              "\tgvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237/pkg/urpc/urpc.go:472 +0x6b\n"
              "gvisor.dev/gvisor/pkg/urpc.(*Server).StartHandling.func1()\n")   # the H200's last line
    assert r._error_message(stderr) == "checkpoint failed: panic: write pages: no space left on device"


def test_exists_reads_runsc_state_files_exactly(tmp_path):
    """exists() names the id exactly (runsc's own lookup resolves prefixes: web vs web-2),
    from runsc's state files, without running runsc."""
    (tmp_path / "web-2+_sandbox:web-2+.state").write_text("{}")
    r = Runsc(Path("/nonexistent/runsc"), GlobalOptions(root=tmp_path))
    assert r.exists("web-2+") and not r.exists("web+") and not r.exists("web")
    (tmp_path / "web+_sandbox:pod[1].state").write_text("{}")   # glob metacharacters in the sandbox id
    assert r.exists("web+")


def test_pids_reads_runscs_json_which_is_only_pids(monkeypatch):
    """`runsc ps --format=json` prints [1, 23] (runsc/cmd/ps.go: control.PrintPIDsJSON);
    anything else is runsc's error, not an empty process list."""
    import subprocess
    r = Runsc(Path("/x"), GlobalOptions(root=Path("/r")))
    out = {"v": "[1, 23]\n"}
    monkeypatch.setattr(r, "_run", lambda args, **kw: subprocess.CompletedProcess(args, 0, out["v"], ""))
    assert r.pids("web+") == [1, 23]
    out["v"] = '[{"pid": 1}]'
    with pytest.raises(RunscError, match="no JSON list of pids"):
        r.pids("web+")


def test_cgroup_dirs_v1_lists_each_hierarchy_that_has_the_path(tmp_path):
    for d in ("cpuset/thaw/p1", "memory/thaw/p1", "cpu,cpuacct/thaw/p1", "pids/thaw"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "cpu").symlink_to("cpu,cpuacct")     # v1 co-mounts: a link per controller name
    assert cgroup_dirs("/thaw/p1", tmp_path) == [tmp_path / "cpu,cpuacct/thaw/p1", tmp_path / "cpuset/thaw/p1",
                                                 tmp_path / "memory/thaw/p1"]


def test_cgroup_dirs_v2_is_the_one_unified_directory(tmp_path):
    (tmp_path / "thaw/p1").mkdir(parents=True)
    (tmp_path / "cpuset/thaw/p1").mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu memory\n")
    assert cgroup_dirs("/thaw/p1", tmp_path) == [tmp_path / "thaw/p1"]


def test_cgroup_dirs_leaves_systemd_relative_and_root_paths_alone(tmp_path):
    (tmp_path / "cpuset/thaw/p1").mkdir(parents=True)
    for path in ("thaw/p1", "system.slice:thaw:p1", "/", "", "/thaw/../"):
        assert cgroup_dirs(path, tmp_path) == [], path


def test_remove_cgroups_removes_empty_ones_and_keeps_ones_in_use(tmp_path):
    empty, used = tmp_path / "a/p1", tmp_path / "b/p1"
    empty.mkdir(parents=True)
    (used / "child").mkdir(parents=True)   # a cgroup with a child (or processes) cannot go
    removed, left = remove_cgroups([empty, used, tmp_path / "gone"])
    assert removed == [str(empty)] and len(left) == 1 and str(used) in left[0]
    assert used.is_dir() and not empty.exists()


def test_a_goroutine_dump_in_runscs_log_never_reaches_the_message(tmp_path):
    """Issue 30: a restore whose sentry panicked logs the panic and every goroutine's stack in
    one --log "msg"; the error line got all 8,289 characters. The message is what comes
    before the dump, bounded; the log keeps the rest."""
    dump = "\n".join(f"goroutine {i} [chan receive]:\nruntime.gopark(0xc000{i:04x}?)\n"
                     f"\t/usr/lib/go/src/runtime/proc.go:{400 + i} +0xce" for i in range(200))
    msg = ("restoring container \"c\": failed to load kernel: reading state file: "
           "unexpected object type 7\n" + dump)
    log = tmp_path / "runsc.log"
    log.write_text(json.dumps({"msg": msg, "level": "error", "time": "t"}) + "\n")
    r = Runsc(Path("/x"), GlobalOptions(root=Path("/r"), log_path=log))
    got = r._error_message("")
    assert got.startswith("restoring container \"c\": failed to load kernel: reading state file: unexpected object")
    assert "goroutine 1 [" not in got and "proc.go" not in got and "\n" not in got and len(got) < 800, got
    assert str(log) in got   # where the rest is
    long = json.dumps({"msg": "x" * 5000, "level": "error"})
    log.write_text(long + "\n")
    assert len(r._error_message("")) < 800
    log.write_text(json.dumps({"msg": "plain failure", "level": "error"}) + "\n")
    assert r._error_message("") == "plain failure"
