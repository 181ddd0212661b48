#!/usr/bin/env python3
"""thaw's fourth runsc patch: a restored CUDA process's second close of its
temporary /dev/nvidia-uvm number no longer closes another thread's file
(ci/build-go.sh; docs/gvisor-notes.md, "EBADF listing a bind-mounted directory
after a GPU restore").

    python3 ci/patch-runsc-uvmclose.py GVISOR_COPY

What happens at the pin, with driver 580.159.04 (H100 and H200; runsc --strace of a
sandbox, bench/gpu/fd_clobber_sandbox.py, 2026-12-05): inside gVisor, libcuda runs
without its second UVM descriptor (it opens one for UVM_MM_INITIALIZE at start and
closes it again at once; natively it keeps it). On that path its restore (the CUDA
toggle back to running, in libcuda's own checkpoint thread) does

    T = openat("/dev/nvidia-uvm")      the lowest free number
    dup3(T, R, O_CLOEXEC)               R: the number the checkpoint kept with an eventfd
    close(T)
    ioctl(R, UVM_INITIALIZE)            ~0.1 ms through nvproxy
    close(T)                            again: EBADF, or another thread's file

in 16 of 16 toggles traced. When another thread of the process opens a file in the
window (it takes T, the lowest free number), the second close closes that file under
it: the model server's listing of its spool failed with EBADF (or ENOTDIR once the
number was reused again), in every GPU failure thaw had recorded. The native driver's
normal path (two UVM descriptors) closes the number once (bench/gpu/close_trace.c, 10
toggles, no second close).

The patch holds the number between the two closes: after a task dup'd a UVM number
T elsewhere, that task's first close(T) leaves T open (the same UVM file as R, so
nothing changes for the driver) and its next close releases it: close(T) itself (the
second close: T closes once, and the number was never free for another thread to
take) or a close of another number (a libcuda that closes T once: T is closed then,
before that other close). The only visible difference: T stays taken for the
~0.1 ms between the two closes. Not reported upstream when written (2026-12-05):
the double close is libcuda's; the path that reaches it is gVisor's.
Exits non-zero, naming the file, when the pinned source no longer has what this
replaces."""
from __future__ import annotations

import sys
from pathlib import Path

from runsc_patch import patch_file


def patch(path: Path, old: str, new: str) -> None:
    patch_file("patch-runsc-uvmclose", path, [(old, new)])


NVPROXY_FILE = '''// Copyright 2026 thaw authors. Not upstream gVisor: ci/patch-runsc-uvmclose.py
// writes this file into thaw's copy of the pin.

package nvproxy

// ThawUVMFile marks a /dev/nvidia-uvm file description for the syscall layer,
// which holds a dup'd UVM number between libcuda's two closes of it
// (pkg/sentry/syscalls/linux/thaw_uvm_close.go).
func (fd *uvmFD) ThawUVMFile() {}
'''

SYSCALLS_FILE = '''// Copyright 2026 thaw authors. Not upstream gVisor: ci/patch-runsc-uvmclose.py
// writes this file into thaw's copy of the pin.

package linux

import (
	"gvisor.dev/gvisor/pkg/atomicbitops"
	"gvisor.dev/gvisor/pkg/sentry/kernel"
	"gvisor.dev/gvisor/pkg/sentry/vfs"
	"gvisor.dev/gvisor/pkg/sync"
)

// thawUVMFile is implemented by nvproxy's /dev/nvidia-uvm file description.
type thawUVMFile interface{ ThawUVMFile() }

// thawUVMHold is a task's dup'd UVM number: armed by the dup, held (closed) by
// the task's first close of it, released by the task's next close.
type thawUVMHold struct {
	fd     int32
	closed bool
}

var thawUVM struct {
	// n is len(hold), read without mu: every close(2) of every sandbox passes
	// here, and only a CUDA restore's few microseconds ever hold anything.
	n    atomicbitops.Int32
	mu   sync.Mutex
	hold map[*kernel.Task]thawUVMHold
}

// thawUVMDup arms the hold after t dup'd oldfd, a UVM number, onto another.
// libcuda's restore does that with the temporary number it then closes twice.
func thawUVMDup(t *kernel.Task, oldfd int32, file *vfs.FileDescription) {
	if _, ok := file.Impl().(thawUVMFile); !ok {
		return
	}
	thawUVM.mu.Lock()
	prev, had := thawUVM.hold[t]
	if thawUVM.hold == nil || len(thawUVM.hold) > 64 {
		// Tasks that exited holding: forget them (their number stays a UVM
		// file, as a libcuda that never closed it would leave it).
		thawUVM.hold = make(map[*kernel.Task]thawUVMHold)
	}
	thawUVM.hold[t] = thawUVMHold{fd: oldfd}
	thawUVM.n.Store(int32(len(thawUVM.hold)))
	thawUVM.mu.Unlock()
	if had && prev.closed && prev.fd != oldfd {
		thawUVMRelease(t, prev.fd)
	}
}

// thawUVMClose is the start of close(fd) by t. It returns true when the close
// is the first of a held number: the number stays open (and close returns 0).
func thawUVMClose(t *kernel.Task, fd int32) bool {
	if thawUVM.n.Load() == 0 {
		return false
	}
	thawUVM.mu.Lock()
	h, ok := thawUVM.hold[t]
	if !ok {
		thawUVM.mu.Unlock()
		return false
	}
	if !h.closed && h.fd == fd {
		thawUVM.hold[t] = thawUVMHold{fd: fd, closed: true}
		thawUVM.mu.Unlock()
		t.Debugf("thaw: fd %d (a /dev/nvidia-uvm number dup'd elsewhere) held until this task's next close", fd)
		return true
	}
	delete(thawUVM.hold, t)
	thawUVM.n.Store(int32(len(thawUVM.hold)))
	thawUVM.mu.Unlock()
	if h.closed && h.fd != fd {
		thawUVMRelease(t, h.fd)
	} else if h.closed {
		t.Debugf("thaw: fd %d: the second close of a held /dev/nvidia-uvm number closes it", fd)
	}
	return false
}

// thawUVMRelease closes a held number that still names a UVM file.
func thawUVMRelease(t *kernel.Task, fd int32) {
	f := t.GetFile(fd)
	if f == nil {
		return
	}
	_, uvm := f.Impl().(thawUVMFile)
	f.DecRef(t)
	if !uvm {
		return
	}
	if file := t.FDTable().Remove(t, fd); file != nil {
		_ = file.OnClose(t)
		file.DecRef(t)
	}
	t.Debugf("thaw: fd %d: a held /dev/nvidia-uvm number released (its task closed another)", fd)
}
'''

CLOSE_OLD = '''func Close(t *kernel.Task, sysno uintptr, args arch.SyscallArguments) (uintptr, *kernel.SyscallControl, error) {
	fd := args[0].Int()
'''
CLOSE_NEW = '''func Close(t *kernel.Task, sysno uintptr, args arch.SyscallArguments) (uintptr, *kernel.SyscallControl, error) {
	fd := args[0].Int()
	if thawUVMClose(t, fd) { // thaw: ci/patch-runsc-uvmclose.py
		return 0, nil, nil
	}
'''

DUP3_OLD = '''	if err != nil {
		return 0, nil, err
	}
	if df != nil {
		// "If the file descriptor newfd was previously open, it is closed
'''
DUP3_NEW = '''	if err != nil {
		return 0, nil, err
	}
	thawUVMDup(t, oldfd, file) // thaw: ci/patch-runsc-uvmclose.py
	if df != nil {
		// "If the file descriptor newfd was previously open, it is closed
'''


def main() -> None:
    root = Path(sys.argv[1])
    (root / "pkg/sentry/devices/nvproxy/thaw_uvm.go").write_text(NVPROXY_FILE)
    (root / "pkg/sentry/syscalls/linux/thaw_uvm_close.go").write_text(SYSCALLS_FILE)
    patch(root / "pkg/sentry/syscalls/linux/sys_file.go", CLOSE_OLD, CLOSE_NEW)
    patch(root / "pkg/sentry/syscalls/linux/sys_file.go", DUP3_OLD, DUP3_NEW)
    print("patch-runsc-uvmclose: a dup'd /dev/nvidia-uvm number is held between libcuda's two closes of it")


if __name__ == "__main__":
    main()
