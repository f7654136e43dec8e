#!/usr/bin/env bash
# Session 81, call 3 (carry .variants/s81b.so.xz = liblowbit-7f58e39b1df5c045, the tree's library with the bulk
# GEMV's ring at two stages, and this file): the bulk-GEMV and fused-layer GPU tests, the main job at b1 and b4
# beside bf16, and kbit3 / kbit2 end to end (b1).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s81b.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import lowbit, lowbit.kernels.loader as L" 2>/dev/null
timeout 220 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_layers_gpu.py > "$OUT/tests.log" 2>&1
echo "tests exit $? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | head
for B in 1 4; do
  timeout 200 python3 -m lowbit generate --model random:llama-3-8b --compile --compare --batch $B > "$OUT/generate_b$B.log" 2>&1
  echo "generate b$B exit $? at $(el) s"; grep -E "tok/s|x bf16" "$OUT/generate_b$B.log" | tail -4
done
timeout 150 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants kbit3+fuse,kbit2+fuse --out "$OUT/e2e_k3k2.json" > "$OUT/e2e_k3k2.log" 2>&1
echo "e2e k3 k2 exit $? at $(el) s"; grep -E "tok/s" "$OUT/e2e_k3k2.log" | tail -3
