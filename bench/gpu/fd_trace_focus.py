"""The part of a runsc --strace boot log that can name who closed a number
(bench/gpu/fd_clobber_sandbox.py; docs/gvisor-notes.md, the EBADF hunt).

fd_clobber's listing and opener threads make most of a traced sandbox's log (an open,
two getdents64, fstats and a close per listing). What can show a stray close is
everything else: every syscall of the other threads of the program (libcuda's and its
CUDA thread) and of other processes (the helper, `runsc exec`'s shell), plus the
listers' own lines close to each CLOBBER line. This keeps exactly that.

  python3 bench/gpu/fd_trace_focus.py BOOT_LOG PROG_OUT > focus.txt
"""
from __future__ import annotations

import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

# runsc's task log prefix (pkg/sentry/kernel/task_log.go updateInfoLocked):
# "[ PID: TID] " or "[ROOTPID( PID):ROOTTID( TID)] ", then the strace line "NAME E|X syscall(...)".
TASK = re.compile(r"\[\s*(\d+)(?:\(\s*(\d+)\))?:\s*(\d+)(?:\(\s*(\d+)\))?\] ")
# glog's header: I1205 18:10:11.427279 (the month and day, the time of day, UTC on the device)
STAMP = re.compile(r"^[IWEDF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+)")
THREADS = re.compile(r"^threads main=(\d+) lister=(\d+) lister=(\d+) opener=(\d+) cuda=(\d+)", re.M)
# fd_clobber's main loop and CUDA thread sleep 1 ms / 10 ms at a time and read the clock (traced, not vDSO): thousands of lines
# a second that touch no descriptor.
SLEEP = re.compile(r" [EX] (clock_nanosleep|nanosleep|clock_gettime)\(")
EVENT = re.compile(r"^(CLOBBER|HELD) (\d+\.\d+) ", re.M)


def noisy_tids(prog_out: str) -> set[int]:
    """The listing and opener threads of every fd_clobber the output names (a restored
    program keeps its thread ids)."""
    return {int(t) for m in THREADS.finditer(prog_out) for t in (m.group(2), m.group(3), m.group(4))}


def events(prog_out: str) -> list[float]:
    return [float(m.group(2)) for m in EVENT.finditer(prog_out)]


def stamp(line: str, year: int) -> float | None:
    m = STAMP.match(line)
    if not m:
        return None
    mo, d, h, mi, s = m.groups()
    base = datetime(year, int(mo), int(d), int(h), int(mi), tzinfo=timezone.utc).timestamp()
    return base + float(s)


def focus(lines: Iterable[str], noisy: set[int], at: list[float], window_s: float = 0.05,
          year: int | None = None) -> Iterator[str]:
    """Lines of a boot log a reader needs: those of tasks other than the noisy threads
    (less their sleeps), and every line within window_s of an event time."""
    year = year or datetime.now(timezone.utc).year
    for line in lines:
        m = TASK.search(line)
        if not m:
            yield line       # runsc's own lines (the toggles, restore, nvproxy) stay
            continue
        tid = int(m.group(4) or m.group(3))
        if tid not in noisy and not SLEEP.search(line):
            yield line
            continue
        t = stamp(line, year)
        if t is not None and any(abs(t - e) <= window_s for e in at):
            yield line


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    prog = Path(argv[2]).read_text(errors="replace")
    noisy = noisy_tids(prog)
    if not noisy:
        print(f"{argv[2]}: no threads line (an fd_clobber older than the trace focus?)", file=sys.stderr)
        return 2
    with open(argv[1], errors="replace") as f:
        for line in focus(f, noisy, events(prog)):
            sys.stdout.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
