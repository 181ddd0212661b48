#!/usr/bin/env python3
"""thaw's third runsc patch: `runsc events` and `runsc ps` no longer crash a
sandbox that is restoring (ci/build-go.sh).

    python3 ci/patch-runsc-restoring.py GVISOR_COPY

At the pin, the restore that the last container of a pod triggers
(runsc/boot/restore.go `restorer.restore`) releases the Loader's kernel and puts
a bare `kernel.Kernel{Platform: p}` in its place (restore.go:384-391) without the
Loader's lock, then builds and installs the seccomp filters (restore.go:426, some
10 ms of CPU at runtime, "No precompiled program found"; longer on a busy node)
and only then takes `l.mu` to load the saved kernel. An RPC that reads `l.k` in
that window finds a kernel whose task set is nil and the sentry panics with a
nil dereference, which takes the whole sandbox down:

- `containerManager.Event` (`runsc events --stats`: the shim's task Stats, which
  containerd's CRI and the kubelet poll for every running container) →
  `Loader.pidsCount` → `l.k.TaskSet().Root` (runsc/boot/loader.go:2383);
- `containerManager.Processes` (`runsc ps`: the shim's task Pids) →
  `control.Processes(cm.l.k, ...)` (runsc/boot/controller.go:321,
  pkg/sentry/control/proc.go:447).

A pod's first members are running in the shim's view (their `runsc restore`
registered them) while the last one's restore runs, so a stats poll of one of
them can land in the window; the last member's `runsc restore` then fails with
`urpc method "containerManager.RestoreSubcontainer" failed: EOF` (exit 128) and
the pod starts cold. 5 restores in 70 on the 2-core VM under load (containerd
2.4's CRI polls every running container's stats once a second), 7 of 8 with
`runsc events --stats` called in a loop (docs/gvisor-notes.md, "A pod member's
restore exits 128").

The patch makes both RPCs answer an error while the Loader is restoring and its
kernel not started (`restoringUnstarted`, the state in which the kernel is
swapped and loaded; it ends when the restored kernel starts and never comes
back) or after a failed restore (`restoreFailed`, whose kernel may be the bare
one), read under `l.mu` as upstream's own `waitContainer` reads it. An error is
what a stats poll of a container that is not running gets anyway; waiting
instead would hold the caller until every page is loaded (`--background`).
Not reported upstream when written (2026-12-04). Exits non-zero, naming the
file, when the pinned source no longer has what this replaces."""
from __future__ import annotations

import sys
from pathlib import Path

from runsc_patch import patch_file


def patch(path: Path, old: str, new: str) -> None:
    patch_file("patch-runsc-restoring", path, [(old, new)])


BOOT_FILE = '''// Copyright 2026 thaw authors. Not upstream gVisor: ci/patch-runsc-restoring.py
// writes this file into thaw's copy of the pin.

package boot

import "fmt"

// thawRestoringLocked refuses an RPC that reads the kernel (l.k) of a sandbox
// whose restore has not started its kernel: restorer.restore replaces l.k with
// a bare kernel.Kernel outside l.mu, and a failed restore may leave it so; its
// task set is nil and reading it panics the sentry.
//
// +checklocks:l.mu
func (l *Loader) thawRestoringLocked(cid string) error {
	switch l.state {
	case restoringUnstarted:
		return fmt.Errorf("container %q: the sandbox is restoring", cid)
	case restoreFailed:
		return fmt.Errorf("container %q: the sandbox's restore failed", cid)
	}
	return nil
}
'''

PIDS_OLD = '''func (l *Loader) pidsCount(cid string) (int, error) {
	l.mu.Lock()
	_, err := l.tryThreadGroupFromIDLocked(execID{cid: cid})
'''
PIDS_NEW = '''func (l *Loader) pidsCount(cid string) (int, error) {
	l.mu.Lock()
	if err := l.thawRestoringLocked(cid); err != nil { // thaw: ci/patch-runsc-restoring.py
		l.mu.Unlock()
		return 0, err
	}
	_, err := l.tryThreadGroupFromIDLocked(execID{cid: cid})
'''

PROCESSES_OLD = '''	log.Debugf("containerManager.Processes, cid: %s", *cid)
	return control.Processes(cm.l.k, *cid, out)
'''
PROCESSES_NEW = '''	log.Debugf("containerManager.Processes, cid: %s", *cid)
	cm.l.mu.Lock()
	err := cm.l.thawRestoringLocked(*cid) // thaw: ci/patch-runsc-restoring.py
	cm.l.mu.Unlock()
	if err != nil {
		return err
	}
	return control.Processes(cm.l.k, *cid, out)
'''


def main() -> None:
    root = Path(sys.argv[1])
    (root / "runsc/boot/thaw_restoring.go").write_text(BOOT_FILE)
    patch(root / "runsc/boot/loader.go", PIDS_OLD, PIDS_NEW)
    patch(root / "runsc/boot/controller.go", PROCESSES_OLD, PROCESSES_NEW)
    print("patch-runsc-restoring: runsc events/ps answer an error while a sandbox restores (no sentry panic)")


if __name__ == "__main__":
    main()
