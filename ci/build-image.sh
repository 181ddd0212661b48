#!/usr/bin/env bash
# Builds the DaemonSet's image (deploy/Containerfile's contents) without a
# container daemon or registry: an OCI image archive at
# $THAW_BUILD_DIR/thaw-daemonset.oci.tar, named ghcr.io/thaw-dev/thaw:<version>
# (control/version.py),
# that `ctr images import` reads (it carries docker's manifest.json too). Four layers:
#   1. Debian <suite> minbase + python3 + ca-certificates (mmdebstrap; util-linux,
#      essential in Debian, brings nsenter for --restart-containerd)
#   2. thaw's Python dependencies (pyproject.toml's, no extras: not the demo's
#      SeaweedFS), wheels for the image's CPython, in /usr/local/lib/python3.X/dist-packages
#   3. thaw itself (the Containerfile's COPY + pip install .; without
#      control/dev, which the wheel leaves out), /usr/local/bin/thaw
#   4. the binaries `thaw provision --from /opt/thaw-dist/bin` installs
# Layers 1 and 2 are cached under build/image by a stamp of their inputs
# (first build: Debian packages and wheels are downloaded); the image is
# rebuilt only when a layer's inputs changed. tests/integration/
# test_daemonset_image.py checks the result against provision.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${THAW_BUILD_DIR:-"$here/build"}
work=$build/image
out=$build/thaw-daemonset.oci.tar
mkdir -p "$work"

# The python:3.11-slim-bookworm base of deploy/Containerfile, from Debian's
# archive (the only base reachable here). The Python version is the suite's.
suite=bookworm
py=3.11
mirrors=("deb http://deb.debian.org/debian $suite main"
         "deb http://deb.debian.org/debian $suite-updates main"
         "deb http://deb.debian.org/debian-security $suite-security main")
# Docs, man pages and translations left out, as Debian's slim images do.
dpkgopts=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
          --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
          --dpkgopt='path-exclude=/usr/share/info/*')
# What provision installs from the image (control/node/provision.py BINARIES, in
# its order; tests/unit/test_deploy_files.py keeps the lists equal).
binaries=(runsc containerd-shim-runsc-v1 thaw-runsc thaw-runsc-hooks thaw-cuda-checkpoint thaw-chunk thaw-fetch thaw-gofer thaw-ctrinfo thaw-monitor thaw-relay)
version=$(python3 "$here/control/version.py")   # the one version source
ref=$(cd "$here" && python3 -c 'from control.version import image_ref; print(image_ref())')
pip=("$here/.venv/bin/python" -m pip)

for b in "${binaries[@]}" thaw-image; do
  [[ -x $build/$b ]] || { echo "build-image: $build/$b is not built: run \`make setup\`" >&2; exit 1; }
done
command -v mmdebstrap >/dev/null || { echo "build-image: mmdebstrap missing (ci/setup.sh installs it)" >&2; exit 1; }

stamp_of() { sha256sum | cut -c1-16; }

# 1. base rootfs tar
build_base() {
  # A fixed SOURCE_DATE_EPOCH: mmdebstrap then writes the same tar for the
  # same packages (its reproducibility mode).
  SOURCE_DATE_EPOCH=1700000000 mmdebstrap --quiet --variant=minbase --include=python3,ca-certificates \
    --skip=output/dev "${dpkgopts[@]}" --format=tar "$suite" "$work/base.tar.partial" "${mirrors[@]}"
  mv -f "$work/base.tar.partial" "$work/base.tar"
}
base_stamp=$( (echo "$suite" "${mirrors[@]}" "${dpkgopts[@]}"; mmdebstrap --version; declare -f build_base) | stamp_of)
if [[ ! -f $work/base.tar || "$(cat "$work/base.stamp" 2>/dev/null)" != "$base_stamp" ]]; then
  echo "build-image: layer 1: Debian $suite minbase + python3 (mmdebstrap)"
  rm -f "$work/base.stamp"
  build_base
  echo "$base_stamp" > "$work/base.stamp"
fi

# Scripts pip --target writes name the interpreter that ran pip: point them
# at the image's, and link them from /usr/local/bin (their RECORD entries
# stay true: the files stay where pip put them).
fix_scripts() { # TARGET_DIR
  local f
  [[ -d $1/bin ]] || return 0
  for f in "$1"/bin/*; do
    if head -c 2 "$f" | grep -q '^#!' && head -1 "$f" | grep -q python; then
      sed -i "1s|.*|#!/usr/bin/python3|" "$f"
    fi
  done
}

# CPython $py wheels for x86_64 glibc 2.36 (bookworm), whatever Python runs pip.
pip_platform=(--python-version "$py" --implementation cp --abi "cp${py/./}" --only-binary=:all:
              --platform linux_x86_64 --platform manylinux2014_x86_64)
for v in $(seq 17 36); do pip_platform+=(--platform "manylinux_2_${v}_x86_64"); done

# 2. Python dependencies
deps=$(python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
  "$here/pyproject.toml")
build_deps() {
  rm -rf "$work/deps.partial"
  # shellcheck disable=SC2086 # one requirement per word
  "${pip[@]}" install -q --no-compile --disable-pip-version-check --target "$work/deps.partial" \
    "${pip_platform[@]}" $deps
  fix_scripts "$work/deps.partial"
  rm -rf "$work/deps" && mv "$work/deps.partial" "$work/deps"
}
deps_stamp=$( (echo "$deps" "${pip_platform[@]}"; declare -f build_deps fix_scripts) | stamp_of)
if [[ ! -d $work/deps || "$(cat "$work/deps.stamp" 2>/dev/null)" != "$deps_stamp" ]]; then
  echo "build-image: layer 2: Python dependencies (pip, CPython $py wheels)"
  rm -f "$work/deps.stamp"
  build_deps
  echo "$deps_stamp" > "$work/deps.stamp"
fi

# 3. thaw, installed from a copy of what the Containerfile copies (pip would
# otherwise build in ./build, which is the build directory here); redone
# only when one of those files changed.
thaw_files() {
  (cd "$here" && { echo pyproject.toml; echo README.md; echo LICENSE
    find control runsc_hooks nvproxy -name __pycache__ -prune -o -type f -print; } | LC_ALL=C sort)
}
thaw_stamp=$( (cd "$here" && thaw_files | xargs -d '\n' sha256sum) | stamp_of)
if [[ ! -d $work/thaw || "$(cat "$work/thaw.stamp" 2>/dev/null)" != "$thaw_stamp" ]]; then
  rm -rf "$work/src" "$work/thaw" "$work/thaw.stamp"
  mkdir -p "$work/src"
  (cd "$here" && thaw_files | tar -cf - --files-from=- | tar -C "$work/src" -xf -)
  # Pure Python: no platform flags needed. setuptools' deprecation chatter
  # goes to a log, shown when pip fails.
  if ! "${pip[@]}" install -q --no-compile --no-deps --disable-pip-version-check --target "$work/thaw" \
      "$work/src" > "$work/pip-thaw.log" 2>&1; then
    cat "$work/pip-thaw.log" >&2
    exit 1
  fi
  fix_scripts "$work/thaw"
  rm -rf "$work/src"
  echo "$thaw_stamp" > "$work/thaw.stamp"
fi

# 4. the image
links() { # TARGET_DIR: /usr/local/bin entries for its scripts
  local f
  [[ -d $1/bin ]] || return 0
  for f in "$1"/bin/*; do
    printf '{"path": "/usr/local/bin/%s", "link": "../lib/python%s/dist-packages/bin/%s"},\n' \
      "${f##*/}" "$py" "${f##*/}"
  done
}
sitepkg=/usr/local/lib/python$py/dist-packages
# Entries' mtimes and the config's "created": SOURCE_DATE_EPOCH, else 0 (as
# ko does), so the digest changes only when the contents do.
epoch=${SOURCE_DATE_EPOCH:-0}
spec=$work/spec.json
{
  cat <<EOF
{"ref": "$ref", "epoch": $epoch,
 "config": {"Cmd": ["thaw", "serve"],
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
            "WorkingDir": "/",
            "Labels": {"org.opencontainers.image.title": "thaw", "org.opencontainers.image.version": "$version"}},
 "layers": [
  {"comment": "Debian $suite minbase, python3, ca-certificates (mmdebstrap)", "tar": "$work/base.tar"},
  {"comment": "thaw's Python dependencies", "entries": [
    $(links "$work/deps")
    {"path": "$sitepkg", "src": "$work/deps"}]},
  {"comment": "thaw $version", "entries": [
    $(links "$work/thaw")
    {"path": "$sitepkg", "src": "$work/thaw"}]},
  {"comment": "binaries for thaw provision --from /opt/thaw-dist/bin", "entries": [
EOF
  sep=""
  for b in "${binaries[@]}"; do
    printf '%s    {"path": "/opt/thaw-dist/bin/%s", "src": "%s", "mode": "0755"}' "$sep" "$b" "$build/$b"
    sep=$',\n'
  done
  printf '\n  ]}\n]}\n'
} > "$spec"

# Rebuild only when an input changed: the spec, the cached layers' stamps,
# every binary of layer 4, and the image writer itself.
image_stamp=$( (cat "$spec" "$work/base.stamp" "$work/deps.stamp" "$work/thaw.stamp"
  for b in "${binaries[@]}" thaw-image; do sha256sum "$build/$b"; done) | stamp_of)
if [[ -f $out && "$(cat "$work/image.stamp" 2>/dev/null)" == "$image_stamp" ]]; then
  echo "build-image: $out is up to date ($ref)"
  exit 0
fi
rm -f "$work/image.stamp"
"$build/thaw-image" -spec "$spec" -o "$out" > "$work/image.json"
echo "$image_stamp" > "$work/image.stamp"
echo "build-image: $ref -> $out ($(du -m "$out" | cut -f1) MB, manifest $(sed -n 's/.*"manifest": "\(.*\)".*/\1/p' "$work/image.json"))"
