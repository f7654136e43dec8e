#!/usr/bin/env bash
# Session 80, call 7 (carry .variants/s79c.so.xz = A, HEAD's library, .variants/s80b.so.xz = B, the bulk GEMV's
# multi-token instances with x copied into shared memory by bulk copies, and this file): bulk + layer GPU tests on B
# (the new bit-equality test on A too), the kernel alone A / B at M = 4, Llama-3-8B kbit4 b4 A / B.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s79c.so.xz > /tmp/A.so; xz -dc .variants/s80b.so.xz > /tmp/B.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
LOWBIT_LIBRARY=/tmp/A.so timeout 40 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 --tb=line \
  tests/gpu/test_kbit_gemv_gpu.py -k tokens_equal > "$OUT/tests_A_equal.log" 2>&1
echo "A equal exit $? at $(el) s"; tail -2 "$OUT/tests_A_equal.log"
LOWBIT_LIBRARY=/tmp/B.so timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short \
  tests/gpu/test_kbit_gemv_gpu.py -k bulk > "$OUT/tests_B.log" 2>&1
echo "B bulk exit $? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_B.log" | head
for L in A B; do
  LOWBIT_LIBRARY=/tmp/$L.so timeout 40 python3 benchmarks/gemv_sweep.py --bits 2,4 --m 4 --no-warps --no-streamk --pdl --bulk \
    --shapes 14336x4096,4096x28672,4096x6144,4096x4096 2>&1 | grep bulk | sed "s/^/$L /"
done
echo "sweeps at $(el) s"
for L in A B; do
  LOWBIT_LIBRARY=/tmp/$L.so timeout 70 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 \
    --variants kbit4+fuse --out "$OUT/b4_$L.json" > "$OUT/b4_$L.log" 2>&1
  echo "b4 $L exit $? at $(el) s"; grep -E "tok/s" "$OUT/b4_$L.log" | tail -1
done
LOWBIT_LIBRARY=/tmp/B.so timeout $(( 400 - $(el) )) python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short \
  tests/gpu/test_layers_gpu.py > "$OUT/tests_B_layers.log" 2>&1
echo "B layers exit $? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_B_layers.log" | head
cd "$OUT" && tar czf details.tgz --remove-files b4_* tests_A_equal.log; ls
