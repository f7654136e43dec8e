#!/usr/bin/env bash
# Session 81, call 6 (carry .variants/s81c.so.xz = liblowbit-e0867ec3e8725493, the tree's library: the knob
# library's kernel with the ring at two stages by default, and this file): the main job at b1 and b4, and the
# bulk GEMV tests.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s81c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
for B in 1 4; do
  timeout 100 python3 -m lowbit generate --model random:llama-3-8b --compile --compare --batch $B > "$OUT/generate_b$B.log" 2>&1
  echo "generate b$B exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate_b$B.log" | tail -2
done
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short tests/gpu/test_kbit_gemv_gpu.py -k bulk > "$OUT/tests.log" 2>&1
echo "tests exit $? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | head
