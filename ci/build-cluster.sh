#!/usr/bin/env bash
# Builds the dev cluster's binaries (control/dev/cluster.py, docs/cluster.md)
# from the Go module proxy at the versions go/dev/*/go.mod pin, into
# THAW_BUILD_DIR (default ./build):
#   k8s/kube      kube-apiserver, kube-controller-manager, kube-scheduler,
#                 kubelet and kubectl in one binary (go/dev/k8s/main.go), and
#                 links of those five names to it
#   k8s/etcd      go.etcd.io/etcd/server/v3 (go/dev/etcd)
#   k8s/helm      helm.sh/helm/v4/cmd/helm (go/dev/helm)
#   runc, containerd-shim-runc-v2
#                 the default runtime of a cluster node (go/dev/runc; the shim
#                 from containerd at go/go.mod's pin, beside build/containerd)
# Each is rebuilt only when its inputs (its module's files, this script, the
# Go version) change: build/k8s/.stamp-<name> holds their hash, as
# ci/build-go.sh's .stamp does. Builds run under `nice`: the machine's other
# work (tests, the Go build of thaw) keeps its share of the two CI cores.
# From scratch on the 2-core CI machine this takes minutes (docs/cluster.md
# "Build" has the measured times); an unchanged run takes about a second.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${THAW_BUILD_DIR:-"$here/build"}
dev=$here/go/dev
mkdir -p "$out/k8s"
export GOFLAGS=-buildvcs=false
# Niced, this script and every compile it starts (their niceness is inherited).
renice -n 10 -p $$ >/dev/null
go_version=$(go version)

stamp_of() { # stamp_of NAME FILES...: the hash of a component's inputs
  local name=$1; shift
  (cat "$here/ci/build-cluster.sh" "$@"; echo "$go_version $name") | sha256sum | cut -c1-16
}
fresh() { # fresh NAME STAMP OUTPUTS...: true when every output exists and the stamp matches
  local name=$1 stamp=$2; shift 2
  [[ "$(cat "$out/k8s/.stamp-$name" 2>/dev/null)" == "$stamp" ]] || return 1
  local o
  for o in "$@"; do [[ -x $o ]] || return 1; done
}
build() { # build NAME STAMP COMMAND...: run the build, time it, record the stamp
  local name=$1 stamp=$2; shift 2
  echo "build-cluster: $name"
  local t0=$SECONDS
  "$@"
  echo "$stamp" > "$out/k8s/.stamp-$name"
  echo "build-cluster: $name built in $((SECONDS - t0)) s"
}

# -- Kubernetes: one binary, five names --------------------------------------
kube_names=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
kube_version=$(cd "$dev/k8s" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
kube_stamp=$(stamp_of kube "$dev/k8s/go.mod" "$dev/k8s/go.sum" "$dev/k8s/main.go")
kube_build() {
  # The version the components report (kubectl version, the kubelet's node
  # status, the API server's /version and its compatibility version): as
  # kubernetes' hack/lib/version.sh stamps it, into both version packages.
  # The build date is the release's, from the module proxy, so a rebuild of
  # the same pin is the same binary.
  local major minor date ld="-s -w" pkg
  major=${kube_version#v}; major=${major%%.*}
  minor=${kube_version#v*.}; minor=${minor%%.*}
  date=$(cd "$dev/k8s" && go mod download -json "k8s.io/kubernetes@$kube_version" |
         sed -n 's/.*"Time": "\(.*\)",*/\1/p')
  [[ -n $date ]] || date=1970-01-01T00:00:00Z
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  # Static, as upstream builds the control plane and kubectl
  # (hack/lib/golang.sh KUBE_STATIC_BINARIES); the kubelet too: it needs no
  # cgo on Linux (docs/cluster.md).
  (cd "$dev/k8s" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$out/k8s/kube.tmp" .)
  mv -f "$out/k8s/kube.tmp" "$out/k8s/kube"
  local n
  for n in "${kube_names[@]}"; do ln -sfn kube "$out/k8s/$n"; done
}
if fresh kube "$kube_stamp" "$out/k8s/kube" "${kube_names[@]/#/$out/k8s/}"; then
  echo "build-cluster: kube ($kube_version) is up to date"
else
  build kube "$kube_stamp" kube_build
fi

# -- etcd ----------------------------------------------------------------------
etcd_stamp=$(stamp_of etcd "$dev/etcd/go.mod" "$dev/etcd/go.sum")
etcd_build() {
  (cd "$dev/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/k8s/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv -f "$out/k8s/etcd.tmp" "$out/k8s/etcd"
}
if fresh etcd "$etcd_stamp" "$out/k8s/etcd"; then
  echo "build-cluster: etcd is up to date"
else
  build etcd "$etcd_stamp" etcd_build
fi

# -- helm ----------------------------------------------------------------------
helm_stamp=$(stamp_of helm "$dev/helm/go.mod" "$dev/helm/go.sum")
helm_build() {
  local v
  v=$(cd "$dev/helm" && go list -m -f '{{.Version}}' helm.sh/helm/v4)
  # helm's Makefile stamps the version into internal/version (a tag build: no metadata).
  (cd "$dev/helm" && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$v -X helm.sh/helm/v4/internal/version.metadata=" \
    -o "$out/k8s/helm.tmp" helm.sh/helm/v4/cmd/helm)
  mv -f "$out/k8s/helm.tmp" "$out/k8s/helm"
}
if fresh helm "$helm_stamp" "$out/k8s/helm"; then
  echo "build-cluster: helm is up to date"
else
  build helm "$helm_stamp" helm_build
fi

# -- runc and containerd's runc shim ---------------------------------------------
# A node's default runtime (pods without a runtimeClassName): thaw's DaemonSet
# runs privileged with hostPID and host paths, which gVisor does not run.
containerd_version=$(cd "$here/go" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
runc_stamp=$(stamp_of runc "$dev/runc/go.mod" "$dev/runc/go.sum" <(echo "$containerd_version"))
runc_build() {
  local v
  v=$(cd "$dev/runc" && go list -m -f '{{.Version}}' github.com/opencontainers/runc)
  # runc needs cgo (libcontainer/nsenter is C) and, for seccomp, libseccomp
  # (libseccomp-dev, ci/setup.sh): the kubelet asks RuntimeDefault for every
  # pod sandbox, and containerd's CRI passes it on (internal/cri/server/
  # podsandbox/sandbox_run_linux.go); a runc without the seccomp tag then
  # refuses every pod ("config provided but seccomp not supported"). Of its
  # Makefile's other tags, libpathrs needs a Rust library and
  # urfave_cli_no_docs drops the man page code.
  [[ -e /usr/include/seccomp.h ]] || { echo "build-cluster: runc needs libseccomp-dev (ci/setup.sh installs it)" >&2; exit 1; }
  (cd "$dev/runc" && CGO_ENABLED=1 go build -trimpath -tags "seccomp urfave_cli_no_docs" \
    -ldflags "-s -w -X main.version=${v#v}" -o "$out/runc.tmp" github.com/opencontainers/runc)
  mv -f "$out/runc.tmp" "$out/runc"
  local gobin
  gobin=$(mktemp -d "$out/.gobin.XXXXXX")
  (cd "$here/go" && CGO_ENABLED=0 GOBIN=$gobin go install -trimpath -ldflags "-s -w" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version")
  mv -f "$gobin/containerd-shim-runc-v2" "$out/containerd-shim-runc-v2"
  rm -rf "$gobin"
}
if fresh runc "$runc_stamp" "$out/runc" "$out/containerd-shim-runc-v2"; then
  echo "build-cluster: runc and containerd-shim-runc-v2 are up to date"
else
  build runc "$runc_stamp" runc_build
fi
