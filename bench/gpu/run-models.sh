#!/usr/bin/env bash
# Device-machine entry point of the model restore benchmark (bench/gpu/models.py).
# Expects .carry/ from `make carry` (runsc.xz, thaw-cuda-checkpoint, wheels/).
# Every argument goes to models.py, e.g.
#   bash bench/gpu/run-models.sh --models gpt2-large,llama-3b
#   bash bench/gpu/run-models.sh --models llama-8b --variants thaw,thaw-cold-cache,plain
#   bash bench/gpu/run-models.sh --models llama-8b --variants thaw,thaw@readers8   # with .carry/runsc-readers8.xz
# Writes $OUT/models.json, $OUT/models.log and $OUT/runsc-logs.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p /tmp/thaw-bin "$out"
python3 -c 'import lzma,shutil; shutil.copyfileobj(lzma.open(".carry/runsc.xz"), open("/tmp/thaw-bin/runsc","wb"))' || exit 1
chmod 755 /tmp/thaw-bin/runsc
# Experimental runsc builds (.carry/runsc-NAME.xz): variants VARIANT@NAME restore with them.
alts=()
for x in .carry/runsc-*.xz; do
  [[ -f "$x" ]] || continue
  name=$(basename "$x" .xz)
  python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$x" "/tmp/thaw-bin/$name" || exit 1
  chmod 755 "/tmp/thaw-bin/$name"
  alts+=(--restore-runsc "${name#runsc-}=/tmp/thaw-bin/$name")
done
cp .carry/thaw-cuda-checkpoint /tmp/thaw-bin/ && chmod 755 /tmp/thaw-bin/thaw-cuda-checkpoint || exit 1
# thaw-gofer and thaw-chunk (ci/carry.sh): the *-verified variants read the image through
# thaw-gofer, every chunk checked (issue 30).
for b in thaw-gofer thaw-chunk; do
  [[ -f ".carry/$b.xz" ]] || continue
  python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' ".carry/$b.xz" "/tmp/thaw-bin/$b" || exit 1
  chmod 755 "/tmp/thaw-bin/$b"
done
[[ -x /tmp/thaw-bin/thaw-gofer && -x /tmp/thaw-bin/thaw-chunk ]] && alts+=(--gofer /tmp/thaw-bin/thaw-gofer --chunker /tmp/thaw-bin/thaw-chunk)
# pyroute2 (for --channel http) is missing there; it travels as a wheel.
if compgen -G ".carry/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/wheels/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Another device entry that needs only the carry unpacked (bench/gpu/run-fd-clobber.sh).
[[ -n "${THAW_BENCH_UNPACK_ONLY:-}" ]] && exit 0
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
/tmp/thaw-bin/runsc --version | head -1
work=${THAW_BENCH_WORK:-/var/tmp/thaw-bench}
mkdir -p "$work" && df -h "$work" | tail -1 && free -g | head -2
# Start no new step after 540 s: the device command is killed at 600 s, and
# models.json is rewritten after every model.
python3 bench/gpu/models.py --runsc /tmp/thaw-bin/runsc --helper /tmp/thaw-bin/thaw-cuda-checkpoint \
  --out "$out/bench" --work "$work" --budget-s "${THAW_BENCH_BUDGET_S:-540}" "${alts[@]}" "$@" 2>&1 | tee "$out/models.log"
rc=${PIPESTATUS[0]}
cp "$out/bench/models.json" "$out/" 2>/dev/null
# A file that comes back is at most 16 MiB: cut long logs to their head and tail.
find "$out/bench/runsc-logs" -type f -size +12M 2>/dev/null | while read -r f; do
  { head -c 2M "$f"; printf '\n[... cut by run-models.sh ...]\n'; tail -c 6M "$f"; } > "$f.cut" && mv "$f.cut" "$f"
done
tar -C "$out/bench" -cJf "$out/runsc-logs.tar.xz" runsc-logs 2>/dev/null
rm -rf "$out/bench"
exit $rc
