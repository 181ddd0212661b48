#!/usr/bin/env bash
# Stages what bench/gpu/node.sh needs on the GPU machine into .carry-node/a,
# .carry-node/b, ... (git-ignored; one directory per part bench/gpu/node-parts.txt
# names), split as that list says, and prints every size: one device call carries
# at most 64 MiB, the tree included, and the binaries and wheels together do not
# fit in one (bench/gpu/README.md "GPU node").
#   binaries: xz -9e (python3's lzma unpacks them there), SHA256SUMS of the originals;
#   wheels:   the virtualenv's versions, for CPython 3.12 x86-64 (the GPU machine's);
#   rpc.tar:  thaw's generated gRPC code (git-ignored, so the tree lacks it), in every part.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${THAW_BUILD_DIR:-build}
py=.venv/bin/python
limit=$((64 * 1024 * 1024))
weed=$("$py" -c 'from control.dev.seaweed import weed_binary; print(weed_binary())')
parts=bench/gpu/node-parts.txt
# The parts, as the list names them (a, b, c, ...): one device call each.
part_names=$(awk '$1 !~ /^#/ && NF >= 3 {print $1}' "$parts" | sort -u | tr '\n' ' ')

src_of() { if [[ $1 == weed ]]; then echo "$weed"; else echo "$build/$1"; fi; }

declare -A keep
for part in $part_names; do
  mkdir -p ".carry-node/$part/wheels"
  : > ".carry-node/$part/SHA256SUMS.new"
  keep[".carry-node/$part/SHA256SUMS"]=1
  keep[".carry-node/$part/rpc.tar"]=1
done
while read -r part kind name; do
  [[ -z "$part" || "$part" == \#* ]] && continue
  dir=.carry-node/$part
  case $kind in
    bin)
      src=$(src_of "$name")
      [[ -f "$src" ]] || { echo "carry-node: $src is missing (make setup)" >&2; exit 1; }
      mkdir -p "$(dirname "$dir/$name")"   # cni-bin/ptp: a directory of the part
      if [[ ! -f "$dir/$name.xz" || "$src" -nt "$dir/$name.xz" ]]; then
        xz -T2 -9e -c "$src" > "$dir/$name.xz.tmp" && mv "$dir/$name.xz.tmp" "$dir/$name.xz"
      fi
      echo "$(sha256sum "$src" | cut -d' ' -f1) $name" >> "$dir/SHA256SUMS.new"
      keep["$dir/$name.xz"]=1
      ;;
    wheel)
      version=$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
      stem=$(echo "$name" | tr '-' '_')
      have=$(compgen -G "$dir/wheels/${stem}-${version}-*.whl" || true)
      if [[ -z "$have" ]]; then
        rm -f "$dir/wheels/${stem}"-*.whl
        "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
          --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir/wheels" "$name==$version"
        have=$(compgen -G "$dir/wheels/${stem}-${version}-*.whl")
      fi
      keep["$have"]=1
      ;;
    *) echo "carry-node: $parts: unknown kind $kind" >&2; exit 1 ;;
  esac
done < "$parts"
for part in $part_names; do
  mv ".carry-node/$part/SHA256SUMS.new" ".carry-node/$part/SHA256SUMS"
  tar -C control/thawd/rpc -cf ".carry-node/$part/rpc.tar" --exclude=__pycache__ .
done
# Anything a former split left behind would travel too.
while IFS= read -r -d '' f; do
  [[ -n "${keep[$f]:-}" ]] || { echo "carry-node: removing stale $f"; rm -f "$f"; }
done < <(find .carry-node -type f -print0)

tree=$( (git ls-files -z; git ls-files -z -o --exclude-standard) | xargs -0 stat -c %s 2>/dev/null \
        | awk '{s+=$1} END {print s+0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
status=0
for part in $part_names; do
  echo "part $part (carry \".carry-node/$part\"):"
  total=0
  while IFS= read -r f; do
    size=$(stat -c %s "$f")
    total=$((total + size))
    printf '  %-60s %10d  %s\n' "${f#.carry-node/$part/}" "$size" "$(mib "$size")"
  done < <(find ".carry-node/$part" -type f | sort)
  all=$((total + tree))
  echo "  part $(mib "$total") + tree $(mib "$tree") = $(mib "$all") of 64 MiB"
  if (( all > limit )); then
    echo "carry-node: part $part and the tree exceed the 64 MiB a device call carries" >&2
    status=1
  fi
done
exit $status
