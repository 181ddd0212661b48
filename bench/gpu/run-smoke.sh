#!/usr/bin/env bash
# Device-machine entry point of the GPU smoke (bench/gpu/smoke.py).
# Expects .carry/ from `make carry` (runsc.xz and the CUDA checkpoint helper).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p /tmp/thaw-bin "$out"
python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(".carry/runsc.xz"), open("/tmp/thaw-bin/runsc","wb"))'
chmod 755 /tmp/thaw-bin/runsc
cp .carry/thaw-cuda-checkpoint /tmp/thaw-bin/ && chmod 755 /tmp/thaw-bin/thaw-cuda-checkpoint
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
/tmp/thaw-bin/runsc --version | head -1
PYTHONUNBUFFERED=1 python3 bench/gpu/smoke.py --runsc /tmp/thaw-bin/runsc \
  --helper /tmp/thaw-bin/thaw-cuda-checkpoint --out "$out/smoke" 2>&1 | tee "$out/smoke.log"
rc=${PIPESTATUS[0]}
cp "$out/smoke/smoke.json" "$out/" 2>/dev/null
tar -C "$out/smoke" -cJf "$out/runsc-logs.tar.xz" runsc-logs 2>/dev/null
rm -rf "$out/smoke"
exit $rc
