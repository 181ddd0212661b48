#!/usr/bin/env python3
"""An experimental runsc patch (bench only, not thaw's runsc yet): place nvproxy's mirror of
page-locked application memory so the host can map it with 2 MiB entries, and log what the
mirror's fault-in costs (issue 32 item 6).

    python3 bench/gpu/patch-runsc-osdescalign.py GVISOR_COPY

Why: a parked cooperative ~8B sandbox wakes (cuda-checkpoint --toggle) in 2.17 s where the
driver's own restore of the same offloaded model takes 0.97 s; registering its 16 GB of
weights took 6.68 s in the sandbox and 4.52 s natively (docs/notes/2026-12-07-gpu-soak.md).
nvproxy serves a host-memory registration (NV01_MEMORY_SYSTEM_OS_DESCRIPTOR) in
rmAllocOSDescriptor (pkg/sentry/devices/nvproxy/frontend.go at the pin): it pins the
application range, reserves PROT_NONE address space with mmap(0, len), duplicates each of
the memory file's internal mappings into it (mremap, old_size 0) and faults the result in
with MADV_POPULATE_WRITE before the driver pins it. The memory file is MADV_HUGEPAGE and
(with provision's shmem_enabled=advise) backed by 2 MiB pages, but the host can map a huge
page into the mirror with one entry only where the mirror's address and the file offset
agree modulo 2 MiB. Nothing makes them agree: the application's buffer (glibc's mmap chunk
under a CPU tensor) is page-aligned, not huge-aligned, and the reservation is wherever the
host put it. Where they disagree, 16 GB is ~4M 4 KiB faults; bench/gpu/mirror_populate.py
measured the host step alone on the dev VM: 2 GiB in 1.2 ms congruent, 355 ms 4 KiB off.

What it changes, on top of thaw's own patches (build-runsc-variant.sh osdescalign):
- the reservation is len + 2 MiB, trimmed to len at the address congruent (mod 2 MiB) with
  the first pinned block's internal mapping, so every block whose application address and
  file offset agree (all huge-backed ones: gVisor allocates huge pages only at huge-aligned
  application addresses) lands congruent;
- for mirrors and direct mappings of 64 MiB or more, one boot-log line with the bytes, how
  many of them were placed congruent, and how long MADV_POPULATE_WRITE took
  ("thaw-osdescalign:"), so a run shows the cost with and without the patch.
Exits non-zero, naming the file, when the pinned source no longer has what this replaces."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ci"))
from runsc_patch import patch_file  # noqa: E402

HELPER_FILE = '''// Copyright 2026 thaw authors. Experimental, not upstream gVisor:
// bench/gpu/patch-runsc-osdescalign.py writes this file into a copy of the pin.

package nvproxy

import (
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/hostarch"
	"gvisor.dev/gvisor/pkg/log"
)

const thawHugeMask = uintptr(hostarch.HugePageSize - 1)

// thawReserveCongruent reserves length bytes of PROT_NONE address space starting at an
// address congruent with want modulo the huge page size, so that a mirror of a huge-page
// backed file placed there can be mapped by the host with huge page entries.
func thawReserveCongruent(length, want uintptr) (uintptr, unix.Errno) {
	span := length + uintptr(hostarch.HugePageSize)
	base, _, errno := unix.RawSyscall6(unix.SYS_MMAP, 0, span, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uintptr(0), 0)
	if errno != 0 {
		return 0, errno
	}
	m := base + ((want - base) & thawHugeMask) // (want - base) mod 2 MiB, in [0, 2 MiB)
	if m > base {
		unix.RawSyscall(unix.SYS_MUNMAP, base, m-base, 0)
	}
	if end := base + span; end > m+length {
		unix.RawSyscall(unix.SYS_MUNMAP, m+length, end-(m+length), 0)
	}
	return m, 0
}

// thawPopulate is nvproxy's MADV_POPULATE_WRITE of the range the driver will pin, timed.
func thawPopulate(m, length uintptr, mirrored bool, congruent uintptr) unix.Errno {
	t := time.Now()
	_, _, errno := unix.Syscall(unix.SYS_MADVISE, m, length, unix.MADV_POPULATE_WRITE)
	if length >= 64<<20 {
		log.Infof("thaw-osdescalign: populated %d bytes (mirror %t, %d bytes placed congruent, start mod 2MiB %#x) in %v, errno %d",
			length, mirrored, congruent, m&thawHugeMask, time.Since(t), errno)
	}
	return errno
}
'''

RESERVE_OLD = '''	if m == 0 {
		// Reserve a range in our address space.
		var errno unix.Errno
		m, _, errno = unix.RawSyscall6(unix.SYS_MMAP, 0 /* addr */, uintptr(arLen), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uintptr(0) /* fd */, 0 /* offset */)
		if errno != 0 {
			return 0, errno
		}
'''
RESERVE_NEW = '''	var thawCongruent uintptr
	if m == 0 {
		// Reserve a range in our address space, congruent (mod 2 MiB) with the first
		// pinned block's internal mapping (thaw: bench/gpu/patch-runsc-osdescalign.py).
		var want uintptr
		if len(prs) > 0 {
			if ims, err := prs[0].File.MapInternal(memmap.FileRange{prs[0].Offset, prs[0].Offset + uint64(prs[0].Source.Length())}, at); err == nil && !ims.IsEmpty() {
				want = ims.Head().Addr()
			}
		}
		var errno unix.Errno
		m, errno = thawReserveCongruent(uintptr(arLen), want)
		if errno != 0 {
			return 0, errno
		}
'''
MREMAP_OLD = '''				im := ims.Head()
				if _, _, errno := unix.RawSyscall6(unix.SYS_MREMAP,'''
MREMAP_NEW = '''				im := ims.Head()
				if (sentryAddr-im.Addr())&thawHugeMask == 0 {
					thawCongruent += uintptr(im.Len())
				}
				if _, _, errno := unix.RawSyscall6(unix.SYS_MREMAP,'''
POPULATE_OLD = '''		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, m, uintptr(arLen), unix.MADV_POPULATE_WRITE); errno != 0 {'''
POPULATE_NEW = '''		if errno := thawPopulate(m, uintptr(arLen), mOwned, thawCongruent); errno != 0 {'''


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit("usage: patch-runsc-osdescalign.py GVISOR_COPY")
    nvproxy = Path(sys.argv[1]) / "pkg/sentry/devices/nvproxy"
    patch_file("patch-runsc-osdescalign", nvproxy / "frontend.go",
               [(RESERVE_OLD, RESERVE_NEW), (MREMAP_OLD, MREMAP_NEW), (POPULATE_OLD, POPULATE_NEW)])
    (nvproxy / "thaw_osdescalign.go").write_text(HELPER_FILE)
    print(f"patch-runsc-osdescalign: {nvproxy}/frontend.go patched, thaw_osdescalign.go written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
