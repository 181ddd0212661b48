#!/usr/bin/env python3
"""An experimental runsc patch (bench only, not in thaw's runsc): before the
CUDA toggle that ends a restore, map every page of each CUDA process's memory
that the image holds into its address space with MAP_POPULATE.

    python3 bench/gpu/patch-runsc-prefault.py GVISOR_COPY [--all]

--all: every process of a restored sandbox, CUDA or not, GPU image or not (a CPU
check of the mechanism: `build-runsc-variant.sh prefault-all`, then
bench/first_touch.py with it).

The sentry-side populate this bench once tried as `--sentry` (`@prefaultmf`)
is thaw's runsc now: ci/patch-runsc-populate.py (gVisor PR #13753), measured
better (GPT-2-large 1.281 s vs 1.707 s); this stub-side prefault was slower
than neither (1.906 s; bench/results/gpu-speed-2026-12-01-prefault.json).

Why (docs/gpu.md, "Measured ... third session", item 2): right after `runsc
restore` the driver's restore step is 0.25-0.6 s slower than in a sandbox that
has run since, and runsc --strace shows the same calls in both; the difference
is the copy of the process's host backup to the GPU (GPT-2-large: 0.66-0.75 s
vs 0.31 s), during which the restore thread makes no syscall. In a fresh
sandbox the process's address space has nothing mapped (systrap maps on first
fault, pkg/sentry/mm HandleUserFault, and the host then faults every page of
the stub's mapping); in the parked sandbox the backup had just been written.
Built by `bench/gpu/build-runsc-variant.sh prefault` on top of thaw's own
loader patch; the speed bench restores with it as `thaw-thp@prefault`.

What it adds: pkg/sentry/mm MemoryManager.ThawPrefault (existing pmas of the
memory file only, so nothing is allocated; 1 GiB pieces, the largest that
mapASLocked precommits) and a call per CUDA process in
pkg/sentry/control/state_cuda.go postResumeCuda, logged ("thaw: prefault")
and on the restore timeline. Exits non-zero, naming the file, when the pinned
source no longer has what this replaces."""
from __future__ import annotations

import sys
from pathlib import Path

MM_FILE = '''// Copyright 2026 thaw authors. An experiment, not upstream gVisor:
// bench/gpu/patch-runsc-prefault.py writes this file into a copy of the pin.

package mm

import (
	"gvisor.dev/gvisor/pkg/context"
	"gvisor.dev/gvisor/pkg/hostarch"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/pgalloc"
)

// ThawPrefault maps the memory-file pages mm already has (its pmas) into its
// AddressSpace with the host page tables populated, and returns the bytes it
// mapped. It allocates nothing: ranges without a pma stay unmapped.
func (mm *MemoryManager) ThawPrefault(ctx context.Context) (uint64, error) {
	const piece = hostarch.Addr(1 << 30) // mapASLocked precommits at most 1 GiB at a time
	mm.activeMu.RLock()
	defer mm.activeMu.RUnlock()
	if mm.as == nil {
		return 0, nil
	}
	var n uint64
	for pseg := mm.pmas.FirstSegment(); pseg.Ok(); pseg = pseg.NextSegment() {
		if _, ok := pseg.ValuePtr().file.(*pgalloc.MemoryFile); !ok {
			continue // device mappings (nvproxy) are the driver's business
		}
		r := pseg.Range()
		for s := r.Start; s < r.End; {
			e := s + piece
			if e > r.End || e < s {
				e = r.End
			}
			if err := mm.mapASLocked(ctx, pseg, hostarch.AddrRange{Start: s, End: e}, memmap.PlatformEffectCommit); err != nil {
				return n, err
			}
			n += uint64(e - s)
			s = e
		}
	}
	return n, nil
}
'''


def patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"patch-runsc-prefault: {path} changed upstream (expected one {old.strip()[:70]!r})")
    path.write_text(text.replace(old, new))


PREFAULT = '''	// thaw (bench/gpu/patch-runsc-prefault.py): map the processes' memory first.
	for _, tg := range %s {
		var mm interface {
			ThawPrefault(context.Context) (uint64, error)
			DecUsers(context.Context)
		}
		tg.Leader().WithMuLocked(func(t *kernel.Task) {
			if m := t.MemoryManager(); m != nil && m.IncUsers() {
				mm = m
			}
		})
		if mm == nil {
			continue
		}
		start := time.Now()
		n, err := mm.ThawPrefault(k.SupervisorContext())
		mm.DecUsers(k.SupervisorContext())
		log.Infof("thaw: prefault of PID %%d: %%d bytes in %%s (err %%v)", tg.ID(), n, time.Since(start), err)
	}
	timeline.Reached("thaw prefault done")
'''


def main() -> None:
    root = Path(sys.argv[1])
    mode = sys.argv[2:]
    state_cuda = root / "pkg/sentry/control/state_cuda.go"
    (root / "pkg/sentry/mm/thaw_prefault.go").write_text(MM_FILE)
    if mode == ["--all"]:
        patch(state_cuda, '''	cudaCheckpointPathVal := k.PopCheckpointState(cudaCheckpointPathKey)
''', '''	var allProcs []*kernel.ThreadGroup
	k.TaskSet().ForEachThreadGroup(func(tg *kernel.ThreadGroup, _ *kernel.Task) { allProcs = append(allProcs, tg) })
''' + PREFAULT % "allProcs" + '''	cudaCheckpointPathVal := k.PopCheckpointState(cudaCheckpointPathKey)
''')
    else:
        patch(state_cuda, '''	timeline.Reached("starting cuda-ckpt")
''', PREFAULT % "cudaProcs" + '''	timeline.Reached("starting cuda-ckpt")
''')


if __name__ == "__main__":
    main()
