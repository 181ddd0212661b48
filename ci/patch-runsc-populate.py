#!/usr/bin/env python3
"""thaw's second runsc patch: fault in the CUDA processes' memory before the
CUDA restore that ends a restore (ci/build-go.sh).

    python3 ci/patch-runsc-populate.py GVISOR_COPY

At the pin, right after `runsc restore` the driver's restore step of a CUDA
process ran 0.25-0.6 s slower than the same step in a sandbox that had run
since (docs/gpu.md, "Measured ... third session": runsc --strace showed the
same calls, the difference one call-free stretch in which the host backup goes
to the GPU). The NVIDIA driver reaches a process's host memory through the
sentry's own mapping of the memory file (nvproxy hands it sentry addresses,
rmAllocOSDescriptor) and pins it page by page; in a freshly restored sandbox
those pages are not yet in the sentry's page tables, and the zero pages the
image did not save are holes in the memory file that every such fault fills
first. Upstream gVisor PR #13753 ("Prefault CUDA process memory before
restore", closed unmerged; beam-cloud runs it) populates exactly those ranges
beforehand. This is that approach, written anew: after the memory-file
metadata is loaded and before `cuda-checkpoint --toggle`, the memory-file
ranges every CUDA process's pmas cover (deduplicated) are faulted in through
the sentry's mapping with madvise(MADV_POPULATE_WRITE), by 8 goroutines over
64 MiB pieces; MapInternal waits for the background loader to bring each piece
in first. Best effort: a piece that fails is counted and left to the driver's
own faults. It commits the holes too (host memory the restore would have
faulted in anyway as it pins them).

Measured on the H200 (bench/results/gpu-speed-2026-12-01-prefault.json, median
of 3, warm page cache, identical answers): GPT-2-large 1.281 s vs 1.707 s
without it (0.75x; the in-sandbox CUDA restore 0.547 s vs 1.058 s, native
0.765 s), ~3B 2.288 s vs 2.668 s (0.86x; CUDA 1.181 s vs 1.772 s, native
1.310 s). Populating the stub's page tables instead (bench/gpu/patch-runsc-
prefault.py, `@prefault`) was slower than neither: 1.906 s / 3.074 s.

It acts only where runsc restores CUDA processes (postResumeCuda with the
saved cuda-checkpoint path: GPU images); CPU restores are untouched. Logged in
the boot log ("thaw: populated N bytes of the memory file for K CUDA processes
in T") and on the restore timeline ("thaw populate done"). Exits non-zero,
naming the file, when the pinned source no longer has what this replaces."""
from __future__ import annotations

import sys
from pathlib import Path

from runsc_patch import patch_file


def patch(path: Path, old: str, new: str) -> None:
    patch_file("patch-runsc-populate", path, [(old, new)])


SENTRY_MM_FILE = '''// Copyright 2026 thaw authors. Not upstream gVisor: ci/patch-runsc-populate.py
// writes this file into thaw's copy of the pin (the approach of gVisor PR #13753).

package mm

import (
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/pgalloc"
)

// ThawMemoryFileRanges appends the ranges of the memory file mf that mm's
// pmas map to frs and returns it (unsorted, possibly overlapping).
func (mm *MemoryManager) ThawMemoryFileRanges(mf *pgalloc.MemoryFile, frs []memmap.FileRange) []memmap.FileRange {
	mm.activeMu.RLock()
	defer mm.activeMu.RUnlock()
	for pseg := mm.pmas.FirstSegment(); pseg.Ok(); pseg = pseg.NextSegment() {
		if f, ok := pseg.ValuePtr().file.(*pgalloc.MemoryFile); ok && f == mf {
			frs = append(frs, pseg.fileRange())
		}
	}
	return frs
}
'''

SENTRY_CONTROL_FILE = '''// Copyright 2026 thaw authors. Not upstream gVisor: ci/patch-runsc-populate.py
// writes this file into thaw's copy of the pin (the approach of gVisor PR #13753).
// The approach of gVisor PR #13753 (closed unmerged); written anew for thaw's bench.

package control

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/hostarch"
	"gvisor.dev/gvisor/pkg/log"
	"gvisor.dev/gvisor/pkg/sentry/kernel"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/mm"
)

// thawPopulateCudaMemory faults in, through the sentry's own mapping, every
// page of the memory file that a CUDA process maps, before the CUDA restore.
func thawPopulateCudaMemory(k *kernel.Kernel, procs []*kernel.ThreadGroup) {
	start := time.Now()
	mf := k.MemoryFile()
	var frs []memmap.FileRange
	for _, tg := range procs {
		var m *mm.MemoryManager
		tg.Leader().WithMuLocked(func(t *kernel.Task) {
			if tm := t.MemoryManager(); tm != nil && tm.IncUsers() {
				m = tm
			}
		})
		if m == nil {
			continue
		}
		// Outside the task's lock: the pmas are read under mm.activeMu.
		frs = m.ThawMemoryFileRanges(mf, frs)
		m.DecUsers(k.SupervisorContext())
	}
	sort.Slice(frs, func(i, j int) bool { return frs[i].Start < frs[j].Start })
	var merged []memmap.FileRange
	for _, fr := range frs {
		if n := len(merged); n > 0 && fr.Start <= merged[n-1].End {
			if fr.End > merged[n-1].End {
				merged[n-1].End = fr.End
			}
			continue
		}
		merged = append(merged, fr)
	}
	const piece = 64 << 20
	var pieces []memmap.FileRange
	var total uint64
	for _, fr := range merged {
		total += fr.Length()
		for s := fr.Start; s < fr.End; s += piece {
			e := s + piece
			if e > fr.End {
				e = fr.End
			}
			pieces = append(pieces, memmap.FileRange{Start: s, End: e})
		}
	}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(pieces) {
					return
				}
				// MapInternal waits for the background loader to bring these pages in.
				bs, err := mf.MapInternal(pieces[i], hostarch.ReadWrite)
				if err != nil {
					failed.Add(1)
					continue
				}
				for !bs.IsEmpty() {
					b := bs.Head()
					bs = bs.Tail()
					if b.Len() < hostarch.PageSize {
						continue
					}
					if _, _, errno := unix.Syscall(unix.SYS_MADVISE, b.Addr(), uintptr(b.Len()), unix.MADV_POPULATE_WRITE); errno != 0 {
						failed.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	log.Infof("thaw: populated %d bytes of the memory file for %d CUDA processes in %s (%d pieces failed)", total, len(procs), time.Since(start), failed.Load())
}
'''

SENTRY_CALL = '''	thawPopulateCudaMemory(k, cudaProcs) // thaw: ci/patch-runsc-populate.py (gVisor PR #13753)
	timeline.Reached("thaw populate done")
'''


def main() -> None:
    root = Path(sys.argv[1])
    (root / "pkg/sentry/mm/thaw_populate.go").write_text(SENTRY_MM_FILE)
    (root / "pkg/sentry/control/thaw_populate.go").write_text(SENTRY_CONTROL_FILE)
    patch(root / "pkg/sentry/control/state_cuda.go", '''	timeline.Reached("starting cuda-ckpt")
''', SENTRY_CALL + '''	timeline.Reached("starting cuda-ckpt")
''')
    print("patch-runsc-populate: CUDA processes' memory populated before the CUDA restore (gVisor PR #13753)")


if __name__ == "__main__":
    main()
