"""control/lifecycle/logs.py (reading what thaw-monitor writes) and what makes an
image node-local (control/lifecycle/image_meta.py node_local)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from control.lifecycle import logs
from control.lifecycle.image_meta import node_local
from nvproxy import helper
from runsc_hooks import spec as specmod


def files(tmp_path) -> logs.SandboxLogs:
    d = logs.SandboxLogs(tmp_path / "web")
    d.dir.mkdir()
    return d


def test_tail_reads_across_the_rotation(tmp_path):
    f = files(tmp_path)
    assert f.tail() == (b"", 0) and f.tail(3) == (b"", 0)
    f.rotated.write_bytes(b"1\n2\n3\n")
    f.log.write_bytes(b"4\n5\n")
    assert f.tail() == (b"1\n2\n3\n4\n5\n", 4)
    assert f.tail(3) == (b"3\n4\n5\n", 4)
    assert f.tail(0) == (b"", 4)
    f.log.write_bytes(b"4\n5\nhalf")
    assert f.tail(2) == (b"5\nhalf", 8)


def test_exit_file_variants(tmp_path):
    f = files(tmp_path)
    assert f.exit() is None
    f.exit_file.write_text(json.dumps({"exit_status": 3, "finished_at": 1.5, "error": ""}))
    assert f.exit() == logs.Exit(3, 1.5, "") and f.exit().describe() == "exit status 3"
    f.exit_file.write_text(json.dumps({"exit_status": 137, "finished_at": 2, "error": ""}))
    assert f.exit().describe() == "exit status 137 (killed by SIGKILL)"
    f.exit_file.write_text(json.dumps({"exit_status": None, "finished_at": 2, "error": "sandbox gone"}))
    assert f.exit().describe() == "exit status unknown (sandbox gone)"
    f.exit_file.write_text("{half")
    assert f.exit().status is None and "not valid JSON" in f.exit().error


def test_an_exit_runsc_saw_first_waits_for_the_monitor_that_writes_it(tmp_path):
    """runsc says stopped a few ms before the monitor writes exit.json (CI of stop 22:
    `thaw ps` said "no monitor saw it" for a workload whose monitor did)."""
    from control.files import Owner, process_start
    f = files(tmp_path)
    mon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        owner = Owner(mon.pid, process_start(mon.pid)).to_dict()
        threading.Timer(0.3, lambda: f.exit_file.write_text(
            json.dumps({"exit_status": 7, "finished_at": 1.0, "error": ""}))).start()
        t0 = time.monotonic()
        assert logs.settled_exit(f, owner, timeout_s=5).status == 7
        assert 0.25 < time.monotonic() - t0 < 3
        f.exit_file.unlink()
        t0 = time.monotonic()
        assert logs.settled_exit(f, owner, timeout_s=0.2) is None      # bounded
        assert time.monotonic() - t0 < 1
    finally:
        mon.kill()
        mon.wait()
    t0 = time.monotonic()
    assert logs.settled_exit(f, owner, timeout_s=5) is None and time.monotonic() - t0 < 1   # monitor gone
    assert logs.settled_exit(f, None, timeout_s=5) is None and time.monotonic() - t0 < 1


def test_follow_goes_across_a_rotation_and_ends_with_the_monitor(tmp_path):
    f = files(tmp_path)
    f.log.write_bytes(b"a\n")
    alive = [True]
    got: list[bytes] = []

    def writer():
        time.sleep(0.1)
        with open(f.log, "ab") as w:
            w.write(b"b\n")
        time.sleep(0.1)
        with open(f.log, "ab") as w:
            w.write(b"c\n")
        os.rename(f.log, f.rotated)        # what thaw-monitor does at the bound
        f.log.write_bytes(b"d\n")
        time.sleep(0.1)
        alive[0] = False
    t = threading.Thread(target=writer)
    t.start()
    for chunk in logs.follow(f, 2, lambda: alive[0], poll_s=0.01):
        got.append(chunk)
    t.join()
    assert b"".join(got) == b"b\nc\nd\n"


def test_a_dead_or_missing_monitor_is_not_alive():
    assert logs.monitor_alive(None) is False
    assert logs.monitor_alive({"pid": os.getpid(), "start": "not-my-start"}) is False
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    from control.files import process_start
    owner = {"pid": p.pid, "start": process_start(p.pid)}
    deadline = time.monotonic() + 10
    while logs.monitor_alive(owner) and time.monotonic() < deadline:   # a zombie child counts as gone
        time.sleep(0.01)
    assert not logs.monitor_alive(owner)
    p.returncode = 0   # reaped by monitor_alive


def test_node_local_names_bundle_roots_and_private_binds(tmp_path):
    host = specmod.command_spec(["/usr/bin/python3", "-c", "1"], rootfs=str(tmp_path / "state/rootfs/x"),
                                extra_mounts=specmod.host_layout())
    assert node_local({"spec": host, "rootfs": {"layout": "host"}}) == []
    helper_mount = specmod.bind_mount("/var/lib/thaw/cuda-helper", helper.HELPER_DIR)
    gpu = dict(host, mounts=[*host["mounts"], helper_mount])
    assert node_local({"spec": gpu, "rootfs": {"layout": "host"}}) == []
    private = dict(host, mounts=[*host["mounts"], specmod.bind_mount("/srv/models", "/models")])
    assert node_local({"spec": private, "rootfs": {"layout": "path", "path": "/srv/b/rootfs"}}) == [
        "root filesystem /srv/b/rootfs", "bind mount /srv/models -> /models"]
