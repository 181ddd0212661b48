"""bench/gpu/fd_trace_focus.py (the part of a traced sandbox's boot log that can name
who closed a number) and fd_clobber_sandbox.place (where a CLOBBER line fell)."""
from __future__ import annotations

from .benchmods import load_bench_gpu


focus = load_bench_gpu("fd_trace_focus")

PROG = """threads main=1 lister=4 lister=5 opener=6 cuda=7
ready 1
CLOBBER 1796494349.935956 tid=4 before-close fd=10 errno=0 (-) now=(closed: No such file or directory)
"""
# Lines as runsc --strace writes them (2026-12-05 18:12:29 UTC is 1796494349).
LOG = [
    "I1205 18:12:29.935414       1 strace.go:563] [   1:   2] cuda00001400006 E close(0xa /dev/nvidia-uvm)\n",
    "I1205 18:12:29.935466       1 strace.go:610] [   1:   4] fd_clobber X openat(AT_FDCWD /, 0x1 /spool, O_RDONLY) = 10 (0xa)\n",
    "I1205 18:12:20.000000       1 strace.go:610] [   1:   4] fd_clobber X openat(AT_FDCWD /, 0x1 /spool, O_RDONLY) = 11 (0xb)\n",
    "I1205 18:12:20.000100       1 strace.go:572] [   1:   1] fd_clobber E clock_nanosleep(0x0, 0x0, 0x1, 0x0)\n",
    "I1205 18:12:20.000200       1 strace.go:572] [   1:   6] fd_clobber E openat(AT_FDCWD /, 0x1 /proc/self/status, 0x0)\n",
    "I1205 18:12:20.000300       1 strace.go:563] [  12(   3):  12(   3)] cuda-checkpoint E close(0x3 /etc/ld.so.cache)\n",
    "D1205 18:12:29.900000       1 timing.go:125] Timer for Restore: reached midpoint\n",
]


def test_the_focus_keeps_other_threads_and_the_listers_only_near_a_clobber():
    noisy = focus.noisy_tids(PROG)
    assert noisy == {4, 5, 6}
    kept = list(focus.focus(LOG, noisy, focus.events(PROG), year=2026))
    assert LOG[0] in kept                      # libcuda's thread: always
    assert LOG[1] in kept                      # the lister 0.5 ms before the clobber
    assert LOG[2] not in kept                  # the lister 9 s before it: noise
    assert LOG[3] not in kept                  # the main loop's sleep
    assert LOG[4] not in kept                  # the opener thread
    assert LOG[5] in kept                      # another process (in-namespace ids in parentheses)
    assert LOG[6] in kept                      # runsc's own line


def test_the_focus_refuses_an_output_without_its_threads_line(tmp_path, capsys):
    (tmp_path / "prog.out").write_text("ready 1\n")
    (tmp_path / "boot.log").write_text("".join(LOG))
    assert focus.main(["x", str(tmp_path / "boot.log"), str(tmp_path / "prog.out")]) == 2
    assert "no threads line" in capsys.readouterr().err


def test_a_clobber_is_placed_in_the_step_it_fell_in_or_after_the_last_one():
    sandbox = load_bench_gpu("fd_clobber_sandbox")
    steps = [{"n": 1, "what": "exec-toggle-to-checkpointed", "t0": 100.0, "t1": 100.5},
             {"n": 2, "what": "exec-toggle-to-running", "t0": 101.0, "t1": 101.4}]
    assert sandbox.place("CLOBBER 101.2 tid=4 getdents64 fd=10", steps)["during"] == "2 exec-toggle-to-running"
    after = sandbox.place("CLOBBER 102.0 tid=4 getdents64 fd=10", steps)
    assert after["after"] == "2 exec-toggle-to-running" and after["gap_s"] == 0.6
    assert "during" not in sandbox.place("CLOBBER 99.0 tid=4 getdents64 fd=10", steps)
