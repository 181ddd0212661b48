#!/usr/bin/env bash
# Installs thaw on this node from the release directory this script is in
# (dist/thaw-<version>/, made by `make release`): no compiler, no checkout, no
# network. Needs bash, coreutils, tar, gzip and python3 >= 3.11 with venv (Debian:
# python3-venv). As root:
#
#   ./install.sh [--prefix DIR] [--python PYTHON] [--link-dir DIR] [--with-containerd]
#                [--no-provision] [--restart-containerd] [--no-systemd]
#   ./install.sh --uninstall [--prefix DIR] [--link-dir DIR] [--restart-containerd] [--purge] [--force]
#
# Install (again, or an upgrade: the same steps):
#   1. checks SHA256SUMS, then the binaries' own bin/SHA256SUMS once unpacked;
#   2. <prefix>/releases/<version>/ (<version>.2, ... when that exists): bin/ from
#      the tarball, venv/ from wheels/ (pip --no-index), and last the marker
#      venv/thaw-release.json that tells thaw where it is installed
#      (control/config.py INSTALL: its binaries' defaults are <prefix>/bin/...);
#   3. <prefix>/current -> that release (swapped atomically), <link-dir>/thaw ->
#      <prefix>/current/venv/bin/thaw;
#   4. `thaw provision --from <release>/bin` (docs/provision.md): the binaries
#      into <prefix>/bin, /etc/thaw, containerd's drop-in, the thawd unit at this
#      release's thaw, which provision restarts when it changed;
#   5. keeps the release it replaced (to go back: point `current` at it and run
#      its `thaw provision`), removes older ones.
# --with-containerd also installs the release's containerd and ctr into
# /usr/local/bin when the node has no containerd (no systemd unit for it).
#
# Uninstall: `thaw uninstall` (the unit, the binaries, containerd's drop-in, and
# containerd's main config as it was before provision), then the releases, the
# `current` link and the `thaw` link. --purge also removes /etc/thaw/config.toml,
# the cache, state and logs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RELEASE_MARKER=thaw-release.json   # twin: control/config.py RELEASE_MARKER
DISTRIBUTION=runsc-thaw            # twin: control/version.py DISTRIBUTION

prefix=/opt/thaw
python=python3
link_dir=/usr/local/bin
uninstall=0 provision=1 with_containerd=0 purge=0 force=0
provision_args=() uninstall_args=()
die() { echo "install: $*" >&2; exit 1; }
while (($#)); do
  case $1 in
    --prefix) prefix=${2:?--prefix DIR}; shift 2 ;;
    --python) python=${2:?--python PYTHON}; shift 2 ;;
    --link-dir) link_dir=${2?--link-dir DIR (empty: no link)}; shift 2 ;;
    --with-containerd) with_containerd=1; shift ;;
    --no-provision) provision=0; shift ;;
    --restart-containerd) provision_args+=(--restart-containerd); uninstall_args+=(--restart-containerd); shift ;;
    --no-systemd) provision_args+=(--no-systemd); shift ;;
    --uninstall) uninstall=1; shift ;;
    --purge) uninstall_args+=(--purge); shift ;;
    --force) uninstall_args+=(--force); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ $(id -u) -eq 0 ]] || die "run as root (thaw installs into $prefix, /etc and containerd's config)"
[[ $prefix == /* ]] || die "--prefix $prefix: give an absolute path"

if ((uninstall)); then
  thaw=$prefix/current/venv/bin/thaw
  [[ -x $thaw ]] || die "no thaw installed in $prefix ($thaw is missing)"
  "$thaw" uninstall "${uninstall_args[@]}"
  if [[ -n $link_dir && -L $link_dir/thaw && $(readlink "$link_dir/thaw") == "$prefix/current/venv/bin/thaw" ]]; then
    rm -f "$link_dir/thaw"
  fi
  rm -rf "$prefix/releases" "$prefix/current"
  rmdir "$prefix" 2>/dev/null || true
  echo "install: thaw uninstalled from $prefix"
  exit 0
fi

[[ $(uname -m) == x86_64 ]] || die "this release is for x86_64; this node is $(uname -m)"
version=$(cat "$here/VERSION")
(cd "$here" && sha256sum --check --quiet --strict SHA256SUMS) || die "$here: SHA256SUMS does not match (a damaged copy?)"
"$python" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || die "$python: thaw needs Python >= 3.11 with the venv module (Debian: apt-get install python3-venv)"

mkdir -p "$prefix/releases"
name=$version n=1
while [[ -e $prefix/releases/$name ]]; do n=$((n + 1)); name=$version.$n; done
rel=$prefix/releases/$name
# A release without its marker is not complete: removed if anything fails.
trap '[[ -f $rel/venv/$RELEASE_MARKER ]] || rm -rf "$rel"' EXIT
mkdir -p "$rel"
tar -xzf "$here"/thaw-node-"$version"-linux-amd64.tar.gz -C "$rel"
(cd "$rel/bin" && sha256sum --check --quiet --strict SHA256SUMS) || die "$rel/bin: the binaries do not match their SHA256SUMS"
# The virtualenv is made where it stays: its scripts name their interpreter by path.
"$python" -m venv "$rel/venv"
"$rel/venv/bin/python" -m pip install --quiet --no-index --no-cache-dir --disable-pip-version-check \
  --find-links "$here/wheels" "$DISTRIBUTION==$version"
"$rel/venv/bin/python" -m compileall -q "$rel/venv/lib" >/dev/null || true
printf '{"prefix": "%s", "version": "%s"}\n' "$prefix" "$version" > "$rel/venv/$RELEASE_MARKER.partial"
mv -f "$rel/venv/$RELEASE_MARKER.partial" "$rel/venv/$RELEASE_MARKER"

previous=$(readlink "$prefix/current" 2>/dev/null || true)
ln -sfn "releases/$name" "$prefix/.current.partial"
mv -Tf "$prefix/.current.partial" "$prefix/current"
if [[ -n $link_dir ]]; then
  mkdir -p "$link_dir"
  ln -sfn "$prefix/current/venv/bin/thaw" "$link_dir/.thaw.partial"
  mv -Tf "$link_dir/.thaw.partial" "$link_dir/thaw"
fi
if ((with_containerd)); then
  if command -v containerd >/dev/null; then
    echo "install: containerd is on this node already ($(command -v containerd)): left as it is"
  else
    install -m 0755 "$rel/bin/containerd" "$rel/bin/ctr" /usr/local/bin/
    echo "install: containerd and ctr -> /usr/local/bin (start it with your init system: no unit is written)"
  fi
fi
echo "install: thaw $version -> $rel (current)"

if ((provision)); then
  "$prefix/current/venv/bin/thaw" provision --from "$rel/bin" "${provision_args[@]}"
fi

# Keep this release and the one it replaced.
for d in "$prefix"/releases/*; do
  base=releases/${d##*/}
  [[ $base == "releases/$name" || $base == "$previous" ]] || rm -rf "$d"
done
