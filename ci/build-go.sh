#!/usr/bin/env bash
# Builds the pinned gVisor stack (runsc, containerd-shim-runsc-v1),
# containerd + ctr, crictl and three CNI plugins (cni-bin/) from the Go module
# proxy into one build directory
# (THAW_BUILD_DIR, default ./build), then thaw's own Go commands (go/cmd/*).
# The upstream binaries are rebuilt only when their inputs (go/go.mod,
# go/go.sum, this script, the Go version) change: .stamp holds the hash of
# those inputs. thaw's own commands are rebuilt every time; Go's build cache
# makes an unchanged rebuild take about a second.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${THAW_BUILD_DIR:-"$here/build"}
mkdir -p "$out"

pins=$(cd "$here/go" && go list -m -f '{{.Path}}@{{.Version}}' gvisor.dev/gvisor github.com/containerd/containerd/v2 sigs.k8s.io/cri-tools github.com/containernetworking/plugins)
inputs=$( (cd "$here" && echo "$pins" && cat ci/build-go.sh ci/patch-runsc-loader.py ci/patch-runsc-populate.py ci/patch-runsc-restoring.py ci/patch-runsc-uvmclose.py ci/runsc_patch.py go/overlay/*/*.go; go version) | sha256sum | cut -c1-16)

# thaw's version, from its one source (control/version.py), stamped into the
# Go commands (go/internal/version).
thaw_version=$(python3 "$here/control/version.py")
build_own() {
  # thaw's own Go commands, static (CGO_ENABLED=0) so they travel to any node.
  if compgen -G "$here/go/cmd/*/main.go" >/dev/null; then
    (cd "$here/go" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
      -ldflags "-s -w -X thaw.dev/thaw/go/internal/version.Version=$thaw_version" -o "$out/" ./cmd/...)
    echo "build: thaw Go commands -> $out ($(cd "$here/go" && ls cmd | tr '\n' ' '))"
  fi
}
up_to_date=1
[[ -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$inputs" ]] || up_to_date=0
for b in runsc containerd-shim-runsc-v1 containerd ctr crictl cni-bin/ptp cni-bin/host-local cni-bin/loopback; do
  [[ -x "$out/$b" ]] || up_to_date=0
done
if (( up_to_date )); then
  echo "build: upstream binaries in $out are up to date ($inputs)"
  build_own
  exit 0
fi

cd "$here/go"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
gvisor_version=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
containerd_version=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
critools_version=$(go list -m -f '{{.Version}}' sigs.k8s.io/cri-tools)
cni_version=$(go list -m -f '{{.Version}}' github.com/containernetworking/plugins)
# The label runsc restores against: restore refuses a different version
# string, and unstamped builds all say VERSION_MISSING (docs/notes/gvisor-facts.md).
# Twin: control/config.py RUNSC_VERSION_LABEL.
label="thaw-gvisor-${gvisor_version##*-}"

# Upstream binaries are built with `go install pkg@version`, i.e. against
# their own go.mod: gVisor's and containerd's dependency graphs conflict in one
# module (containerd 2.4 needs opencontainers/runtime-spec 1.3, whose
# LinuxPids.Limit became a pointer that runsc/cgroup at the pin does not
# accept), and each project is tested upstream against its own graph anyway.
# go/go.mod stays the single record of the pinned versions.
gobin=$(mktemp -d "$out/.gobin.XXXXXX")
trap 'rm -rf "$gobin"' EXIT
install() { # install OUTPUT PACKAGE@VERSION [extra go install args]
  local name=$1 pkg=$2; shift 2
  echo "build: $name <- $pkg"
  GOBIN=$gobin go install -trimpath "$@" "$pkg"
  local built
  built=$(ls -t "$gobin" | head -1)
  mv -f "$gobin/$built" "$out/$name"
}
# Two upstream binaries are built from a patched copy of a module: `go build
# -overlay` refuses files in the module cache, so each builds in a throwaway
# module under the build directory that requires gVisor at the pin (so it
# resolves gVisor's own dependency graph) and replaces one module with a copy
# taken from the module cache, one file changed.
gvisor_gomod=$(go mod download -json "gvisor.dev/gvisor@$gvisor_version" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
gvisor_go=$(awk '$1 == "go" {print $2; exit}' "$gvisor_gomod")
copy_module() { # copy_module MODULE@VERSION DEST: a writable copy of the module from the module cache
  local dir
  dir=$(go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  mkdir -p "$(dirname "$2")" && cp -r "$dir" "$2" && chmod -R u+w "$2"
}
build_patched() { # build_patched OUTPUT PACKAGE REPLACED-MODULE WORKDIR [go build args]: WORKDIR/copy is the patched copy
  local name=$1 pkg=$2 replaced=$3 work=$4; shift 4
  mkdir -p "$work/mod"
  cat > "$work/mod/go.mod" <<MOD
module thaw.dev/patchedbuild

go $gvisor_go

require gvisor.dev/gvisor $gvisor_version

replace $replaced => ../copy
MOD
  printf 'package patchedbuild\n\nimport _ "%s"\n' "$pkg" > "$work/mod/tools.go"
  (cd "$work/mod" && go mod tidy >/dev/null 2>&1 && go build -trimpath "$@" -o "$out/$name" "$pkg")
  rm -rf "$work"
}

# runsc carries four patches. Its background page loader restores with fewer,
# and on huge pages larger, reads than the pin's 128 of 256 KiB (upstream gVisor
# PR #14568; ci/patch-runsc-loader.py says what and why, docs/gvisor-notes.md
# "The pin" what was measured); the reader only: checkpoints still write with
# the pin's. And before the CUDA restore that ends a GPU restore, the CUDA
# processes' memory is faulted in through the sentry's mapping (the approach of
# upstream gVisor PR #13753; ci/patch-runsc-populate.py). And `runsc events`
# and `runsc ps` answer an error while a sandbox restores instead of reading the
# bare kernel the restore swaps in, which panicked the sentry and failed a pod's
# restore (ci/patch-runsc-restoring.py). And a restored CUDA process's second
# close of its temporary /dev/nvidia-uvm number no longer closes another
# thread's file (libcuda's double close, reached on gVisor's path; the GPU
# EBADF; ci/patch-runsc-uvmclose.py). Same version label: images restore
# across patched and unpatched builds alike (the format is untouched).
RESTORE_HUGE_READERS=12     # memory file on huge pages (GPU nodes: node.huge_pages)
RESTORE_HUGE_READ_KIB=4096
RESTORE_SMALL_READERS=8     # small pages, reads of the pin's 256 KiB
runsc_work="$out/.runsc-build"
rm -rf "$runsc_work"
copy_module "gvisor.dev/gvisor@$gvisor_version" "$runsc_work/copy"
echo "build: runsc <- gvisor.dev/gvisor/runsc@$gvisor_version, patched:"
python3 "$here/ci/patch-runsc-loader.py" "$runsc_work/copy" "$RESTORE_HUGE_READERS" "$RESTORE_HUGE_READ_KIB" \
  "$RESTORE_SMALL_READERS" || exit 1
python3 "$here/ci/patch-runsc-populate.py" "$runsc_work/copy" || exit 1
python3 "$here/ci/patch-runsc-restoring.py" "$runsc_work/copy" || exit 1
python3 "$here/ci/patch-runsc-uvmclose.py" "$runsc_work/copy" || exit 1
build_patched runsc gvisor.dev/gvisor/runsc gvisor.dev/gvisor "$runsc_work" \
  -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$label"
# The shim is built with thaw's oom_linux.go in place of containerd's (see
# go/overlay/containerd-sys/oom_linux.go for why), in the containerd version
# gVisor needs.
shim_work="$out/.shim-build"
rm -rf "$shim_work"
shim_containerd=$(awk '$1 == "github.com/containerd/containerd/v2" {print $2; exit}' "$gvisor_gomod")
copy_module "github.com/containerd/containerd/v2@$shim_containerd" "$shim_work/copy"
cp "$here/go/overlay/containerd-sys/oom_linux.go" "$shim_work/copy/pkg/sys/oom_linux.go"
echo "build: containerd-shim-runsc-v1 <- gvisor.dev/gvisor/shim@$gvisor_version (containerd $shim_containerd, thaw oom_linux.go)"
build_patched containerd-shim-runsc-v1 gvisor.dev/gvisor/shim github.com/containerd/containerd/v2 "$shim_work" \
  -ldflags "-s -w"
install containerd "github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
  -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w"
install ctr "github.com/containerd/containerd/v2/cmd/ctr@$containerd_version" -ldflags "-s -w"
# crictl talks CRI to containerd as the kubelet does (tests/integration pod
# tests, docs/containerd.md#cri). Its version is stamped the way cri-tools'
# Makefile does (GO_LDFLAGS -X .../pkg/version.Version); unstamped it says "unknown".
install crictl "sigs.k8s.io/cri-tools/cmd/crictl@$critools_version" \
  -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${critools_version#v}"
# containerd's CRI plugin refuses to start a pod outside the host network
# without a CNI network that gives the pod's eth0 an address ("cni plugin not
# initialized", then "failed to find network info"): ptp (a veth pair, no
# bridge) with host-local addresses, plus loopback, which CRI runs for every
# pod's lo (docs/containerd.md#cri).
mkdir -p "$out/cni-bin"
for p in main/ptp ipam/host-local main/loopback; do
  install "cni-bin/${p#*/}" "github.com/containernetworking/plugins/plugins/$p@$cni_version" -ldflags "-s -w"
done
echo "$inputs" > "$out/.stamp"
build_own
echo "build: done -> $out ($("$out/runsc" --version | head -1))"
