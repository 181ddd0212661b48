#!/usr/bin/env bash
# Packs what the GPU machine lacks into .carry/ (git-ignored, named in the
# device tool's `carry`): runsc compressed (the tree that travels is capped at
# 64 MiB), the CUDA checkpoint helper, the sandbox monitor, and wheels of Python
# packages missing there.
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
cp -f "$build/thaw-cuda-checkpoint" "$build/thaw-monitor" .carry/
# thaw-gofer and thaw-chunk: bench/gpu/models.py's *-verified variants (issue 30: the image read
# through thaw-gofer, every chunk checked), compressed like runsc.
for b in thaw-gofer thaw-chunk; do
  if [[ ! -f ".carry/$b.xz" || "$build/$b" -nt ".carry/$b.xz" ]]; then
    xz -T2 -6 -c "$build/$b" > ".carry/$b.xz.tmp" && mv ".carry/$b.xz.tmp" ".carry/$b.xz"
  fi
done
# Pure-Python wheels of what bench/gpu needs and the H200 image lacks, at the
# versions the virtualenv has: pyroute2 (network plumbing: bench/gpu/models.py
# --channel http, `thaw run`), and the thaw CLI's own imports for
# bench/gpu/lifecycle.sh (click, filelock, nvidia-ml-py); lifecycle.sh installs
# only those the machine's python3 cannot import.
mkdir -p .carry/wheels
for pkg in pyroute2 click filelock nvidia-ml-py; do
  ver=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$pkg'))")
  whl=${pkg//-/_}
  if ! compgen -G ".carry/wheels/$whl-$ver-*.whl" >/dev/null; then
    rm -f .carry/wheels/$whl-*.whl
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .carry/wheels "$pkg==$ver"
  fi
done
ls -la .carry .carry/wheels
