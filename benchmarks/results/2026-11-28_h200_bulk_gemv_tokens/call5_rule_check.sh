#!/usr/bin/env bash
# Session 76, call 5 (H200): the per-K rule (BULK_LAYER_MAX_M = {4: 8}) on the bulk_m8 library. One token unchanged?
# kbit2 at b4 on / off it; the target command at batch 4.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/bulk_m8.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
row() {  # tag, seconds, e2e_gpu.py args
  local tag=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/e2e_gpu.py "$@" --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1
  echo "$tag exit $? at $(( $(date +%s) - start )) s"; grep -E "^===|tok/s|Error" "$OUT/$tag.log"
}
row b1 90 --model llama-3-8b --batch 1 --variants kbit4+fuse,kbit3+fuse
row b4_k2 90 --model llama-3-8b --batch 4 --variants kbit2+fuse,kbit2+fuse@bulk-m8
timeout $(( 330 - ($(date +%s) - start) )) python3 -m lowbit generate --model random:llama-3-8b --compile --compare --batch 4 \
  > "$OUT/generate_b4.log" 2>&1
echo "generate exit $? at $(( $(date +%s) - start )) s"; tail -12 "$OUT/generate_b4.log"
