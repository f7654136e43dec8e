#!/usr/bin/env bash
# Session 81, call 1 (carry .variants/s79c.so.xz = HEAD's library liblowbit-2839bbd4a0c9abe3, and this file):
# the bulk GEMV tests (the bit-equality test's new reference bound), the tensor-core attention's chunk / warp choices
# at b4 on this GPU, and the bulk kernel's time against its ring depth (LOWBIT_SMEM_LIMIT) at M = 1 and 4: does the
# multi-token instance lose by the stages its partial sums take?
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s79c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short tests/gpu/test_kbit_gemv_gpu.py -k bulk > "$OUT/tests.log" 2>&1
echo "tests exit $? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | head
timeout 200 python3 benchmarks/tools/attn_decode_bench.py --batch 4 --cache 590 --kv-heads 8 --no-sdpa --warps 4,8 --chunks 128,192,256 > "$OUT/attn_b4.txt" 2>&1
echo "attn exit $? at $(el) s"; head -40 "$OUT/attn_b4.txt"
for L in 0 162816 128000; do for M in 1 4; do
  LOWBIT_SMEM_LIMIT=$L timeout 60 python3 benchmarks/gemv_sweep.py --bits 4 --m $M --no-warps --no-streamk --pdl --bulk \
    --shapes 4096x28672,14336x4096 > "$OUT/ring_L${L}_m$M.txt" 2>&1
  echo "== limit $L m $M exit $? at $(el) s"; grep -i "bulk" "$OUT/ring_L${L}_m$M.txt" | head -4
done; done
