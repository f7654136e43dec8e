#!/usr/bin/env bash
# Session 81, call 2 (carry .variants/s81a.so.xz = the tree's library with the bulk GEMV's ring knobs, and this file):
# the bulk kernel alone against its ring depth (LOWBIT_BULK_RING) and the stages it issues before the PDL wait
# (LOWBIT_BULK_PREWAIT), then Llama-3-8B kbit4 end to end with the best candidates.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s81a.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
SH=4096x6144,4096x4096,4096x28672,14336x4096,8192x29568
sweep() {  # name bits m [env...]
  local name=$1 bits=$2 m=$3; shift 3
  env "$@" timeout 60 python3 benchmarks/gemv_sweep.py --bits $bits --m $m --no-warps --no-streamk --pdl --bulk --shapes $SH > "$OUT/sw_$name.txt" 2>&1
  echo "== $name ($*) exit $? at $(el) s"; grep "bulk" "$OUT/sw_$name.txt" | awk '{print $1, $(NF-2), $(NF-1), $NF}'
}
sweep k4m1_def 4 1
sweep k4m1_r2 4 1 LOWBIT_BULK_RING=2
sweep k4m1_r3 4 1 LOWBIT_BULK_RING=3
sweep k4m1_p1 4 1 LOWBIT_BULK_PREWAIT=1
sweep k4m1_r2p1 4 1 LOWBIT_BULK_RING=2 LOWBIT_BULK_PREWAIT=1
sweep k4m4_def 4 4
sweep k4m4_r2 4 4 LOWBIT_BULK_RING=2
sweep k4m4_p1 4 4 LOWBIT_BULK_PREWAIT=1
sweep k3m1_def 3 1
sweep k3m1_r2 3 1 LOWBIT_BULK_RING=2
sweep k2m1_def 2 1
sweep k2m1_r2 2 1 LOWBIT_BULK_RING=2
e2e() {  # name batch [env...]
  local name=$1 b=$2; shift 2
  env "$@" timeout 120 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch $b --variants kbit4+fuse --out "$OUT/e2e_$name.json" > "$OUT/e2e_$name.log" 2>&1
  echo "== e2e $name ($*) exit $? at $(el) s"; grep -E "tok/s" "$OUT/e2e_$name.log" | tail -2
}
e2e b1_def 1
e2e b1_r2 1 LOWBIT_BULK_RING=2
e2e b1_p1 1 LOWBIT_BULK_PREWAIT=1
e2e b4_def 4
e2e b4_r2 4 LOWBIT_BULK_RING=2
