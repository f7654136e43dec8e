#!/usr/bin/env bash
# the whole GPU suite on the final library, then Qwen3-30B-A3B (16 layers) at batch 16 with each attention kernel
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
xz -dc .variants/mma.so.xz > /tmp/liblowbit.so && export LOWBIT_LIBRARY=/tmp/liblowbit.so
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
timeout 330 python3 -m pytest -m gpu tests -n 12 -q -p no:cacheprovider --durations=15 > "$OUT/gpu_suite.log" 2>&1
echo "suite exit $?"; grep -E "passed|failed" "$OUT/gpu_suite.log" | tail -2; grep -E "^FAILED|^ERROR" "$OUT/gpu_suite.log" | head -20
timeout 150 python3 benchmarks/e2e_gpu.py --model qwen3-30b-a3b --layers 16 --batch 16 \
  --variants kbit4+fuse,kbit4+fuse@simt-attention,kbit4+fuse --out "$OUT/e2e_qwen3_b16.json" > "$OUT/e2e_qwen3_b16.log" 2>&1
echo "qwen3 b16 exit $?"; grep -E "tok/s|Error" "$OUT/e2e_qwen3_b16.log"
