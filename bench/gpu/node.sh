#!/usr/bin/env bash
# A GPU node end to end (issue 15; bench/gpu/node.py does the work, bench/gpu/README.md
# "GPU node" says what comes back). One command for every call:
#
#   On the GPU machine (device tool; `make carry-node` here first), the same command
#   in consecutive calls, each within the 30 s a machine stays warm:
#     call 1, carry [".carry-node/a"]:  bash bench/gpu/node.sh   -> exit 3: parts b, c still missing
#     call 2, carry [".carry-node/b"]:  bash bench/gpu/node.sh   -> exit 3: part c still missing
#     call 3, carry [".carry-node/c"]:  bash bench/gpu/node.sh   -> starts the run (detached), waits
#     call 4.. (no carry):              bash bench/gpu/node.sh   -> waits, collects
#   (one call per part bench/gpu/node-parts.txt names, in any order)
#   Extra arguments go to node.py at the start of the run (e.g. --model llama-3b,
#   --repeat 5: rounds of cold / store / cache starts, default 3 on a GPU).
#   THAW_NODE_AGAIN=1 forgets a finished run and starts another one.
#
#   CPU rehearsal (CI: tests/integration/test_gpu_node_rehearsal.py), in the foreground
#   with build/ and the virtualenv:
#     bash bench/gpu/node.sh --cpu --work DIR --out DIR [node.py args]
#
# Exit: 0 the run finished and every check passed; 1 it finished with a failed check or
# an error (node.json says which); 3 a carry part is still missing; 4 the run is still
# going: call again (same command) within 30 s; 2 a set-up error.
# Writes $OUT/node.json, $OUT/node.log, $OUT/node-logs.tar.xz ($OUT/unpack.json too).
#
# THAW_NODE_NAME=pods: the same for bench/gpu/pods.py (bench/gpu/pods.sh sets it): the
# same carry, its own state (/var/tmp/thaw-pods), pods.json, pods.log, pods-logs.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../.."
name=${THAW_NODE_NAME:-node}

if [[ "${1:-}" == "--cpu" ]]; then
  shift
  py=.venv/bin/python
  weed=$("$py" -c 'from control.dev.seaweed import weed_binary; print(weed_binary())') || exit 2
  exec "$py" "bench/gpu/$name.py" --mode cpu --bin "${THAW_BUILD_DIR:-build}" --weed "$weed" "$@"
fi

out=${OUT:-/tmp/thaw-$name-out}
state=${THAW_NODE_STATE:-/var/tmp/thaw-$name}
bin=$state/bin
wait_s=${THAW_NODE_WAIT_S:-540}
# Seams for tests/functional/test_gpu_node_sh.py (the defaults are the real run's).
parts=${THAW_NODE_PARTS:-.carry-node}
list=${THAW_NODE_LIST:-bench/gpu/node-parts.txt}
driver=${THAW_NODE_DRIVER:-bench/gpu/$name.py}
mkdir -p "$out" "$state"

python3 bench/gpu/node_unpack.py --parts "$parts" --list "$list" --bin "$bin" > "$out/unpack.json"
rc=$?
cat "$out/unpack.json"
if [[ $rc -ne 0 ]]; then
  [[ $rc -eq 3 ]] && echo "node.sh: waiting for the other carry part(s): call again with the next within 30 s (unpack.json names what is missing)"
  exit $rc
fi
export PYTHONPATH="$PWD:$bin/site" THAW_NODE_SITE="$bin/site" PYTHONUNBUFFERED=1

pid_alive() { [[ -f "$state/driver.pid" ]] && kill -0 "$(cat "$state/driver.pid")" 2>/dev/null; }
collect() {
  cp -f "$state/run/$name.json" "$state/run/$name-logs.tar.xz" "$out/" 2>/dev/null
  # soak.py's failed restores' logs, kept when each failed (Node.evidence)
  [[ -d "$state/run/evidence" ]] && cp -rf "$state/run/evidence" "$out/"
  tail -c 4000000 "$state/$name.log" > "$out/$name.log" 2>/dev/null
}

if [[ "${THAW_NODE_AGAIN:-}" == 1 ]] && ! pid_alive; then
  rm -rf "$state/run" "$state/$name.log" "$state/driver.pid" "$state/rc"
fi
if ! pid_alive && [[ ! -f "$state/rc" ]]; then
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader 2>&1
  df -h / "$state" 2>&1
  # setsid: the device tool ends a command's processes when it returns, except a new session's;
  # the run outlives this call, and the next call of this script waits for it.
  # Its stdio is not this call's: the tool would wait for the pipe to close.
  rm -f "$state/driver.pid"
  # The run works from its own copy of the tree: the device tool copies the working tree
  # anew at every call, and a `thaw` started mid-copy failed its imports (2026-12-04:
  # "cannot import name 'config' from 'control'", the run lost).
  tree=$state/tree
  rm -rf "$tree" && mkdir -p "$tree" &&
    tar --exclude=./.carry-node --exclude=./.venv --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$tree" || exit 2
  export PYTHONPATH="$tree:$bin/site"
  setsid bash -c 'cd "$5" && echo $$ > "$2/driver.pid"; python3 "$3" --mode gpu --bin "$1" --work "$2/work" \
      --out "$2/run" "${@:6}" > "$2/$4.log" 2>&1; echo $? > "$2/rc"' _ "$bin" "$state" "$driver" "$name" "$tree" "$@" \
      > /dev/null 2>&1 < /dev/null &
  for _ in $(seq 50); do [[ -s "$state/driver.pid" ]] && break; sleep 0.1; done
  echo "node.sh: run started (pid $(cat "$state/driver.pid" 2>/dev/null)); log $state/$name.log"
fi

end=$((SECONDS + wait_s))
last=0
while pid_alive && [[ ! -f "$state/rc" ]] && (( SECONDS < end )); do
  sleep 2
  if (( SECONDS - last >= 30 )); then
    last=$SECONDS
    tail -n 3 "$state/$name.log" 2>/dev/null | cut -c1-300
  fi
done
collect
if [[ -f "$state/rc" ]]; then
  tail -n 40 "$state/$name.log" | cut -c1-400
  rc=$(cat "$state/rc")
  echo "node.sh: run finished, exit $rc; $out/$name.json"
  exit $(( rc == 0 ? 0 : 1 ))
fi
if pid_alive; then
  tail -n 5 "$state/$name.log" | cut -c1-300
  echo "node.sh: still running: call again (same command) within 30 s"
  exit 4
fi
echo "node.sh: the run died without an exit status; see $out/$name.log"
exit 1
