#!/usr/bin/env bash
# Device-machine entry point of the CLI lifecycle run (bench/gpu/lifecycle.py, issue 12):
# thaw run --gpus 0 -> thaw checkpoint -> thaw restore --gpus N -> identical answers,
# a GPU checkpoint that fails on a full tmpfs while the workload keeps serving,
# --cold-fallback with the GPUs re-injected. Expects .carry/ from `make carry`
# (runsc.xz, thaw-cuda-checkpoint, thaw-monitor, wheels/). Every argument goes to
# lifecycle.py, e.g.
#   bash bench/gpu/lifecycle.sh                          # gpt2-large on GPU 0 (and 1 when there are 2)
#   bash bench/gpu/lifecycle.sh --model llama-3b
# CPU rehearsal (no GPU, no torch; never a GPU result):
#   OUT=/tmp/lc bash bench/gpu/lifecycle.sh --device cpu --backend fake --python /usr/bin/python3
# Writes $OUT/lifecycle.json (or lifecycle-cpu.json), $OUT/lifecycle.log and
# $OUT/thaw-logs.tar.xz (the sandboxes' workload logs and runsc's own).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
bin=/tmp/thaw-bin
mkdir -p "$bin" "$out"
if [[ -f .carry/runsc.xz ]]; then
  python3 -c 'import lzma,shutil; shutil.copyfileobj(lzma.open(".carry/runsc.xz"), open("/tmp/thaw-bin/runsc","wb"))' || exit 1
  chmod 755 "$bin/runsc"
  for b in thaw-cuda-checkpoint thaw-monitor; do
    cp ".carry/$b" "$bin/" && chmod 755 "$bin/$b" || exit 1
  done
else   # here: the build directory
  for b in runsc thaw-cuda-checkpoint thaw-monitor; do cp "build/$b" "$bin/" || exit 1; done
fi
# The thaw CLI's own imports that the machine may lack travel as wheels; a
# module already importable is not shadowed.
site=/tmp/site
mkdir -p "$site"
for pair in click:click filelock:filelock pyroute2:pyroute2 pynvml:nvidia_ml_py; do
  mod=${pair%%:*} whl=${pair##*:}
  if ! python3 -c "import $mod" 2>/dev/null; then
    compgen -G ".carry/wheels/$whl-*.whl" >/dev/null || { echo "no module $mod and no .carry/wheels/$whl-*.whl"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .carry/wheels/$whl-*.whl || exit 1
  fi
done
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
name=lifecycle
for a in "$@"; do [[ "$a" == cpu ]] && name=lifecycle-cpu; done
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$bin/runsc" --version | head -1
work=${THAW_LIFECYCLE_WORK:-/var/tmp/thaw-lifecycle}
python3 bench/gpu/lifecycle.py --runsc "$bin/runsc" --out "$out/$name.json" --work "$work" "$@" 2>&1 | tee "$out/$name.log"
rc=${PIPESTATUS[0]}
tar -C "$work" -cJf "$out/thaw-logs.tar.xz" log 2>/dev/null
exit "$rc"
