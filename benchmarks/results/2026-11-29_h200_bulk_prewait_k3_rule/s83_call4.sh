#!/usr/bin/env bash
# s83 call 4 (carry .variants/s83h.so.xz, the tree's library): M = 2 sweep, the default (one stage before the wait)
# against LOWBIT_BULK_PREWAIT=2 (the whole ring); then Llama-3-8B b1, a process per row, 512-token context.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s83h.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
for p in 0 2; do
  LOWBIT_BULK_PREWAIT=$p timeout 40 python3 benchmarks/gemv_sweep.py --bits 4 --m 2 --no-warps --no-streamk --pdl --bulk --shapes 4096x6144,4096x4096,4096x28672,14336x4096 >> "$OUT/sweep_m2.txt" 2>&1
  echo "== m2 prewait $p at $(el) s"; tail -8 "$OUT/sweep_m2.txt" | grep bulk | awk '{print $1, $(NF-2), $(NF-1), $NF}'
done
timeout 290 python3 benchmarks/e2e_gpu.py --fresh --model llama-3-8b --batch 1 --variants bf16,kbit4+fuse,kbit3+fuse,kbit2+fuse --out "$OUT/fresh_b1.json" > "$OUT/fresh_b1.log" 2>&1
echo "fresh b1 exit $? at $(el) s"; grep -E "tok/s|Error" "$OUT/fresh_b1.log"
