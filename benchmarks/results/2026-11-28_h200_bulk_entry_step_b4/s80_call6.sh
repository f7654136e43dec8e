#!/usr/bin/env bash
# Session 80, call 6: the Llama-3-8B kbit4 fused step profiled at b1 and b4 on an H200 (per-kernel critical path), and
# the bulk GEMV alone at M = 2 and 3 (K = 4); library = liblowbit-2839bbd4a0c9abe3 (HEAD's csrc).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s79c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
for M in 2 3; do
  timeout 60 python3 benchmarks/gemv_sweep.py --bits 4 --m $M --no-warps --no-streamk --pdl --bulk --shapes 14336x4096,4096x28672,4096x6144 2>&1 | grep -E "bulk" | sed "s/^/M=$M /"
done
for B in 1 4; do
  D=/tmp/tr$B; mkdir -p $D
  timeout 150 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch $B --variants kbit4+fuse --profile kbit4+fuse \
    --profile-graph --trace-dir $D --out $D/rows.json > $OUT/e2e_b$B.log 2>&1
  echo "b$B exit $? at $(el) s"; grep "tok/s" $OUT/e2e_b$B.log | tail -1
  f=$(ls $D/*.trace.json* | head -1)
  python3 benchmarks/tools/step_trace.py $f --critical decode_attention > $OUT/step_b$B.txt 2>&1
  python3 benchmarks/tools/step_trace.py $f --layer 5 >> $OUT/step_b$B.txt 2>&1
  head -60 $OUT/step_b$B.txt
done
