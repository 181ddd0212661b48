#!/usr/bin/env bash
# Every set-up step thaw needs on a fresh machine, idempotent and cached:
#   1. Debian packages (only when a tool is missing)
#   2. the Python virtualenv in .venv with thaw installed editable (+ the dev extras)
#   3. the Go builds (ci/build-go.sh: runsc, shim, containerd, ctr, crictl, CNI plugins;
#      ci/build-cluster.sh: the dev cluster's Kubernetes, etcd, helm, runc)
#   4. the CUDA checkpoint helper (C, libcuda loaded at run time)
#   5. the DaemonSet image (ci/build-image.sh: an OCI archive, no daemon)
#   6. promtool (ci/build-promtool.sh), which the unit tier's rules test runs
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
build=${THAW_BUILD_DIR:-"$here/build"}

[[ $(id -u) -eq 0 ]] || { echo "setup: thaw needs root (runsc create/restore refuse --rootless)" >&2; exit 1; }
[[ $(uname -m) == x86_64 ]] || { echo "setup: thaw supports x86_64 only, this is $(uname -m)" >&2; exit 1; }

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
command -v go >/dev/null || need_apt+=(golang-go)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v xz >/dev/null || need_apt+=(xz-utils)
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)   # the DaemonSet image's Debian base
# runc's seccomp (ci/build-cluster.sh): CRI gives every pod sandbox RuntimeDefault.
[[ -e /usr/include/seccomp.h ]] && command -v pkg-config >/dev/null || need_apt+=(libseccomp-dev pkg-config)
if ((${#need_apt[@]})); then
  echo "setup: apt-get install ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

venv_stamp=$(cat pyproject.toml control/version.py ci/setup.sh | sha256sum | cut -c1-16)
if [[ ! -x .venv/bin/python || "$(cat .venv/.stamp 2>/dev/null)" != "$venv_stamp" ]]; then
  echo "setup: python virtualenv .venv"
  python3 -m venv --clear .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'   # dev: the demo's store, tests, proto tools (pyproject.toml)
  echo "$venv_stamp" > .venv/.stamp
else
  echo "setup: .venv is up to date"
fi

bash ci/gen-proto.sh   # go/gen/thawpb must exist before the Go build
# Byte-compile thaw's own packages as an installed wheel would be (the Makefile
# sets PYTHONDONTWRITEBYTECODE so test runs leave no __pycache__ behind; without
# this every `thaw` command would compile its modules again: ~50 ms here).
.venv/bin/python -m compileall -q control runsc_hooks nvproxy
bash ci/build-go.sh
bash ci/build-cluster.sh

helper_src=nvproxy/cuda_checkpoint/thaw-cuda-checkpoint.c
if [[ ! -x "$build/thaw-cuda-checkpoint" || "$helper_src" -nt "$build/thaw-cuda-checkpoint" ]]; then
  echo "setup: build thaw-cuda-checkpoint"
  gcc -O2 -Wall -Wextra -Werror -o "$build/thaw-cuda-checkpoint.tmp" "$helper_src" -ldl
  mv -f "$build/thaw-cuda-checkpoint.tmp" "$build/thaw-cuda-checkpoint"
fi
# A static busybox from Debian: the root filesystem of the OCI images the
# containerd tests and benchmark build locally (control/dev/ocibuild.py).
if [[ ! -x "$build/busybox" ]]; then
  echo "setup: busybox-static (Debian package)"
  tmp=$(mktemp -d)
  (cd "$tmp" && { apt-get download -qq busybox-static 2>/dev/null || { apt-get update -qq && apt-get download -qq busybox-static; }; })
  dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/x"
  install -m 0755 "$tmp/x/bin/busybox" "$build/busybox"
  rm -rf "$tmp"
fi

bash ci/build-image.sh
# A test tool no node needs, kept out of ci/build-go.sh, but built here so that no
# test tier builds anything: minutes the first time (docs/operate.md "promtool"),
# a stamp check afterwards.
bash ci/build-promtool.sh

echo "setup: ready"
