#!/bin/bash
# CPU reproduction attempt for the EBADF on a bind-mounted directory after a GPU
# restore (docs/gvisor-notes.md, last section). Real runsc (build/runsc), no
# containerd, no GPU. A busybox workload lists /share/spool (a bind mount of a host
# directory) in a loop and makes/removes files in it; it is checkpointed once with
# --leave-running, then restored ROUNDS times from that image with the same mount:
# restore A, let it run 1.5 s, SIGKILL + delete it, restore B at once, and so on.
# A round fails when the workload's `ls` reports "Bad file descriptor" (it writes
# /share/fail.log and exits). As of 2026-12-01 it has never failed (counts in the doc).
# Usage (root): flock /tmp/thaw-heavy.lock bench/ebadf_repro.sh [rounds] [mode]
#   mode: serial (default) | overlap (A still running while B restores; B's spool
#         is then shared with A, so only EBADF counts, not ENOENT races) |
#         leave-running (no restores: the one sandbox is checkpointed with
#         --leave-running ROUNDS times, each to a fresh image, and must go on
#         listing after each; the GPU node lost a server that way on 2026-12-01)
# Env: BG=1 restores with --background; RECREATE=1 replaces the spool directory
#   (new inode) before each restore; GAP=seconds between A's kill and B's restore;
#   RUNSC=path; W=work directory (default /tmp/ebadf-repro, removed at start).
set -u
ROUNDS=${1:-10}; MODE=${2:-serial}
HERE=$(cd "$(dirname "$0")/.." && pwd)
RUNSC=${RUNSC:-$HERE/build/runsc}
W=${W:-/tmp/ebadf-repro}; ROOT=$W/root
BGFLAG=""; [ "${BG:-0}" = 1 ] && BGFLAG=--background
GAP=${GAP:-0}
# runsc's forked sandbox inherits stdout/stderr: never give it a pipe (docs/gvisor-notes.md).
R() { "$RUNSC" --root="$ROOT" --debug-log="$W/logs/%ID%.%COMMAND%.log" "$@" </dev/null >"$W/out" 2>>"$W/runsc.err"; local rc=$?; cat "$W/out"; return $rc; }
cleanup() {
  for id in $(R list -quiet 2>/dev/null); do R delete -force "$id" >/dev/null 2>&1; done
  while mountpoint -q "$ROOT/null-netns" 2>/dev/null || grep -q " $ROOT/null-netns " /proc/mounts; do umount -l "$ROOT/null-netns" || break; done
}
trap cleanup EXIT
cleanup; rm -rf "$W"; mkdir -p "$W/rootfs/bin" "$W/share/spool" "$W/img" "$W/logs" "$ROOT"
cp "$HERE/build/busybox" "$W/rootfs/bin/busybox"
for a in sh ls touch rm echo sleep cat mkdir date; do ln -s busybox "$W/rootfs/bin/$a"; done
mkdir -p "$W/rootfs/proc" "$W/rootfs/dev" "$W/rootfs/share" "$W/rootfs/tmp"
# The workload: list the spool (ls exits non-zero and prints the errno text on failure),
# make and remove a file there, and report to /share/status.<id-agnostic pid file>.
cat > "$W/rootfs/loop.sh" <<'EOS'
#!/bin/sh
i=0
while true; do
  # Only EBADF counts: with two sandboxes sharing the spool, ls may see a file
  # the other one removed (ENOENT), which is not the bug.
  if ! out=$(ls /share/spool 2>&1); then
    case "$out" in *"Bad file descriptor"*) echo "FAIL $i $out" >> /share/fail.log; exit 3;; esac
  fi
  touch /share/spool/f.$i.req; rm -f /share/spool/f.$((i-1)).req
  i=$((i+1))
done
EOS
chmod +x "$W/rootfs/loop.sh"
cat > "$W/config.json" <<EOS
{"ociVersion":"1.0.0","process":{"user":{"uid":0,"gid":0},"args":["/bin/sh","/loop.sh"],"env":["PATH=/bin"],"cwd":"/"},
 "root":{"path":"$W/rootfs","readonly":false},"hostname":"ebadf",
 "mounts":[{"destination":"/proc","type":"proc","source":"proc"},
  {"destination":"/share","type":"bind","source":"$W/share","options":["rbind","rw"]}],
 "linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"},{"type":"network"}]}}
EOS
mkbundle() { mkdir -p "$W/b-$1"; cp "$W/config.json" "$W/b-$1/config.json"; }
mkbundle src
R run --detach --bundle "$W/b-src" src || exit 1
sleep 2
if [ "$MODE" = leave-running ]; then
  fails=0
  for n in $(seq 1 "$ROUNDS"); do
    rm -rf "$W/img"; mkdir -p "$W/img"
    R checkpoint --leave-running --image-path "$W/img" src >/dev/null || { echo "round $n: checkpoint failed"; fails=$((fails+1)); }
    sleep 0.5
    st=$(R state src 2>/dev/null | grep -o '"status": *"[a-z]*"')
    if [ -s "$W/share/fail.log" ]; then echo "round $n: LISTING FAILED: $(cat "$W/share/fail.log") [$st]"; fails=$((fails+1)); break
    elif ! grep -q running <<<"$st"; then echo "round $n: workload not running [$st]"; fails=$((fails+1)); break
    else echo "round $n: ok [$st]"; fi
  done
  echo "rounds=$ROUNDS mode=$MODE failures=$fails"
  exit 0
fi
R checkpoint --leave-running --image-path "$W/img" src || { echo "checkpoint failed"; exit 1; }
echo "checkpointed; inode of spool $(stat -c %i "$W/share/spool")"
R kill src KILL; sleep 0.5; R delete -force src
fails=0; prev=""
for n in $(seq 1 "$ROUNDS"); do
  id=r$n; mkbundle $id; : > "$W/share/fail.log"
  # RECREATE=1: replace the spool (new inode) before each restore, the 2026-11-30 harness's habit.
  if [ "${RECREATE:-0}" = 1 ]; then rm -rf "$W/share/spool"; mkdir "$W/share/spool"; fi
  if [ "$MODE" = overlap ] || [ -z "$prev" ]; then :; else
    R kill "$prev" KILL; R delete -force "$prev"; sleep "$GAP"; fi
  [ "$MODE" = serial ] && rm -f "$W/share/spool"/*
  R restore $BGFLAG --detach --image-path "$W/img" --bundle "$W/b-$id" "$id" || { echo "round $n: restore failed"; fails=$((fails+1)); }
  sleep 1.5
  # Liveness (serial mode): the spool was emptied before the restore, so a file
  # there now was made by the restored workload.
  if [ "$MODE" = serial ] && [ -z "$(ls "$W/share/spool")" ]; then echo "round $n: workload made no progress"; fi
  st=$(R state "$id" 2>/dev/null | grep -o '"status": *"[a-z]*"')
  if [ -s "$W/share/fail.log" ]; then echo "round $n: LISTING FAILED: $(cat "$W/share/fail.log") [$st]"; fails=$((fails+1));
  else echo "round $n: ok [$st]"; fi
  if [ "$MODE" = overlap ] && [ -n "$prev" ]; then R kill "$prev" KILL; R delete -force "$prev"; fi
  prev=$id
done
echo "rounds=$ROUNDS mode=$MODE bg=${BG:-0} gap=$GAP failures=$fails"
