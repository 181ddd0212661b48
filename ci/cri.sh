#!/usr/bin/env bash
# A private containerd with its CRI plugin on, driven by crictl as the kubelet
# would drive it: the recipe behind tests/integration/test_cri_pod.py and
# docs/containerd.md#cri. Everything lives under BASE (config, state, socket,
# CNI config and addresses, logs); nothing is shared with the node's
# containerd.
#
#   ci/cri.sh up BASE      write the configs, build and import the pause and
#                          test images, start containerd; prints KEY=VALUE lines
#   ci/cri.sh smoke BASE [HANDLER]
#                          one pod through runp/create/start/ps/logs/exec/stop/rm
#   ci/cri.sh down BASE    stop pods, containerd and its shims; remove BASE
#   ci/cri.sh run BASE [HANDLER]    up, smoke, down
#
# Runtime handlers: `runsc` (gVisor's shim, runsc itself) and `runsc-thaw`
# (gVisor's shim, thaw's stand-in as runsc: cold starts unless a thawd
# answers on THAW_THAWD_SOCKET, default BASE/thawd.sock). Environment:
# THAW_BUILD_DIR (default ./build), THAW_CRI_SUBNET (pod addresses, default
# 10.216.0.0/24: outside the 10.213-10.215 ranges thaw's own sandboxes and
# tests use); THAW_CONFIG: the stand-in's configuration file (thawd.socket,
# standin.state_dir, standin.log, read as on a node from /etc/thaw/config.toml;
# control/dev/testbed.py CriStack writes one for a thawd it runs); without it
# the stand-in dials BASE/thawd.sock and keeps its state and log under BASE.
# THAW_THAWD_SOCKET, THAW_THAWD_PREPARE_TIMEOUT_S, THAW_THAWD_HEALTH_TIMEOUT_S
# are handed to the stand-in when set (its config keys, control/config.py,
# which override THAW_CONFIG's; it ignores unknown THAW_* names).
# THAW_CRI_CDI_DIRS: the directories (":"-separated) CRI reads CDI specs from
# for a container's CDI devices (default containerd's: /etc/cdi, /var/run/cdi);
# control/dev/testbed.py CriStack gives it one of fake GPUs. THAW_CRI_RUNSC_FLAGS:
# more runsc global flags, "name=value" words, for both handlers' runsc.toml
# (a GPU node's nvproxy=true: a pod's sandbox is made from its pause container,
# which names no GPU, so nvproxy must be on for the whole sandbox).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${THAW_BUILD_DIR:-"$here/build"}
subnet=${THAW_CRI_SUBNET:-10.216.0.0/24}
# Image names: what CRI's pinned sandbox image and the smoke pod use.
PAUSE_IMAGE=localhost/thaw/pause:cri
TEST_IMAGE=localhost/thaw/busybox:cri

die() { echo "cri.sh: $*" >&2; exit 1; }

[[ $# -ge 2 ]] || die "usage: ci/cri.sh up|smoke|down|run BASE [HANDLER]"
cmd=$1
base=$(realpath -m "$2")
handler=${3:-runsc}
sock=$base/containerd.sock

crictl() { "$build/crictl" --config "$base/crictl.yaml" "$@"; }
ctr() { "$build/ctr" --address "$sock" --namespace k8s.io "$@"; }

runsc_toml() { # FILE BINARY: gVisor shim options (control/node/containerd_config.py runsc_toml's keys)
  cat > "$1" <<EOF
binary_name = "$2"
root = "$base/runsc-root"
log_path = "$base/shim-logs/"

[runsc_config]
platform = "systrap"
EOF
  local w
  for w in ${THAW_CRI_RUNSC_FLAGS:-}; do
    [[ $w == *=* ]] || die "THAW_CRI_RUNSC_FLAGS: $w is not name=value"
    echo "${w%%=*} = \"${w#*=}\"" >> "$1"
  done
}

runtime_table() { # HANDLER RUNSC_TOML (control/node/containerd_config.py runtime_table's keys)
  cat <<EOF

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.$1]
  runtime_type = "io.containerd.runsc.v1"
  runtime_path = "$build/containerd-shim-runsc-v1"
  pod_annotations = ["thaw.dev/*", "dev.gvisor.*"]
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.$1.options]
    TypeUrl = "io.containerd.runsc.v1.options"
    ConfigPath = "$2"
EOF
}

# A busybox image spec for thaw-image: build/busybox and the applets the
# pause loop and the smoke pod use, root's passwd entry, /tmp.
busybox_spec() { # REF CMD_JSON
  local links="" a
  for a in sh cat echo sleep ls mkdir rm true env wc head httpd; do
    links+="{\"path\": \"/bin/$a\", \"link\": \"busybox\"},"
  done
  cat <<EOF
{"ref": "$1", "config": {"Cmd": $2, "Env": ["PATH=/bin"], "WorkingDir": "/"},
 "layers": [{"comment": "busybox (ci/cri.sh)", "entries": [
   {"path": "/bin/busybox", "src": "$build/busybox", "mode": "0755"}, $links
   {"path": "/etc/passwd", "data": "root:x:0:0:root:/root:/bin/sh\n"},
   {"path": "/etc/group", "data": "root:x:0:\n"},
   {"path": "/tmp", "dir": true, "mode": "1777"}]}]}
EOF
}

up() {
  for b in containerd ctr crictl containerd-shim-runsc-v1 runsc thaw-runsc thaw-image busybox \
           cni-bin/ptp cni-bin/host-local cni-bin/loopback; do
    [[ -x "$build/$b" ]] || die "$build/$b is not built: run \`make setup\`"
  done
  [[ ! -e "$base/containerd.pid" ]] || die "$base already has a containerd (ci/cri.sh down $base first)"
  mkdir -p "$base"/{cni/net.d,cni/ipam,images,logs,shim-logs,standin}

  runsc_toml "$base/runsc.toml" "$build/runsc"
  runsc_toml "$base/runsc-thaw.toml" "$build/thaw-runsc"
  # ptp: one veth pair per pod, no bridge device; host-local keeps its
  # address leases under BASE (its default, /var/lib/cni/networks, is
  # shared by the whole machine). CRI also runs the loopback plugin for lo.
  cat > "$base/cni/net.d/10-thaw-cri.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "thaw-cri", "plugins": [
  {"type": "ptp", "ipam": {"type": "host-local", "ranges": [[{"subnet": "$subnet"}]],
   "dataDir": "$base/cni/ipam", "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
  local cdi_dirs="" d
  if [[ -n ${THAW_CRI_CDI_DIRS:-} ]]; then
    local -a dirs
    IFS=: read -ra dirs <<< "$THAW_CRI_CDI_DIRS"
    for d in "${dirs[@]}"; do cdi_dirs+="${cdi_dirs:+, }\"$d\""; done
    cdi_dirs="  cdi_spec_dirs = [$cdi_dirs]"
  fi
  # No imports: the node's /etc/containerd is not read. CRI keys:
  # containerd v2.4.2 internal/cri/config (config.go, config_unix.go).
  {
    cat <<EOF
version = 3
root = "$base/root"
state = "$base/state"
imports = []
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  level = "info"

# The sandbox (pause) image CRI starts first in every pod; no registry is
# reachable, so it is imported (below) and pinned, never pulled.
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
  # The sandbox's spec asks oom_score_adj -998 (CRI's default for pause);
  # runsc start writes it and fails with EACCES where root lacks
  # CAP_SYS_RESOURCE (thaw's CI VM). Restricted, CRI never asks below
  # containerd's own score. A real node does not need this.
  restrict_oom_score_adj = true
  # Pod network namespaces under BASE instead of /var/run/netns.
  netns_mounts_under_state_dir = true
$cdi_dirs
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["$build/cni-bin"]
  conf_dir = "$base/cni/net.d"
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runsc"
EOF
    runtime_table runsc "$base/runsc.toml"
    runtime_table runsc-thaw "$base/runsc-thaw.toml"
  } > "$base/config.toml"
  cat > "$base/crictl.yaml" <<EOF
runtime-endpoint: unix://$sock
image-endpoint: unix://$sock
timeout: 30
EOF

  busybox_spec "$PAUSE_IMAGE" '["sh", "-c", "trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]' \
    | "$build/thaw-image" -spec - -o "$base/images/pause.tar" >/dev/null
  busybox_spec "$TEST_IMAGE" '["sh", "-c", "echo hello from $HOSTNAME; while :; do sleep 1; done"]' \
    | "$build/thaw-image" -spec - -o "$base/images/busybox.tar" >/dev/null

  # The stand-in's environment, as control/dev/containerd.py PrivateContainerd.env
  # gives it (the shim and runsc inherit containerd's environment); no other
  # THAW_* of the caller's leaks in.
  # Env names: go/internal/standin/config_keys.go (THAW_<SECTION>_<KEY>).
  local -a envv=(PATH="$build:$PATH" HOME="${HOME:-/root}" THAW_REAL_RUNSC="$build/runsc")
  if [[ -n ${THAW_CONFIG:-} ]]; then
    envv+=(THAW_CONFIG="$THAW_CONFIG")
    [[ -z ${THAW_THAWD_SOCKET:-} ]] || envv+=(THAW_THAWD_SOCKET="$THAW_THAWD_SOCKET")
  else
    envv+=(THAW_CONFIG=/dev/null THAW_THAWD_SOCKET="${THAW_THAWD_SOCKET:-$base/thawd.sock}"
           THAW_STANDIN_STATE_DIR="$base/standin" THAW_STANDIN_LOG="$base/standin.log")
  fi
  local v
  for v in THAW_THAWD_PREPARE_TIMEOUT_S THAW_THAWD_HEALTH_TIMEOUT_S; do
    [[ -z ${!v:-} ]] || envv+=("$v=${!v}")
  done
  (cd "$base" && exec env -i "${envv[@]}" \
      setsid "$build/containerd" --config "$base/config.toml" >"$base/containerd.log" 2>&1 </dev/null) &
  echo $! > "$base/containerd.pid"
  local i
  for i in $(seq 1 100); do
    kill -0 "$(cat "$base/containerd.pid")" 2>/dev/null || die "containerd exited; see $base/containerd.log"
    crictl version >/dev/null 2>&1 && break
    sleep 0.1
  done
  crictl version >/dev/null 2>&1 || die "containerd's CRI did not answer in 10 s; see $base/containerd.log"
  ctr images import "$base/images/pause.tar" >/dev/null
  ctr images import "$base/images/busybox.tar" >/dev/null
  echo "CONTAINERD_ADDRESS=$sock"
  echo "CRI_CONFIG_FILE=$base/crictl.yaml"
  echo "PAUSE_IMAGE=$PAUSE_IMAGE"
  echo "TEST_IMAGE=$TEST_IMAGE"
}

smoke() {
  local name=smoke-$handler pod cid out
  mkdir -p "$base/logs/$name"
  cat > "$base/$name-pod.json" <<EOF
{"metadata": {"name": "$name", "namespace": "default", "uid": "$name-uid", "attempt": 0},
 "hostname": "$name", "log_directory": "$base/logs/$name",
 "annotations": {"thaw.dev/workload": "$name"}, "linux": {}}
EOF
  cat > "$base/$name-app.json" <<EOF
{"metadata": {"name": "app"}, "image": {"image": "$TEST_IMAGE"}, "log_path": "app.log"}
EOF
  pod=$(crictl runp --runtime "$handler" "$base/$name-pod.json")
  cid=$(crictl create "$pod" "$base/$name-app.json" "$base/$name-pod.json")
  crictl start "$cid" >/dev/null
  crictl ps --pod "$pod" -o json | grep -q '"CONTAINER_RUNNING"' || die "container $cid is not running"
  for _ in $(seq 1 50); do
    out=$(crictl logs "$cid" 2>&1) && [[ $out == *"hello from $name"* ]] && break
    sleep 0.1
  done
  [[ $out == *"hello from $name"* ]] || die "logs of $cid: $out"
  out=$(crictl exec "$cid" cat /proc/version)
  [[ ${out,,} == *gvisor* ]] || die "exec in $cid did not run in gVisor: $out"
  crictl stop "$cid" >/dev/null
  crictl rm "$cid" >/dev/null
  crictl stopp "$pod" >/dev/null
  crictl rmp "$pod" >/dev/null
  [[ -z $(crictl pods -q --name "$name") ]] || die "pod $name still listed after rmp"
  echo "smoke: pod $name ($handler) ran, logged, exec'd, stopped and was removed"
}

down() {
  if [[ -S $sock ]] && [[ -e $base/containerd.pid ]]; then
    local p
    for p in $(crictl pods -q 2>/dev/null); do
      crictl stopp "$p" >/dev/null 2>&1 || true
      crictl rmp -f "$p" >/dev/null 2>&1 || true
    done
  fi
  if [[ -e $base/containerd.pid ]]; then
    local pid
    pid=$(cat "$base/containerd.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  # Shims run in their own sessions: end this instance's, by pid (a failed
  # sandbox start can leave one waiting forever, docs/containerd.md#cri).
  local p f
  for f in /proc/[0-9]*/cmdline; do
    tr '\0' '\n' 2>/dev/null < "$f" | grep -qxF -- "$sock" || continue
    p=${f#/proc/}; p=${p%/cmdline}
    [[ $(tr '\0' '\n' 2>/dev/null < "$f" | head -1) == */containerd-shim-runsc-v1 ]] && kill -KILL "$p" 2>/dev/null || true
  done
  # runsc sandboxes of this instance, then mounts under BASE (rootfs, netns).
  if [[ -d $base/runsc-root/k8s.io ]]; then
    for p in $("$build/runsc" --root "$base/runsc-root/k8s.io" list -q 2>/dev/null || true); do
      "$build/runsc" --root "$base/runsc-root/k8s.io" delete -force "$p" >/dev/null 2>&1 || true
    done
  fi
  # Any runsc process of this instance still alive (a sandbox whose state is
  # already gone, e.g. one stopped while restoring), by pid: its --root is
  # under BASE. A leaked sandbox keeps its pod's veth and host route, and
  # the next instance's pod with that address is unreachable.
  for f in /proc/[0-9]*/cmdline; do
    [[ $(tr '\0' '\n' 2>/dev/null < "$f" | head -1) == runsc-* ]] || continue
    tr '\0' '\n' 2>/dev/null < "$f" | grep -q -- "^--root=$base/" || continue
    p=${f#/proc/}; p=${p%/cmdline}
    kill -KILL "$p" 2>/dev/null || true
  done
  awk -v b="$base/" 'index($2, b) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$base"
}

case $cmd in
  up) up ;;
  smoke) smoke ;;
  down) down ;;
  run) trap down EXIT; up >/dev/null; smoke ;;
  *) die "unknown command $cmd (up, smoke, down, run)" ;;
esac
