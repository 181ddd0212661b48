#!/usr/bin/env bash
# Device entry: bench/gpu/fd_clobber_sandbox.py on the GPU (the EBADF hunt's sandbox
# step, docs/gvisor-notes.md): fd_clobber as a GPU sandbox's init, toggled through
# `runsc exec` of thaw's helper, `runsc checkpoint --leave-running` and restores.
# Expects .carry/ from `make carry` (runsc.xz, thaw-cuda-checkpoint, wheels/); extra
# arguments go to the script, e.g. --rounds 40 --restores 10 --runsc-flag=--strace
# --runsc-flag=--strace-syscalls=openat,close,dup2,dup3,getdents64 --debug; with --strace,
# --pause-us N slows the listers and each boot log comes back as its focus (fd_trace_focus.py).
# RUNSC=/tmp/thaw-bin/runsc-NAME runs a variant carried as .carry/runsc-NAME.xz (e.g. nouvmhold).
# Writes $OUT/fd_clobber_sandbox.json, prog.out, fd-clobber.log and runsc-logs.tar.xz.
# Exit 0: nothing clobbered; 1: a CLOBBER or HELD line (the finding); 2: setup failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
THAW_BENCH_UNPACK_ONLY=1 bash bench/gpu/run-models.sh || exit 2
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 bench/gpu/fd_clobber_sandbox.py --runsc "${RUNSC:-/tmp/thaw-bin/runsc}" --helper /tmp/thaw-bin/thaw-cuda-checkpoint \
  --out "$out/fdc" --control "$@" 2>&1 | tee "$out/fd-clobber.log"
rc=${PIPESTATUS[0]}
cp "$out/fdc/fd_clobber_sandbox.json" "$out/fdc/prog.out" "$out/" 2>/dev/null
if [[ -d "$out/fdc/runsc-logs" ]]; then
  # A traced sandbox's boot log is mostly the listers (GBs): keep what can name a closer
  # (bench/gpu/fd_trace_focus.py) in its place; the rest of runsc's logs go back whole.
  if [[ " $* " == *" --runsc-flag=--strace "* ]]; then
    for b in "$out"/fdc/runsc-logs/*.boot.log; do
      [[ -f "$b" ]] || continue
      python3 bench/gpu/fd_trace_focus.py "$b" "$out/fdc/prog.out" > "${b%.log}.focus.txt" && rm -f "$b"
    done
  fi
  tar -C "$out/fdc" -cJf "$out/runsc-logs.tar.xz" runsc-logs
fi
rm -rf "$out/fdc"
exit $rc
