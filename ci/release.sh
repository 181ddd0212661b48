#!/usr/bin/env bash
# `make release`: dist/thaw-<version>/, what a node installs from with no
# compiler, no checkout and no network (deploy/install.sh, docs/install.md):
#
#   install.sh, VERSION, LICENSE, INSTALL.md
#   wheels/                    the runsc-thaw wheel and wheels of its dependencies
#                              (CPython 3.11-3.13, manylinux x86_64): pip --no-index
#   thaw-node-<v>-linux-amd64.tar.gz
#                              bin/: what `thaw provision` installs (control/node/provision.py
#                              BINARIES), containerd and ctr, and bin/SHA256SUMS
#   thaw-daemonset-<v>.oci.tar the DaemonSet image (ci/build-image.sh), `ctr images import`
#   kubernetes/                the manifests (deploy/kubernetes), naming that image
#   thaw-chart-<v>.tgz         the Helm chart, once deploy/helm/thaw exists (issue 29)
#   SHA256SUMS                 of every file above
#
# <v> is control/version.py VERSION, the one version source. The directory is
# written as dist/.thaw-<v>.partial-*/ and renamed into place last.
#   ci/release.sh [--out DIR] [--no-image]
# --no-image leaves the image out (the install test: it installs a node, the
# image has its own test). Needs `make setup` first (the binaries in
# $THAW_BUILD_DIR, the virtualenv's pip); the dependency wheels are downloaded
# once into $THAW_BUILD_DIR/release/wheels (the one step that needs PyPI).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${THAW_BUILD_DIR:-"$here/build"}
py=${THAW_PYTHON:-"$here/.venv/bin/python"}
out_root=$here/dist
image=1
while (($#)); do
  case $1 in
    --out) out_root=${2:?--out DIR}; shift 2 ;;
    --no-image) image=0; shift ;;
    *) echo "release: unknown option $1" >&2; exit 2 ;;
  esac
done
cd "$here"
version=$(python3 control/version.py)
name=thaw-$version
# Python versions the dependency wheels are for (requires-python >= 3.11).
pythons=(3.11 3.12 3.13)
# What a node runs: provision's BINARIES, plus containerd and ctr for a node
# that has no containerd (install.sh --with-containerd).
read -r -a binaries <<< "$("$py" -c 'from control.node.provision import BINARIES; print(" ".join(n for n, _ in BINARIES))')"
binaries+=(containerd ctr)
for b in "${binaries[@]}"; do
  [[ -x $build/$b ]] || { echo "release: $build/$b is not built: run \`make setup\`" >&2; exit 1; }
done
# thaw's Go commands carry the version they were built as (go/internal/version).
stamped=$("$build/thaw-chunk" -version)
[[ $stamped == "$version" ]] || { echo "release: $build holds thaw $stamped's Go commands, not $version's: run \`make setup\`" >&2; exit 1; }

mkdir -p "$out_root"
partial=$(mktemp -d "$out_root/.$name.partial-XXXXXX")
trap 'rm -rf "$partial"' EXIT
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
copy() { ln -f "$1" "$2" 2>/dev/null || cp -p "$1" "$2"; }   # a hard link when on one file system

# 1. the wheel, from a copy of the sources (setuptools would build in ./build,
#    which is the binaries' directory here).
src=$partial/.src
mkdir -p "$src" "$partial/wheels"
{ echo pyproject.toml; echo README.md; echo LICENSE
  find control runsc_hooks nvproxy -name __pycache__ -prune -o -type f -print; } | tar -cf - --files-from=- | tar -C "$src" -xf -
"$py" -m pip wheel --quiet --no-deps --no-build-isolation --disable-pip-version-check -w "$partial/wheels" "$src" \
  > "$partial/pip-wheel.log" 2>&1 || { cat "$partial/pip-wheel.log" >&2; exit 1; }
wheel=$(ls "$partial"/wheels/runsc_thaw-"$version"-*.whl)
if python3 -c 'import sys, zipfile; sys.exit(not any(n.startswith("control/dev/") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel"; then
  echo "release: $wheel holds control/dev (the dev harness stays out of a node install)" >&2; exit 1
fi

# 2. the dependencies' wheels, for every Python of `pythons` (cached: PyPI once).
deps=$("$py" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' pyproject.toml)
cache=$build/release/wheels
stamp=$( (echo "$deps" "${pythons[@]}") | sha256sum | cut -c1-16)
if [[ "$(cat "$cache/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$cache" && mkdir -p "$cache"
  for v in "${pythons[@]}"; do
    platforms=(--platform linux_x86_64 --platform manylinux2014_x86_64)
    for m in $(seq 17 36); do platforms+=(--platform "manylinux_2_${m}_x86_64"); done
    echo "release: dependency wheels for CPython $v (pip download)"
    # shellcheck disable=SC2086 # one requirement per word
    "$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --dest "$cache" \
      --python-version "$v" --implementation cp --abi "cp${v/./}" --abi abi3 --abi none "${platforms[@]}" $deps
  done
  echo "$stamp" > "$cache/.stamp"
fi
for f in "$cache"/*.whl; do copy "$f" "$partial/wheels/"; done

# 3. the node's binaries, with their own SHA256SUMS.
node=$partial/.node/bin
mkdir -p "$node"
for b in "${binaries[@]}"; do copy "$build/$b" "$node/$b"; done
(cd "$node" && sha256sum "${binaries[@]}" > SHA256SUMS)
tar -C "$partial/.node" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -cf - bin \
  | gzip -n > "$partial/thaw-node-$version-linux-amd64.tar.gz"

# 4. the DaemonSet image, named ghcr.io/thaw-dev/thaw:<version> by the build.
if ((image)); then
  bash ci/build-image.sh
  copy "$build/thaw-daemonset.oci.tar" "$partial/thaw-daemonset-$version.oci.tar"
fi

# 5. the manifests, which name the image of this version (tests/unit/test_version.py).
ref=$("$py" -c 'from control.version import image_ref; print(image_ref())')
cp -r deploy/kubernetes "$partial/kubernetes"
if grep -rhoE 'ghcr\.io/thaw-dev/thaw:[^ "]+' "$partial/kubernetes" | grep -vxF "$ref"; then
  echo "release: deploy/kubernetes names an image other than $ref" >&2; exit 1
fi

# 6. the Helm chart: deploy/helm/thaw once [cluster] (issue 29) adds it. A chart
#    archive is the gzipped tar of the chart's directory (what `helm package`
#    writes); its version and appVersion must be this one.
if [[ -f deploy/helm/thaw/Chart.yaml ]]; then
  for k in version appVersion; do
    grep -qE "^$k: \"?$version\"?\$" deploy/helm/thaw/Chart.yaml \
      || { echo "release: deploy/helm/thaw/Chart.yaml $k is not $version" >&2; exit 1; }
  done
  tar -C deploy/helm --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -cf - thaw \
    | gzip -n > "$partial/thaw-chart-$version.tgz"
else
  echo "release: no Helm chart yet (deploy/helm/thaw: issue 29)"
fi

# 7. the installer and what it reads.
install -m 0755 deploy/install.sh "$partial/install.sh"
cp LICENSE "$partial/"
cp docs/install.md "$partial/INSTALL.md"
echo "$version" > "$partial/VERSION"
rm -rf "$src" "$partial/.node" "$partial/pip-wheel.log"
(cd "$partial" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs -d '\n' sha256sum > SHA256SUMS)

chmod 0755 "$partial"
if [[ -e $out_root/$name ]]; then
  mv "$out_root/$name" "$partial.old"
  trap 'rm -rf "$partial" "$partial.old"' EXIT
fi
mv "$partial" "$out_root/$name"
echo "release: $out_root/$name ($(du -sm "$out_root/$name" | cut -f1) MB: $(cd "$out_root/$name" && ls | tr '\n' ' '))"
