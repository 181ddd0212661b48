#!/usr/bin/env bash
# Packs what the GPU machine lacks into .carry/ (git-ignored, named in the
# device tool's `carry`): runsc compressed (the tree that travels is capped at
# 64 MiB), the CUDA checkpoint helper, and wheels of Python packages missing there.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${THAW_BUILD_DIR:-build}
mkdir -p .carry
if [[ ! -f .carry/runsc.xz || "$build/runsc" -nt .carry/runsc.xz ]]; then
  xz -T2 -6 -c "$build/runsc" > .carry/runsc.xz.tmp && mv .carry/runsc.xz.tmp .carry/runsc.xz
fi
cp -f "$build/thaw-cuda-checkpoint" .carry/
ls -la .carry
