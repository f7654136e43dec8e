#!/usr/bin/env bash
# One device call for the tensor-core decode attention probe (benchmarks/tools/attn_mma_probe.cu) beside the library's
# kernel on the same shapes. Build the probe here first (the device image has no nvcc) and carry it:
#   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc -Ibenchmarks/tools -o .variants/attn_mma benchmarks/tools/attn_mma_probe.cu
#   LIB=.variants/<library>.so.xz bash benchmarks/tools/attn_mma_device.sh      (carry .variants)
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
if [ -n "${LIB:-}" ]; then
  export LOWBIT_LIBRARY=$PWD/$LIB
  if [[ $LOWBIT_LIBRARY == *.xz ]]; then xz -dc "$LOWBIT_LIBRARY" > /tmp/liblowbit.so && export LOWBIT_LIBRARY=/tmp/liblowbit.so; fi
fi
PROBE=${PROBE:-.variants/attn_mma}
{
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
  "$PROBE" 16 8 4 590 530 0 64 128 192 320
  "$PROBE" 8 8 4 590 530 0 64 128 192
  "$PROBE" 4 8 4 590 530 0 64 128
  "$PROBE" 1 8 4 4096 4036 64 128 256
  "$PROBE" 16 4 8 590 530 0 64 128    # Qwen3-30B-A3B heads (4 KV heads x 8)
} 2>&1 | tee "$OUT/attn_mma_probe.txt"
for b in 16 8 4; do
  timeout 120 python3 benchmarks/tools/attn_decode_bench.py --batch "$b" 2>&1 | grep lowbit | sed "s/^/batch $b: /"
done | tee "$OUT/attn_library.txt"
timeout 120 python3 benchmarks/tools/attn_decode_bench.py --batch 1 --cache 4096 2>&1 | grep lowbit | sed "s/^/batch 1, 4096: /" \
  | tee -a "$OUT/attn_library.txt"
timeout 120 python3 benchmarks/tools/attn_decode_bench.py --batch 16 --kv-heads 4 2>&1 | grep lowbit | sed "s/^/batch 16, 4 KV heads: /" \
  | tee -a "$OUT/attn_library.txt"
