#!/usr/bin/env bash
# Device entry, native (no sandbox): does the CUDA checkpoint toggle hand the
# application's reused FD numbers to the driver? (docs/gvisor-notes.md, "EBADF listing a
# bind-mounted directory after a GPU restore".) bench/gpu/fd_clobber.c lists a directory
# from two threads while thaw's helper toggles it ROUNDS times (checkpointed and back);
# on odd rounds, while it is checkpointed, it also opens the directory 32 times and
# keeps those numbers (the lowest free ones: the device FDs the checkpoint released
# among them) and checks after the toggle back that each is still that directory. The
# program's FD table (/proc/PID/fd) is diffed around every toggle: which numbers the
# checkpoint released, which the restore took. Everything goes to $OUT/fd_clobber.log.
# Usage, from the repo root after run-models.sh's unpacking (or HELPER=path):
#   bash bench/gpu/fd_clobber.sh [ROUNDS]
# CLOSE_TRACE=1 preloads bench/gpu/close_trace.c into the program (its UVMDUP/UVMCLOSE
# lines: libcuda's double close of its UVM number at restore); CLOSE_TRACE_WIDEN_US=N
# widens the window after the first close, as the sandbox's slower ioctl does.
# Exit 0: nothing clobbered; 1: a CLOBBER or HELD line (the number was taken over).
set -uo pipefail
ROUNDS=${1:-20}
HELPER=${HELPER:-/tmp/thaw-bin/thaw-cuda-checkpoint}
OUT=${OUT:-/tmp/fd-clobber-out}
W=/tmp/fd-clobber
LOG=$OUT/fd_clobber.log
rm -rf "$W"; mkdir -p "$W/spool" "$OUT"
for i in $(seq 1 40); do echo "$i" > "$W/spool/f$i.req"; done
gcc -O2 -Wall -pthread -o "$W/fd_clobber" bench/gpu/fd_clobber.c -ldl || exit 2
[ -x "$HELPER" ] || { echo "no CUDA helper at $HELPER (set HELPER)"; exit 2; }
preload=
if [ "${CLOSE_TRACE:-0}" = 1 ]; then
  gcc -O2 -Wall -shared -fPIC -o "$W/close_trace.so" bench/gpu/close_trace.c -ldl || exit 2
  preload="$W/close_trace.so"
fi
LD_PRELOAD=$preload "$W/fd_clobber" "$W/spool" 3600 > "$W/prog.out" 2>&1 &
PROG=$!
for _ in $(seq 1 300); do grep -q '^ready' "$W/prog.out" && break; sleep 0.1; done
grep -q '^ready' "$W/prog.out" || { cat "$W/prog.out"; kill "$PROG"; exit 2; }
fds() { ls -l "/proc/$PROG/fd" 2>/dev/null | awk 'NR>1 {print $9, $11}' | sort -n; }
toggle() {  # $1: label
  fds > "$W/before"
  local t0=$(date +%s.%N)
  "$HELPER" --toggle --pid "$PROG"; local rc=$?
  local t1=$(date +%s.%N)
  fds > "$W/after"
  echo "== round $n $1: helper rc=$rc, $(awk "BEGIN {printf \"%.2f\", $t1 - $t0}") s, state $("$HELPER" --get-state --pid "$PROG" 2>&1)"
  diff "$W/before" "$W/after" | grep '^[<>]' | grep -v ' /proc/' | sed 's/^</  released:/; s/^>/  took:/'
}
{
  echo "fd_clobber: $ROUNDS rounds, helper $HELPER, pid $PROG"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "fds at start:"; fds | sed 's/^/  /'
  for n in $(seq 1 "$ROUNDS"); do
    toggle "to checkpointed"
    if [ $((n % 2)) = 1 ]; then kill -USR1 "$PROG"; fi
    sleep 0.5
    toggle "to running"
    if [ $((n % 2)) = 1 ]; then kill -USR2 "$PROG"; fi
    sleep 0.3
  done
  # The block runs in a pipeline's subshell, which cannot `wait` for this shell's child.
  kill -TERM "$PROG"; for _ in $(seq 50); do kill -0 "$PROG" 2>/dev/null || break; sleep 0.1; done
  echo "program stopped: $(kill -0 "$PROG" 2>/dev/null && echo no || echo yes)"
  echo "program output (CLOBBER/HELD lines first, then close_trace's):"
  grep -E '^(CLOBBER|HELD)' "$W/prog.out" | head -50
  grep -E '^UVM' "$W/prog.out" | head -200
  echo "UVMCLOSE2 (a second close of the number): $(grep -c '^UVMCLOSE2' "$W/prog.out"), of them EBADF: $(grep -cE '^UVMCLOSE2 [0-9]+ [0-9]+ -1 9 ' "$W/prog.out"), closing another file: $(grep -E '^UVMCLOSE2 ' "$W/prog.out" | grep -vc 'was=(closed')"
  grep -vE '^(CLOBBER|HELD|UVM)' "$W/prog.out" | tail -50
} 2>&1 | tee "$LOG"
grep -qE '^(CLOBBER|HELD)' "$W/prog.out" && exit 1
exit 0
