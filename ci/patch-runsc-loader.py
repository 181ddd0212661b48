#!/usr/bin/env python3
"""thaw's one runsc patch: the background page loader's readers (ci/build-go.sh).

    python3 ci/patch-runsc-loader.py GVISOR_COPY HUGE_READERS HUGE_READ_KIB SMALL_READERS

At the pin, `runsc restore` reads the pages file with 128 parallel reads of
256 KiB (pkg/sentry/state/stateio/pagesfile.go). With 128 the readers'
first-touch copies contend on one shmem inode's lock (shmem_add_to_page_cache)
and the workload's own faults wait behind them: upstream gVisor PR #14568
(open) settles on 12 readers of 4 MiB. thaw measured both settings and keeps
each where it was better (docs/gvisor-notes.md, "The pin"):

- memory file backed by huge pages (the host's shmem THP as `thaw provision`
  sets it on GPU nodes, runsc/boot/loader.go createMemoryFile decides) and at
  least HUGE_READERS CPUs: HUGE_READERS reads of HUGE_READ_KIB. A read smaller
  than a huge page makes readers share each 2 MiB page's fault; on the H200
  (16 CPUs) an ~8B restore answered in 3.60 s instead of 4.11 s with 8 of
  256 KiB (the 17 GB memory file loaded in 0.8 s instead of 3.3 s).
- otherwise SMALL_READERS reads of 256 KiB. On the 2-core VM 12 of 4 MiB made
  the first answer 1.4x later than 8 of 256 KiB with small pages and 1.3x with
  huge pages: the loader's big reads compete with the restore and the
  workload's own faults for two CPUs.

The loader's choice is logged ("thaw: background page loader: ...") in the
sandbox's boot log. The sentry decides at boot, when the Loader creates its
first memory file, before any Restore RPC makes the reader. Exits non-zero,
naming the file, when the pinned source no longer has what this replaces."""
from __future__ import annotations

import sys
from pathlib import Path

from runsc_patch import patch_file


def patch(path: Path, edits: list[tuple[str, str]]) -> None:
    patch_file("patch-runsc-loader", path, edits, hint="; re-check the loader patch")


def main() -> None:
    copy, huge_readers, huge_kib, small_readers = sys.argv[1], *map(int, sys.argv[2:5])
    root = Path(copy)
    patch(root / "pkg/sentry/state/stateio/pagesfile.go", [
        ('import (\n\t"gvisor.dev/gvisor/pkg/hostarch"\n)',
         'import (\n\t"runtime"\n\t"sync/atomic"\n\n\t"gvisor.dev/gvisor/pkg/hostarch"\n\t"gvisor.dev/gvisor/pkg/log"\n)'),
        ("\treturn NewPagesFileFDReader(fd, pagesFileFDDefaultMaxIOBytes, pagesFileFDDefaultMaxParallel)\n",
         f"""\t// thaw: ci/patch-runsc-loader.py (upstream gVisor PR #14568).
\thuge, cpus := thawHugePages.Load(), runtime.NumCPU()
\tif huge && cpus >= {huge_readers} {{
\t\tlog.Infof("thaw: background page loader: {huge_readers} readers of {huge_kib} KiB (huge pages, %d CPUs)", cpus)
\t\treturn NewPagesFileFDReader(fd, {huge_kib}<<10, {huge_readers})
\t}}
\tlog.Infof("thaw: background page loader: {small_readers} readers of 256 KiB (huge pages: %t, %d CPUs)", huge, cpus)
\treturn NewPagesFileFDReader(fd, pagesFileFDDefaultMaxIOBytes, {small_readers})
"""),
        ("// NewPagesFileFDWriter returns",
         """// thawHugePages is whether the sandbox's memory file is backed by huge pages
// (thaw: ci/patch-runsc-loader.py).
var thawHugePages atomic.Bool

// SetHugePages records whether the memory file restored into is backed by huge
// pages, for the background page loader's read size (thaw's patch).
func SetHugePages(huge bool) { thawHugePages.Store(huge) }

// NewPagesFileFDWriter returns"""),
    ])
    patch(root / "runsc/boot/loader.go", [
        ('\t"gvisor.dev/gvisor/pkg/log"\n',
         '\t"gvisor.dev/gvisor/pkg/log"\n\t"gvisor.dev/gvisor/pkg/sentry/state/stateio"\n'),
        ("\tmf, err := pgalloc.NewMemoryFile(memfile, mfopts)\n",
         "\tstateio.SetHugePages(mfopts.ExpectHugepages) // thaw: ci/patch-runsc-loader.py\n"
         "\tmf, err := pgalloc.NewMemoryFile(memfile, mfopts)\n"),
    ])
    print(f"patch-runsc-loader: background page loader: {huge_readers} readers of {huge_kib} KiB on huge "
          f"pages, {small_readers} of 256 KiB on small ones")


if __name__ == "__main__":
    main()
