"""The runsc client against a fake runsc binary that records its argv."""
import json
import stat
import sys
import time

import pytest

from control.errors import NotFound, PreconditionError, RunscError
from runsc_hooks.runsc import CreateOptions, GlobalOptions, Runsc

FAKE = r'''#!PYTHON
import json, os, sys, time
rec = os.environ.get("FAKE_RUNSC_RECORD")
with open(rec, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
args = [a for a in sys.argv[1:] if not a.startswith("--")]
cmd = args[0] if args else ""
if cmd == "state" and args[1] == "missing":
    sys.stderr.write("W1129 10:00:00.000 1 util.go:1] FATAL ERROR: ...\nFetchSpec failed: loading container: file does not exist\n")
    sys.exit(128)
if cmd == "state":
    print(json.dumps({"id": args[1], "status": "running", "pid": 42, "bundle": "/b"}))
elif cmd == "create":
    # Like runsc: fork a long-lived child that inherits stdout/stderr.
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
elif cmd == "wait":
    time.sleep(30)
elif cmd == "start":
    sys.stderr.write("starting container: urpc failed: EOF\n")
    sys.exit(128)
elif cmd == "list":
    print(json.dumps([{"id": "a", "status": "running", "pid": 1}, {"id": "b", "status": "stopped", "pid": -1}]))
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    p = tmp_path / "runsc"
    p.write_text(FAKE.replace("PYTHON", sys.executable))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_RUNSC_RECORD", str(record))
    r = Runsc(p, GlobalOptions(root=tmp_path / "root"), timeout_s=5)
    r.record = record
    return r


def calls(r):
    return [json.loads(line) for line in r.record.read_text().splitlines()]


def test_state_parses_json_and_passes_global_flags(fake):
    st = fake.state("c1")
    assert (st.id, st.status, st.pid) == ("c1", "running", 42)
    argv = calls(fake)[-1]
    assert argv[0].startswith("--root=") and argv[-2:] == ["state", "c1"]


def test_missing_container_is_not_found(fake):
    with pytest.raises(NotFound) as e:
        fake.state("missing")
    assert e.value.name == "missing"
    assert fake.exists("missing") is False and fake.exists("c1") is True


def test_create_returns_although_a_child_keeps_stdout_open(fake, tmp_path):
    t0 = time.monotonic()
    fake.create("c1", CreateOptions(bundle=tmp_path))
    assert time.monotonic() - t0 < 4  # a pipe-based capture would hang for the child's 30 s
    assert calls(fake)[-1][-3:] == ["create", f"--bundle={tmp_path}", "c1"]


def test_failure_carries_runsc_message_and_argv(fake):
    with pytest.raises(RunscError) as e:
        fake.start("c1")
    assert e.value.runsc_message == "starting container: urpc failed: EOF"
    assert e.value.returncode == 128 and e.value.argv[-2:] == ["start", "c1"]


def test_timeout_raises_with_deadline(fake):
    t0 = time.monotonic()
    with pytest.raises(RunscError) as e:
        fake.wait("c1", timeout_s=0.5)
    assert e.value.returncode is None and "no answer within 0.5 s" in str(e.value)
    assert time.monotonic() - t0 < 5


def test_list(fake):
    assert [(c.id, c.status) for c in fake.list()] == [("a", "running"), ("b", "stopped")]


def test_missing_binary_is_a_precondition_error(tmp_path):
    r = Runsc(tmp_path / "nope", GlobalOptions(root=tmp_path))
    with pytest.raises(PreconditionError, match="runsc not found"):
        r.state("x")
