#!/usr/bin/env bash
# both attention kernels' GPU tests, the planned kernel beside the CUDA-core one in the Llama-3-8B step (b4, b16)
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
xz -dc .variants/mma.so.xz > /tmp/liblowbit.so && export LOWBIT_LIBRARY=/tmp/liblowbit.so
timeout 240 python3 -m pytest -m gpu -n 14 -q -p no:cacheprovider tests/gpu/test_attention_gpu.py > "$OUT/attn_tests.log" 2>&1
echo "tests exit $?"; tail -n 2 "$OUT/attn_tests.log"; grep -E "^FAILED|^ERROR" "$OUT/attn_tests.log" | head -20
for b in 16 4; do
  timeout $((b == 16 ? 200 : 140)) python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch $b \
    --variants kbit4+fuse,kbit4+fuse@simt-attention,kbit4+fuse --out "$OUT/e2e_b$b.json" > "$OUT/e2e_b$b.log" 2>&1
  echo "b$b exit $?"; grep -E "tok/s|Error" "$OUT/e2e_b$b.log"
done
