#!/usr/bin/env bash
# Session 80, call 4: the bulk-copy GEMV at M = 1 against M = 4 (K = 4; 14336 x 4096 and 4096 x 28672), ncu stall
# samples per SASS line on an H200; library = liblowbit-2839bbd4a0c9abe3 (HEAD's csrc).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
xz -dc .variants/s79c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
for M in 1 4; do
  W=/tmp/ncu/m$M; mkdir -p $W
  M=$M SHAPES=14336x4096,4096x28672 BITS=4 PATHS=bulk SOURCE=1 OUT=$W timeout 200 bash benchmarks/tools/gemv_ncu.sh > $W/summary.txt 2>&1
  echo "ncu M=$M exit $?"; cut -c1-300 $W/summary.txt
  for f in $W/sass_*.csv; do python3 benchmarks/tools/sass_top.py $f --top 60 > ${f%.csv}.top.txt 2>&1; done
  head -22 $W/sass_1.top.txt
done
tar czf $OUT/ncu_m1_m4.tgz -C /tmp/ncu $(cd /tmp/ncu && ls m*/summary.txt m*/sass_*.top.txt m*/ncu_details.csv)
ls -la $OUT
