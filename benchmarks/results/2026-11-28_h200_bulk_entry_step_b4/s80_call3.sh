#!/usr/bin/env bash
# Session 80, call 3 (carry .variants/s79c.so.xz = A, HEAD's library, .variants/s80a.so.xz = B, the bulk GEMV's ring
# count read after the decode, and this file): the bulk GPU tests on B; the bulk kernel alone, A / B (M = 1 and 4);
# Llama-3-8B kbit4 / kbit3 fused b1 and kbit4 b4, one process per row, A B A B.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s79c.so.xz > /tmp/A.so; xz -dc .variants/s80a.so.xz > /tmp/B.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
LOWBIT_LIBRARY=/tmp/B.so timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short \
  tests/gpu/test_kbit_gemv_gpu.py -k bulk > "$OUT/tests_B.log" 2>&1
echo "tests exit $? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_B.log" | head
S=8192x29568,4096x28672,14336x4096,4096x6144,4096x4096
for M in 1 4; do for L in A B; do
  echo "== sweep M=$M $L" >> "$OUT/sweep.txt"
  LOWBIT_LIBRARY=/tmp/$L.so timeout 100 python3 benchmarks/gemv_sweep.py --bits 2,3,4 --m $M --no-warps --no-streamk --pdl --bulk --shapes $S >> "$OUT/sweep.txt" 2>&1
  echo "sweep M=$M $L exit $? at $(el) s"
done; done
grep -iE "^==|bulk" "$OUT/sweep.txt" | head -80
for R in 1 2; do for L in A B; do
  LOWBIT_LIBRARY=/tmp/$L.so timeout 100 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 \
    --variants kbit4+fuse,kbit3+fuse --out "$OUT/b1_${L}$R.json" > "$OUT/b1_${L}$R.log" 2>&1
  echo "b1 $L$R exit $? at $(el) s"; grep -E "tok/s" "$OUT/b1_${L}$R.log" | tail -2
  LOWBIT_LIBRARY=/tmp/$L.so timeout 100 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 \
    --variants kbit4+fuse --out "$OUT/b4_${L}$R.json" > "$OUT/b4_${L}$R.log" 2>&1
  echo "b4 $L$R exit $? at $(el) s"; grep -E "tok/s" "$OUT/b4_${L}$R.log" | tail -1
done; done
cd "$OUT" && tar czf details.tgz --remove-files b1_* b4_* device.txt; ls
