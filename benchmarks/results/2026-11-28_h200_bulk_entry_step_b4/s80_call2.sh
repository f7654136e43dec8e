#!/usr/bin/env bash
# Session 80, call 2: where the bulk-copy GEMV's time goes on an H200 (ncu stall samples per SASS line), K = 3 and 4
# on 8192 x 29568, beside the CTA-local stream-K kernel; library = liblowbit-2839bbd4a0c9abe3 (HEAD's csrc).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
xz -dc .variants/s79c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
W=/tmp/ncu; mkdir -p $W
SHAPES=8192x29568 BITS=3,4 PATHS=bulk,local SOURCE=1 OUT=$W timeout 400 bash benchmarks/tools/gemv_ncu.sh > $W/summary.txt 2>&1
echo "ncu exit $?"; cat $W/summary.txt | cut -c1-400
for f in $W/sass_*.csv; do python3 benchmarks/tools/sass_top.py $f --top 45 > ${f%.csv}.top.txt 2>&1; done
python3 - <<'PY' > $W/stall_metrics.txt
import csv
rows = list(csv.DictReader(l for l in open("/tmp/ncu/ncu_details.csv") if l.startswith('"')))
for r in rows:
    n = r["Metric Name"]
    if any(s in n for s in ("Stall", "Issue Slots", "Issued Ipc", "Eligible", "Active Warps", "Duration", "DRAM Throughput", "L1/TEX Hit", "Shared", "Bank", "Pipe", "Executed Ipc")):
        print(r["ID"], r["Kernel Name"][:50], "|", n, "=", r["Metric Value"], r["Metric Unit"])
PY
head -c 3000 $W/sass_0.top.txt
tar czf $OUT/ncu_s80.tgz -C $W summary.txt stall_metrics.txt ncu_details.csv $(cd $W && ls sass_*.top.txt) 
ls -la $OUT
