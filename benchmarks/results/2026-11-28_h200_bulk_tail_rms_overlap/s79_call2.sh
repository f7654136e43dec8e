#!/usr/bin/env bash
# Session 79, call 2 (carry .variants/head78.so.xz = A, .variants/s79b.so.xz = B and this file): B = the bulk-copy
# GEMV's tail with the norm factors summed once by warp 0 (call 1's per-warp rows passed 1 KB of static shared memory): B's bulk / epilogue GPU
# tests, both libraries' bulk kernels alone at M = 1 and 4, then Llama-3-8B b4 and b1 end to end, one process per row,
# A and B alternated.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/head78.so.xz > /tmp/A.so; xz -dc .variants/s79b.so.xz > /tmp/B.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
LOWBIT_LIBRARY=/tmp/B.so timeout 170 python3 -m pytest --tb=line -m gpu -q -p no:cacheprovider -n 6 tests/gpu/test_kbit_gemv_gpu.py \
  tests/gpu/test_layers_gpu.py -k "bulk or swiglu or epilogue or pdl_chain or matches_reference" > "$OUT/tests_B.log" 2>&1
echo "tests exit $? at $(el) s"; tail -2 "$OUT/tests_B.log"; grep -E "^FAILED|^ERROR" "$OUT/tests_B.log" | head
SH=4096x6144,4096x4096,4096x28672,14336x4096
for L in A B; do
  for M in 1 4; do
    LOWBIT_LIBRARY=/tmp/$L.so timeout 60 python3 benchmarks/gemv_sweep.py --bits 4 --m $M --no-warps --no-streamk --pdl --bulk \
      --shapes $SH > "$OUT/sweep_${L}_m$M.txt" 2>&1
    echo "sweep $L m$M exit $? at $(el) s"; grep -E "bulk" "$OUT/sweep_${L}_m$M.txt"
  done
done
for round in 1 2; do
  for L in A B; do
    [ $(el) -gt 480 ] && break
    LOWBIT_LIBRARY=/tmp/$L.so timeout 110 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 --variants kbit4+fuse \
      --out "$OUT/b4_${L}_$round.json" > "$OUT/b4_${L}_$round.log" 2>&1
    echo "b4 $L round $round exit $? at $(el) s"; grep -E "tok/s" "$OUT/b4_${L}_$round.log" | tail -1
  done
done
for L in A B; do
  [ $(el) -gt 500 ] && break
  LOWBIT_LIBRARY=/tmp/$L.so timeout 90 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants kbit4+fuse \
    --out "$OUT/b1_$L.json" > "$OUT/b1_$L.log" 2>&1
  echo "b1 $L exit $? at $(el) s"; grep -E "tok/s" "$OUT/b1_$L.log" | tail -1
done
cd "$OUT" && tar czf details.tgz --remove-files sweep_*.txt b4_*.json b1_*.json b4_*.log b1_*.log device.txt 2>/dev/null; ls "$OUT"
