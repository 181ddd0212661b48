"""thawd (`thaw serve`) against an operator's mistakes and hostile input: a
second daemon, an unsafe or missing socket directory, a bundle whose
config.json is a FIFO, oversized inputs. Real `thaw serve` processes, real
gRPC over the real socket, real FIFOs; the store is a closed port."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from control.thawd.rpc import thawd_pb2 as pb
from control.thawd.rpc import thawd_pb2_grpc as pbg
from runsc_hooks import spec as specmod
from tests.integration.conftest import THAW, thaw_env
from tests.integration.faults.results import write_results


def _env(base: Path, sock: Path, state: str = "state") -> dict[str, str]:
    env = thaw_env(base)
    env.update({"THAW_NODE_STATE_DIR": str(base / state), "THAW_THAWD_SOCKET": str(sock),
                "THAW_THAWD_METRICS_ADDR": "", "THAW_CONFIG": "/dev/null",
                "THAW_STORE_ENDPOINT": "http://127.0.0.1:9", "THAW_STORE_RETRIES": "1",
                "THAW_STORE_TIMEOUT_S": "2"})
    return env


class Daemon:
    def __init__(self, base: Path, sock: Path, state: str = "state") -> None:
        self.sock = sock
        self.log = open(base / f"serve-{time.monotonic_ns()}.log", "w+")
        self.p = subprocess.Popen([str(THAW), "serve"], env=_env(base, sock, state), stdout=self.log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_serving(self, timeout_s: float = 60) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            assert self.p.poll() is None, f"thaw serve exited {self.p.returncode}: {self.output()}"
            if self.sock.exists() and _health(self.sock):
                return
            time.sleep(0.1)
        pytest.fail(f"thaw serve did not answer within {timeout_s} s: {self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)
        self.log.close()


def _health(sock: Path, timeout_s: float = 5) -> bool:
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        try:
            return pbg.ThawdStub(ch).Health(pb.HealthRequest(), timeout=timeout_s).ok
        except grpc.RpcError:
            return False


def _serve_once(base: Path, sock: Path, *args: str, state: str = "state") -> subprocess.CompletedProcess:
    return subprocess.run([str(THAW), "serve", *args], env=_env(base, sock, state), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def _one_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("thaw: error: "), p.stderr
    return lines[0]


def test_a_second_daemon_exits_69_and_the_first_serves_on(base: Path):
    sock = base / "run" / "thawd.sock"
    first = Daemon(base, sock)
    try:
        first.wait_serving()
        inode = os.stat(sock).st_ino
        second = _serve_once(base, sock)
        assert second.returncode == 69, second.stderr
        line = _one_line(second)
        assert "already runs on this node" in line and f"pid {first.p.pid}" in line, line
        # Another state dir (so another lock) on the same socket: still no take-over.
        third = _serve_once(base, sock, state="other-state")
        assert third.returncode == 69 and "another thawd serves" in _one_line(third), third.stderr
        assert os.stat(sock).st_ino == inode, "the live socket was replaced"
        assert first.p.poll() is None and _health(sock), "the first daemon must serve on"
    finally:
        first.stop()
    assert first.p.returncode == 0, first.output()
    # The lock lives as long as its daemon: once it is gone, a new one starts.
    again = Daemon(base, sock)
    try:
        again.wait_serving()
    finally:
        again.stop()


def test_serve_creates_and_tightens_only_its_own_directory(base: Path):
    # A shared, sticky, world-writable directory (like /tmp): refused, its mode untouched.
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    p = _serve_once(base, shared / "thawd.sock")
    assert p.returncode == 78 and "writable by other users" in _one_line(p), p.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777 and list(shared.iterdir()) == []
    # A directory that is not thawd's own, like /run (root, 0755): used, never chmodded.
    run = base / "run-like"
    run.mkdir()
    run.chmod(0o755)
    d = Daemon(base, run / "thawd.sock")
    try:
        d.wait_serving()
        assert stat.S_IMODE(run.stat().st_mode) == 0o755
        assert stat.S_IMODE((run / "thawd.sock").stat().st_mode) == 0o600  # the socket itself: root only
    finally:
        d.stop()
    # Missing parents are not made.
    p = _serve_once(base, base / "no" / "such" / "thawd.sock")
    assert p.returncode == 78 and "does not exist" in _one_line(p), p.stderr
    assert not (base / "no").exists()
    # Its own missing directory is made, 0700.
    d = Daemon(base, base / "own" / "thawd.sock")
    try:
        d.wait_serving()
        assert stat.S_IMODE((base / "own").stat().st_mode) == 0o700
    finally:
        d.stop()
    # A directory another user owns: refused.
    theirs = base / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    p = _serve_once(base, theirs / "thawd.sock")
    assert p.returncode == 78 and "owned by uid 65534" in _one_line(p), p.stderr


def _rt(bundle: Path, cid: str = "c1") -> pb.Runtime:
    return pb.Runtime(container_id=cid, bundle=str(bundle), runsc_root="/run/thaw-test-none")


def test_fifos_and_oversized_inputs_do_not_wedge_thawd(base: Path, name: str):
    sock = base / "run" / "thawd.sock"
    fifo = base / "fifo-bundle"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    huge = base / "huge-bundle"
    huge.mkdir()
    with open(huge / "config.json", "wb") as f:
        f.truncate(specmod.MAX_CONFIG_BYTES + 1)
    long_ann = specmod.Bundle(base / "long-annotation")
    long_ann.write(specmod.command_spec(["/bin/true"], rootfs="rootfs",
                                        annotations={"thaw.dev/workload": "w", "thaw.dev/ready": "exec:" + "x" * 5000}))
    d = Daemon(base, sock)
    results = {}
    try:
        d.wait_serving()
        ch = grpc.insecure_channel(f"unix:{sock}")
        stub = pbg.ThawdStub(ch)

        def prepare(i: int) -> tuple[str, float]:
            t0 = time.monotonic()
            try:
                stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=_rt(fifo, f"c{i}")), timeout=20)
                return "OK", time.monotonic() - t0
            except grpc.RpcError as e:
                return f"{e.code().name}: {e.details()}", time.monotonic() - t0

        # More at once than thawd has worker threads: a blocked read would wedge it.
        with ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(prepare, range(40)))
        results["fifo_prepare_calls"] = len(answers)
        results["fifo_refused"] = sum(a.startswith("INVALID_ARGUMENT") and "FIFO" in a for a, _ in answers)
        results["fifo_slowest_s"] = round(max(t for _, t in answers), 3)
        assert results["fifo_refused"] == 40, answers[:3]
        with pytest.raises(grpc.RpcError) as e:
            stub.ReportOutcome(pb.ReportOutcomeRequest(runtime=_rt(fifo), outcome=pb.ReportOutcomeRequest.COLD_STARTED),
                               timeout=20)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "FIFO" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=_rt(huge)), timeout=20)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=_rt(long_ann.path)), timeout=20)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "thaw.dev/ready" in e.value.details()
        # A request over the bound is refused by gRPC before thawd reads it.
        flags = ["--x=" + "y" * 4096] * 300   # ~1.2 MiB
        with pytest.raises(grpc.RpcError) as e:
            stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=pb.Runtime(
                container_id="c1", bundle=str(fifo), runsc_root="/r", global_flags=flags)), timeout=20)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
        t0 = time.monotonic()
        assert _health(sock), "thawd must still answer"
        results["health_after_s"] = round(time.monotonic() - t0, 3)
        ch.close()
    finally:
        d.stop()
    write_results("thawd-hostile-input", results)
    assert d.p.returncode == 0, d.output()  # and it stops cleanly: no thread is stuck on a read
