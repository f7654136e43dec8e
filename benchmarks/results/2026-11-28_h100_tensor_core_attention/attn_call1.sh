#!/usr/bin/env bash
# tests of both attention kernels, then the tensor-core kernel's sweep beside the CUDA-core one
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
LIB=.variants/mma.so.xz TESTS="tests/gpu/test_attention_gpu.py" bash benchmarks/tools/verify_device.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
for cfg in "1 590 8" "1 4096 8" "4 590 8" "4 4096 8" "8 590 8" "16 590 8" "16 2048 8" "32 590 8" "16 590 4" "1 590 4"; do
  set -- $cfg
  echo "== batch $1, cache $2, kv heads $3"
  timeout 90 python3 benchmarks/tools/attn_decode_bench.py --batch $1 --cache $2 --kv-heads $3 --no-sdpa --warps 4,8 \
    --chunks 64,128,256 2>&1 | grep -v "^repeat_kv"
done > "$OUT/attn_sweep.txt" 2>&1
grep -E "==|lowbit (simt |mma )?decode_attention(_append)?\(mask\) " "$OUT/attn_sweep.txt"
