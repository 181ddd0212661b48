#!/usr/bin/env bash
# Device entry for issue 17's restore-speed levers (docs/gpu.md, "Restore speed
# levers"): one H200 call of ~9 minutes. Per model, the driver's own
# checkpoint/restore outside a sandbox (--native), one cold start, the images the
# variants need taken from that one process (release, offload, offload-staged,
# drop: leave-running checkpoints), then the variants in priority order until
# the budget is spent:
#   thaw                  today's restore (the reference)
#   cooperative           pytorch-offload profile: weights in registered host memory, copied back after restore
#   parked                restored ahead of demand, CUDA state parked; timed from demand
#   parked-cooperative    both
#   *-thp                 host shmem huge pages (advise/defer) for the cold start and that restore
#   *-staged              weights in pageable host memory, copied back through a small pinned ring
#   thaw@readers128       the stock loader's 128 background page readers (thaw's runsc has 8:
#                         bench/gpu/build-runsc-variant.sh 128; any VARIANT@NAME restores with
#                         .carry/runsc-NAME.xz, left out when that was not carried)
#   cooperative-reload    weights dropped at checkpoint, read back from the model files
#   thaw-verified, thaw-thp-verified
#                         issue 30: the same image read through thaw-gofer, every chunk checked as the
#                         sentry reads it (a node's cache restore, cache.verify = read); needs
#                         .carry/thaw-gofer.xz and thaw-chunk.xz (make carry). Not in the default list:
#                         THAW_SPEED_MODELS=llama-3b THAW_SPEED_VARIANTS=thaw-thp,thaw-thp-verified ... --repeat 3
# (cooperative-alloc and no-background-thp exist too: THAW_SPEED_VARIANTS adds them.)
# Needs .carry/ from `make carry` (after `bash bench/gpu/build-runsc-variant.sh ...` for @ variants)
# (.carry/runsc.xz, .carry/runsc-NAME.xz of each variant build, .carry/thaw-cuda-checkpoint).
# Writes $OUT/speed.json (models.py's result, rewritten as it goes), $OUT/speed.log,
# $OUT/env.txt and $OUT/runsc-logs.tar.xz. Extra arguments go to models.py.
# THAW_SPEED_MODELS / THAW_SPEED_VARIANTS / THAW_SPEED_8B_VARIANTS / THAW_SPEED_BUDGET_S override.
set -uo pipefail
cd "$(dirname "$0")/../.."
t_start=$(date +%s)
out=${OUT:-/tmp/out}
mkdir -p /tmp/thaw-bin "$out"
rm -f /tmp/thaw-bin/runsc-*       # only this run's carried builds name variants
unxz_to() { python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$1" "$2" && chmod 755 "$2"; }
unxz_to .carry/runsc.xz /tmp/thaw-bin/runsc || exit 1
alts=()
for x in .carry/runsc-*.xz; do
  [[ -f "$x" ]] || continue
  name=$(basename "$x" .xz)
  unxz_to "$x" "/tmp/thaw-bin/$name" || exit 1
  alts+=(--restore-runsc "${name#runsc-}=/tmp/thaw-bin/$name")
done
cp .carry/thaw-cuda-checkpoint /tmp/thaw-bin/ && chmod 755 /tmp/thaw-bin/thaw-cuda-checkpoint || exit 1
# The *-verified variants (issue 30) read the image through thaw-gofer, chunked by thaw-chunk.
verify=()
if [[ -f .carry/thaw-gofer.xz && -f .carry/thaw-chunk.xz ]]; then
  unxz_to .carry/thaw-gofer.xz /tmp/thaw-bin/thaw-gofer && unxz_to .carry/thaw-chunk.xz /tmp/thaw-bin/thaw-chunk || exit 1
  verify=(--gofer /tmp/thaw-bin/thaw-gofer --chunker /tmp/thaw-bin/thaw-chunk)
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# Host THP: the driver sets shmem_enabled/defrag for the *-thp steps and puts
# them back after each; this puts them back too if the driver dies.
thp=/sys/kernel/mm/transparent_hugepage
thp_get() { sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp/$1"; }
thp_shmem=$(thp_get shmem_enabled); thp_defrag=$(thp_get defrag)
trap 'echo "$thp_shmem" > $thp/shmem_enabled; echo "$thp_defrag" > $thp/defrag' EXIT

{
  echo "date: $(date -u +%FT%TZ)"; uname -r; nproc; free -g | head -2; df -h /var/tmp | tail -1
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,persistence_mode,clocks.max.sm --format=csv
  echo "thp: enabled=$(thp_get enabled) defrag=$thp_defrag shmem_enabled=$thp_shmem"
  /tmp/thaw-bin/runsc --version | head -1
  for a in /tmp/thaw-bin/runsc-*; do [[ -f "$a" ]] && echo "$(basename "$a"): $("$a" --version | head -1)"; done
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

models=${THAW_SPEED_MODELS:-gpt2-large,llama-3b,llama-8b}
# In priority order: the budget ends the list, not the images (all made first, from one process).
variants=${THAW_SPEED_VARIANTS:-thaw,cooperative,parked,parked-cooperative,cooperative-thp,parked-cooperative-thp,cooperative-staged,parked-staged,thaw@readers128,thaw-thp,cooperative-reload}
# 8B: its weights, cold start and 17 GB images cost minutes: two images (disk: 16 GB of weights
# and 2 x 17 GB of images of the 64 GiB), no THP (its cold start and checkpoints would run under
# it too, and pageable GPU->host copies may slow down under huge pages: gVisor #12804), so its
# thaw is also a reference taken without THP anywhere.
v8=${THAW_SPEED_8B_VARIANTS:-thaw,cooperative,parked-cooperative,parked,thaw@readers128}
# A VARIANT@NAME restores with /tmp/thaw-bin/runsc-NAME: leave it out when that build was not carried.
carried() { local v; for v in $(tr ',' ' ' <<<"$1"); do
  [[ "$v" != *@* || -f "/tmp/thaw-bin/runsc-${v#*@}" ]] && echo "$v"; done | paste -sd,; }
variants=$(carried "$variants"); v8=$(carried "$v8")
# Start no new step after this: the device kills the command at 600 s; the tail below takes ~15 s.
budget=$(( ${THAW_SPEED_BUDGET_S:-540} - ($(date +%s) - t_start) - 25 ))
work=${THAW_BENCH_WORK:-/var/tmp/thaw-bench}
mkdir -p "$work"
# The page cache stays as it is unless a *-cold-cache variant needs it dropped (THAW_SPEED_DROP_CACHES=1).
drop=(--no-drop-caches); [[ "${THAW_SPEED_DROP_CACHES:-}" == 1 ]] && drop=()
python3 bench/gpu/models.py --runsc /tmp/thaw-bin/runsc --helper /tmp/thaw-bin/thaw-cuda-checkpoint \
  --out "$out/bench" --work "$work" --budget-s "$budget" "${drop[@]}" --native \
  --models "$models" --variants "$variants" --model-variants "llama-8b=$v8" "${alts[@]}" "${verify[@]}" "$@" 2>&1 | tee "$out/speed.log"
rc=${PIPESTATUS[0]}
cp "$out/bench/models.json" "$out/speed.json" 2>/dev/null
python3 bench/gpu/models.py table "$out/speed.json" 2>&1 | tee -a "$out/speed.log"
find "$out/bench/runsc-logs" -type f -size +12M 2>/dev/null | while read -r f; do
  { head -c 2M "$f"; printf '\n[... cut by run-speed.sh ...]\n'; tail -c 6M "$f"; } > "$f.cut" && mv "$f.cut" "$f"
done
tar -C "$out/bench" -cJf "$out/runsc-logs.tar.xz" runsc-logs 2>/dev/null
rm -rf "$out/bench"
echo "run-speed.sh: $(( $(date +%s) - t_start )) s" | tee -a "$out/speed.log"
exit $rc
