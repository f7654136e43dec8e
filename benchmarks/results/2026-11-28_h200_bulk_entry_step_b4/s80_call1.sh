#!/usr/bin/env bash
# First call of the next session (carry .variants/s79c.so.xz = liblowbit-2839bbd4a0c9abe3, the library of the tree at
# the end of 2026-11-28_bulk_tail_and_h200_recheck.md, and this file): the headline with bf16 beside it at b1 and b4
# on this GPU (that entry ran library A/B rows only), then the layer probe's attention phases on it (the largest
# excess on an H200's critical path: 6.5 us for 0.5 us of bytes at b1).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s79c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
for B in 1 4; do
  timeout 200 python3 -m lowbit generate --model random:llama-3-8b --compile --compare --batch $B > "$OUT/generate_b$B.log" 2>&1
  echo "generate b$B exit $? at $(el) s"; grep -E "tok/s|x bf16" "$OUT/generate_b$B.log" | tail -4
done
nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -Ibenchmarks/tools -DLOWBIT_ATTN_STAMPS -o /tmp/layer_probe benchmarks/tools/layer_probe.cu \
  && timeout 120 /tmp/layer_probe 8 20 590 > "$OUT/probe_590.txt" 2>&1; echo "probe exit $? at $(el) s"; tail -30 "$OUT/probe_590.txt"
