#!/usr/bin/env bash
# Build an experimental runsc: the pinned gVisor with the background page
# loader's parallelism (pkg/sentry/state/stateio/pagesfile.go
# pagesFileFDDefaultMaxParallel, 128 at the pin) set to READERS and, when
# given, its read size (pagesFileFDDefaultMaxIOBytes, 256 KiB at the pin) to
# READ_KIB, stamped with the same version label as build/runsc so that it
# restores the same images. For the loader experiments (docs/gpu.md, "Where the
# restore time goes", "Restore speed levers"); thaw's own runsc carries the
# setting these measured best (ci/build-go.sh RESTORE_READERS).
#   bash bench/gpu/build-runsc-variant.sh 128        -> build/runsc-readers128 (the stock loader)
#   bash bench/gpu/build-runsc-variant.sh 12 4096    -> build/runsc-readers12x4096k (upstream PR #14568's)
#   bash bench/gpu/build-runsc-variant.sh prefault   -> build/runsc-prefault: thaw's runsc (its loader,
#        populate and restoring patches, ci/build-go.sh's values) plus bench/gpu/patch-runsc-prefault.py
#   bash bench/gpu/build-runsc-variant.sh fdtrace    -> build/runsc-fdtrace: thaw's runsc plus
#        bench/gpu/patch-runsc-fdtrace.py (the EBADF hunt: nvproxy's host FD closes traced)
#   bash bench/gpu/build-runsc-variant.sh nouvmhold  -> build/runsc-nouvmhold: thaw's runsc without
#        ci/patch-runsc-uvmclose.py (the EBADF's baseline, side by side with thaw's runsc)
#   bash bench/gpu/build-runsc-variant.sh osdescalign -> build/runsc-osdescalign: thaw's runsc plus
#        bench/gpu/patch-runsc-osdescalign.py (nvproxy's mirror of page-locked memory placed 2 MiB-congruent:
#        issue 32 item 6, the parked-cooperative wake)
#   bash bench/gpu/build-runsc-variant.sh prefault-all -> build/cpu/runsc-prefault-all: every process, a CPU
#        check only (outside build/runsc-*, so `make carry` leaves it: three builds would pass the 64 MiB cap)
set -euo pipefail
readers=${1:?usage: build-runsc-variant.sh READERS [READ_KIB] | prefault | prefault-all | fdtrace | nouvmhold | osdescalign}
read_kib=${2:-}
name="runsc-readers$readers${read_kib:+x${read_kib}k}"
# Variants that are thaw's runsc plus (or minus) one patch, named runsc-VARIANT; the rest are loader settings.
case "$readers" in prefault*|fdtrace|nouvmhold|osdescalign) patched=1 ;; *) patched= ;; esac
[[ -n "$patched" ]] && name=runsc-$readers
here=$(cd "$(dirname "$0")/../.." && pwd)
out="$here/build"
[[ "$readers" == prefault-all ]] && out="$here/build/cpu"
mkdir -p "$out"
cd "$here/go"
gvisor_version=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
label="thaw-gvisor-${gvisor_version##*-}"     # twin: ci/build-go.sh, control/config.py RUNSC_VERSION_LABEL
mod=$(mktemp -d "$out/.runsc-variant.XXXXXX")
trap 'rm -rf "$mod"' EXIT
src=$(go mod download -json "gvisor.dev/gvisor@$gvisor_version" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
cp -r "$src" "$mod/gvisor" && chmod -R u+w "$mod/gvisor"
f="$mod/gvisor/pkg/sentry/state/stateio/pagesfile.go"
if [[ -n "$patched" ]]; then
  loader_args=()
  for v in RESTORE_HUGE_READERS RESTORE_HUGE_READ_KIB RESTORE_SMALL_READERS; do
    loader_args+=("$(sed -n "s/^$v=\([0-9]*\).*/\1/p" "$here/ci/build-go.sh")")
  done
  python3 "$here/ci/patch-runsc-loader.py" "$mod/gvisor" "${loader_args[@]}"
  python3 "$here/ci/patch-runsc-populate.py" "$mod/gvisor"
  python3 "$here/ci/patch-runsc-restoring.py" "$mod/gvisor"
  [[ "$readers" == nouvmhold ]] || python3 "$here/ci/patch-runsc-uvmclose.py" "$mod/gvisor"
  case "$readers" in
    nouvmhold) ;;
    prefault-all) python3 "$here/bench/gpu/patch-runsc-prefault.py" "$mod/gvisor" --all ;;
    prefault) python3 "$here/bench/gpu/patch-runsc-prefault.py" "$mod/gvisor" ;;
    fdtrace) python3 "$here/bench/gpu/patch-runsc-fdtrace.py" "$mod/gvisor" ;;
    osdescalign) python3 "$here/bench/gpu/patch-runsc-osdescalign.py" "$mod/gvisor" ;;
    *) echo "unknown variant $readers" >&2; exit 2 ;;
  esac
else
grep -q 'pagesFileFDDefaultMaxParallel = 128' "$f" || { echo "pagesfile.go changed upstream: $f" >&2; exit 1; }
sed -i "s/pagesFileFDDefaultMaxParallel = 128/pagesFileFDDefaultMaxParallel = $readers/" "$f"
if [[ -n "$read_kib" ]]; then
  grep -q 'pagesFileFDDefaultMaxIOBytes  = 256 << 10' "$f" || { echo "pagesfile.go changed upstream: $f" >&2; exit 1; }
  sed -i "s/pagesFileFDDefaultMaxIOBytes  = 256 << 10/pagesFileFDDefaultMaxIOBytes  = $read_kib << 10/" "$f"
fi
fi
go_version=$(awk '$1 == "go" {print $2; exit}' "$mod/gvisor/go.mod")
mkdir -p "$mod/m"
cat > "$mod/m/go.mod" <<MOD
module thaw.dev/runscvariant

go $go_version

require gvisor.dev/gvisor $gvisor_version

replace gvisor.dev/gvisor => ../gvisor
MOD
printf 'package runscvariant\n\nimport _ "gvisor.dev/gvisor/runsc"\n' > "$mod/m/tools.go"
cd "$mod/m"
go mod tidy >/dev/null 2>&1
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$label" \
  -o "$out/$name" gvisor.dev/gvisor/runsc
if [[ -n "$patched" ]]; then
  echo "built $out/$name ($("$out/$name" --version | head -1), thaw's runsc + $readers)"
else
  echo "built $out/$name ($("$out/$name" --version | head -1), $readers background readers of ${read_kib:-256} KiB)"
fi
