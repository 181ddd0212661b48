"""control/thawd/shimlogs.py: a running shim's log keeps its last bytes on disk, freed
in place while a writer holds it open as gVisor's shim does (os.Create: no O_APPEND),
whose next write lands where it would have."""
from __future__ import annotations

import errno
import os
import time

import pytest

from control.thawd import shimlogs

KEEP = 256 << 10


def lines(start: int, n: int) -> bytes:
    return b"".join(b'time="2026-12-04T08:00:00Z" level=debug msg="Executing: [runsc events --stats c1]" n=%08d\n'
                    % i for i in range(start, start + n))


def shim_log(path, n: int = 40_000) -> tuple[int, bytes]:
    """A log as the shim writes it: opened once with O_TRUNC and no O_APPEND, written through
    that descriptor (kept open: the shim's). (the descriptor, what it wrote)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    data = lines(0, n)
    os.write(fd, data)
    return fd, data


def on_disk(path) -> int:
    return os.stat(path).st_blocks * 512


def test_a_running_shims_log_keeps_its_last_lines_on_disk_and_its_writes_land_as_before(tmp_path):
    p = tmp_path / "runsc-shim-c1.log"
    fd, data = shim_log(p)
    try:
        assert on_disk(p) > 3 << 20
        freed = shimlogs.punch(p, KEEP)
        st = os.stat(p)
        assert st.st_size == len(data) and freed > (3 << 20) - KEEP
        assert on_disk(p) <= KEEP + 2 * st.st_blksize
        body = p.read_bytes()
        kept = body.lstrip(b"\0")
        assert len(kept) <= KEEP and data.endswith(kept) and kept.startswith(b'time="'), "whole lines are kept"
        assert body[:len(body) - len(kept)].count(b"\0") == len(body) - len(kept)
        os.write(fd, b"after\n")                     # the shim writes on, at its own offset
        assert os.stat(p).st_size == len(data) + 6 and p.read_bytes().endswith(data[-100:] + b"after\n")
        assert shimlogs.punch(p, KEEP) == 0          # within the bound: nothing to do
    finally:
        os.close(fd)


def test_a_log_within_the_bound_is_left_as_it_is(tmp_path):
    p = tmp_path / "runsc-shim-small.log"
    fd, data = shim_log(p, n=100)
    os.close(fd)
    assert shimlogs.punch(p, KEEP) == 0 and p.read_bytes() == data


def test_a_pass_bounds_every_shim_log_and_nothing_else(tmp_path):
    fds = []
    for name in ("runsc-shim-a.log", "runsc-shim-b.log", "runsc-shim-c.log.cut", "other.log"):
        fds.append(shim_log(tmp_path / name)[0])
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "not-a-shim-log"
    os.close(shim_log(target)[0])
    (tmp_path / "runsc-shim-link.log").symlink_to(target)      # never followed
    try:
        logs = shimlogs.ShimLogs(tmp_path, KEEP)
        assert logs.step() > 2 * ((3 << 20) - KEEP)
        for name in ("runsc-shim-a.log", "runsc-shim-b.log"):
            assert on_disk(tmp_path / name) <= KEEP + 2 * os.stat(tmp_path / name).st_blksize
        for p in (tmp_path / "runsc-shim-c.log.cut", tmp_path / "other.log", target):
            assert on_disk(p) > 3 << 20 and b"\0" not in p.read_bytes()[:100], p
        assert logs.step() == 0
    finally:
        for fd in fds:
            os.close(fd)


def test_the_thread_runs_a_pass_at_once_and_stops(tmp_path):
    fd, _ = shim_log(tmp_path / "runsc-shim-t.log")
    logs = shimlogs.ShimLogs(tmp_path, KEEP, interval_s=3600).start()
    try:
        deadline = time.monotonic() + 10
        while logs.freed == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logs.freed > (3 << 20) - KEEP
    finally:
        logs.stop()
        os.close(fd)
    logs._thread.join(timeout=10)
    assert not logs._thread.is_alive()


def test_a_file_system_that_cannot_punch_holes_is_said_once_and_left_alone(tmp_path, monkeypatch, caplog):
    os.close(shim_log(tmp_path / "runsc-shim-x.log")[0])
    os.close(shim_log(tmp_path / "runsc-shim-y.log")[0])
    calls = []

    def refuse(path, keep):
        calls.append(path)
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), str(path))
    monkeypatch.setattr(shimlogs, "punch", refuse)
    logs = shimlogs.ShimLogs(tmp_path, KEEP)
    assert logs.step() == 0 and len(calls) == 1
    assert "cannot punch holes" in logs.unsupported and logs._stop.is_set()
    assert [r for r in caplog.records if "stay unbounded" in r.getMessage()]


@pytest.mark.parametrize("keep", [64 << 10, 1 << 20])
def test_the_bound_is_the_setting(tmp_path, keep):
    p = tmp_path / "runsc-shim-k.log"
    fd, data = shim_log(p)
    try:
        shimlogs.punch(p, keep)
        kept = p.read_bytes().lstrip(b"\0")
        assert keep - 200 <= len(kept) <= keep and data.endswith(kept)
    finally:
        os.close(fd)
