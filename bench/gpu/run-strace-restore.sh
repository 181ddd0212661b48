#!/usr/bin/env bash
# Device entry: one GPT-2-large image restored twice (no-background, thaw) by a
# runsc that straces the GPU-relevant syscalls, so the boot log of each restore
# shows every ioctl/mmap of the CUDA restore with its duration in the sentry
# (gVisor pkg/sentry/strace: "X ioctl(...) = 0 (0x0) (12.3µs)").
# Question it answers: where the in-sandbox CUDA restore (1.05-1.39 s for
# GPT-2-large with all pages already loaded, vs 0.57 s natively) spends its time.
# Analysis: python3 bench/gpu/strace_summary.py <runsc-logs dir>.
# Extra arguments go to models.py (a later --variants replaces the default pair).
# Same carry as run-models.sh (.carry from `make carry`); run from the repo root.
set -uo pipefail
cat > /tmp/runsc-strace <<'EOS'
#!/bin/sh
exec /tmp/thaw-bin/runsc --strace --strace-syscalls=ioctl,mmap,munmap,mremap,madvise,mprotect "$@"
EOS
chmod 755 /tmp/runsc-strace
# run-models.sh unpacks /tmp/thaw-bin/runsc first; models.py takes the last --runsc.
THAW_BENCH_BUDGET_S=${THAW_BENCH_BUDGET_S:-240} bash bench/gpu/run-models.sh \
  --models gpt2-large --variants no-background,thaw --no-drop-caches --runsc /tmp/runsc-strace "$@"
