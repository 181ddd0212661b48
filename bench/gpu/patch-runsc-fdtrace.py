#!/usr/bin/env python3
"""A diagnostics runsc patch (bench only, never thaw's runsc): trace the host
file descriptors nvproxy opens and closes, and say what a directory listing that
fails with EBADF/ENOTDIR was reading, to find the stray close behind the open
EBADF bug (docs/gvisor-notes.md, "EBADF listing a bind-mounted directory after
a GPU restore").

    python3 bench/gpu/patch-runsc-fdtrace.py GVISOR_COPY

What it adds, on top of thaw's own patches (build-runsc-variant.sh fdtrace):
- pkg/sentry/devices/nvproxy: every unix.Close of a host FD goes through
  thawTraceClose, which fstat()s the number first (fstat is in the sentry's
  seccomp filters; readlink of /proc/self/fd is not) and logs it: a number
  that is not open ("DOUBLE close") or that is not a character device (a
  directory, a regular file: "STRAY close") is logged as a warning with the
  caller's stack; the others as info lines. Every host device file nvproxy
  opens is logged with its number.
- pkg/sentry/fsimpl/gofer directfsInode.getDirentsLocked: when seeking or
  reading the directory's host FD fails, a warning with the FD number, the
  error, what fstat says the number is now, and the dentry's path.
The lines start with "thaw-fdtrace:" in the sandbox's boot log. Exits non-zero,
naming the file, when the pinned source no longer has what this replaces."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ci"))
from runsc_patch import patch_file  # noqa: E402

TRACE_FILE = '''// Copyright 2026 thaw authors. Diagnostics, not upstream gVisor:
// bench/gpu/patch-runsc-fdtrace.py writes this file into a copy of the pin.

package nvproxy

import (
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/log"
)

func thawCallers(skip int) string {
	pcs := make([]uintptr, 8)
	n := runtime.Callers(skip, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var b strings.Builder
	for {
		f, more := frames.Next()
		fmt.Fprintf(&b, " <- %s:%d", f.Function[strings.LastIndex(f.Function, "/")+1:], f.Line)
		if !more {
			break
		}
	}
	return b.String()
}

// thawTraceClose is unix.Close with a log line saying what the number was.
func thawTraceClose(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		log.Warningf("thaw-fdtrace: DOUBLE close of host fd %d by nvproxy (fstat: %v)%s", fd, err, thawCallers(2))
	} else if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		log.Warningf("thaw-fdtrace: STRAY close of host fd %d by nvproxy: mode %#o ino %d dev %d, no device%s",
			fd, st.Mode, st.Ino, st.Dev, thawCallers(2))
	} else {
		log.Infof("thaw-fdtrace: nvproxy close fd %d (char %d:%d)%s", fd, unix.Major(st.Rdev), unix.Minor(st.Rdev), thawCallers(2))
	}
	return unix.Close(fd)
}

func thawTraceOpen(what string, fd int32) {
	log.Infof("thaw-fdtrace: nvproxy open %s -> fd %d%s", what, fd, thawCallers(3))
}
'''

VICTIM = '''	readFD := int(i.readFD.RacyLoad())
	thawReport := func(step string, err error) error {
		if err == unix.EBADF || err == unix.ENOTDIR {
			var st unix.Stat_t
			serr := unix.Fstat(readFD, &st)
			log.Warningf("thaw-fdtrace: getdents of %q failed at %s on host fd %d: %v; fstat now: mode %#o ino %d dev %d (err %v)",
				genericDebugPathname(i.fs, d), step, readFD, err, st.Mode, st.Ino, st.Dev, serr)
		}
		return err
	}
	if _, err := unix.Seek(readFD, 0, 0); err != nil {
		return thawReport("seek", err)
	}

	return thawReport("read", fsutil.ForEachDirent(readFD, func(ino uint64, off int64, ftype uint8, name string, reclen uint16) {'''

VICTIM_OLD = '''	readFD := int(i.readFD.RacyLoad())
	if _, err := unix.Seek(readFD, 0, 0); err != nil {
		return err
	}

	return fsutil.ForEachDirent(readFD, func(ino uint64, off int64, ftype uint8, name string, reclen uint16) {'''


def main() -> None:
    root = Path(sys.argv[1])
    nv = root / "pkg/sentry/devices/nvproxy"
    (nv / "thaw_fdtrace.go").write_text(TRACE_FILE)
    closes = 0
    for f in sorted(nv.glob("*.go")):
        if f.name.endswith("_test.go") or f.name == "thaw_fdtrace.go":
            continue
        text = f.read_text()
        n = text.count("unix.Close(")
        if not n:
            continue
        closes += n
        text = text.replace("unix.Close(", "thawTraceClose(")
        if "unix." not in text:
            text = text.replace('\t"golang.org/x/sys/unix"\n', "")
        f.write_text(text)
    if closes < 8:
        sys.exit(f"patch-runsc-fdtrace: only {closes} unix.Close calls in nvproxy; re-check the pin")
    for fname, var in (("nvproxy.go", "hostFD"), ("save_restore.go", "hostFD")):
        p = nv / fname
        text = p.read_text()
        new, n = re.subn(r"(\n(\t+)return int32\(hostFD\)(, containerName, nil|, \"\", nil|)\n)",
                         lambda m: f"\n{m.group(2)}thawTraceOpen(relpath, int32(hostFD)){m.group(1)}", text)
        if n < 1:
            sys.exit(f"patch-runsc-fdtrace: {p}: no `return int32(hostFD)` to trace")
        p.write_text(new)
    patch_file("patch-runsc-fdtrace", root / "pkg/sentry/fsimpl/gofer/directfs_inode.go",
               [(VICTIM_OLD, VICTIM), ('''		recordDirent(name, inoKeyFromStat(&stat), ftype)
	})
}''', '''		recordDirent(name, inoKeyFromStat(&stat), ftype)
	}))
}''')])
    print(f"patch-runsc-fdtrace: {closes} nvproxy closes traced, opens logged, getdents failures reported")


if __name__ == "__main__":
    main()
