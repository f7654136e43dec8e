#!/usr/bin/env bash
# Session 77, call 2 (carry .variants/head76.so.xz + this file): BULK_LAYER_MAX_M beyond {4: 4} on an H200 --
# kbit2 b4 and kbit4 b8 alternated with @bulk-m8 ({2: 8, 3: 8, 4: 8}) -- then decode attention's plan at b1 / b4.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
LIB=.variants/head76.so.xz ROW_TIMEOUT=230 \
ROWS="b4_k2:--model llama-3-8b --batch 4 --variants kbit2+fuse,kbit2+fuse@bulk-m8,kbit2+fuse,kbit2+fuse@bulk-m8;b8_k4:--model llama-3-8b --batch 8 --variants kbit4+fuse,kbit4+fuse@bulk-m8,kbit4+fuse,kbit4+fuse@bulk-m8" \
  bash benchmarks/tools/verify_device.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
for b in 1 4; do
  timeout 100 python3 benchmarks/tools/attn_decode_bench.py --batch $b --cache 590 --kv-heads 8 --no-sdpa \
    --splits 1,2,4 --chunks 64,128,192,256 --warps 4,8 > "$OUT/attn_b$b.txt" 2>&1
  echo "b$b exit $?"; tail -30 "$OUT/attn_b$b.txt"
done
