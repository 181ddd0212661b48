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
# Experimental runsc builds (bench/gpu/build-runsc-variant.sh) travel too, when built.
for v in "$build"/runsc-*; do
  [[ -f "$v" ]] || continue
  name=$(basename "$v")
  if [[ ! -f ".carry/$name.xz" || "$v" -nt ".carry/$name.xz" ]]; then
    xz -T2 -6 -c "$v" > ".carry/$name.xz.tmp" && mv ".carry/$name.xz.tmp" ".carry/$name.xz"
  fi
done
cp -f "$build/thaw-cuda-checkpoint" .carry/
# Pure-Python wheels of what bench/gpu needs and the H200 image lacks:
# pyroute2 (network plumbing for bench/gpu/models.py --channel http), at the
# version the virtualenv has.
mkdir -p .carry/wheels
pyroute2=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pyroute2"))')
if ! compgen -G ".carry/wheels/pyroute2-$pyroute2-*.whl" >/dev/null; then
  rm -f .carry/wheels/pyroute2-*.whl
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .carry/wheels "pyroute2==$pyroute2"
fi
ls -la .carry .carry/wheels
