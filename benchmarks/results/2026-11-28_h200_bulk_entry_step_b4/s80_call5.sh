#!/usr/bin/env bash
# Session 80, call 5: the SASS (with ncu stall samples) around the bulk GEMV's loop entry, M = 1 and M = 4, K = 4,
# 14336 x 4096, H200; library = liblowbit-2839bbd4a0c9abe3 (HEAD's csrc).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
xz -dc .variants/s79c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
for M in 1 4; do
  W=/tmp/ncu/m$M; mkdir -p $W
  M=$M SHAPES=14336x4096 BITS=4 PATHS=bulk SOURCE=1 OUT=$W timeout 200 bash benchmarks/tools/gemv_ncu.sh > $W/summary.txt 2>&1
  echo "ncu M=$M exit $?"
  python3 - $W/sass_1.csv > $OUT/sass_window_m$M.txt <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"') and not l.startswith('"Kernel Name"')]
rows = [r for r in csv.DictReader(lines) if r.get("Address") != "Address"]
keys = [k for k in rows[0] if k.startswith("stall_") or k in ("Warp Stall Sampling (All Samples)",)]
seen = set(); out = []
for r in rows:
    if r["Address"] in seen: continue
    seen.add(r["Address"]); out.append(r)
for r in out:
    st = {k[6:]: r[k] for k in keys if k.startswith("stall_") and r[k] not in ("", "0")}
    print(r["Address"], r["Warp Stall Sampling (All Samples)"], r["Source"][:70], st)
PY
  wc -l $OUT/sass_window_m$M.txt
done
