#!/usr/bin/env bash
# Session 76, call 6 (H200): the final library (one-token instances as before, MULTI ones for 2..8 tokens): its bulk
# tests, then Llama-3-8B b1 and b4 kbit4.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/bulk_m8b.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_layers_gpu.py \
  -k "bulk" > "$OUT/tests.log" 2>&1
echo "tests exit $? at $(( $(date +%s) - start )) s"; tail -2 "$OUT/tests.log"
timeout 150 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants kbit4+fuse,kbit4+fuse --out "$OUT/b1.json" > "$OUT/b1.log" 2>&1
echo "b1 exit $? at $(( $(date +%s) - start )) s"; grep -E "tok/s|Error" "$OUT/b1.log"
