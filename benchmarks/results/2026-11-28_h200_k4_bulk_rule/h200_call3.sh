#!/usr/bin/env bash
# call 3 (H200): the bulk-copy GEMV's decode rule re-checked in the step after the relay (bulk K = 4 is
# now faster alone on large shapes: 8192x29568 35.88 vs stream-K 38.07 us): kbit4 with and without the rule
# (@bulk-large), kbit3's down_proj off the split kernel (@no-split), Llama-3-8B and 70B shapes (20 layers), b1.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT" /tmp/tr
start=$(date +%s)
xz -dc .variants/final74c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
timeout 290 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 \
  --variants kbit4+fuse,kbit4+fuse@bulk-large,kbit3+fuse,kbit3+fuse@no-split,kbit4+fuse@bulk-large,kbit4+fuse,kbit3+fuse@no-split,kbit3+fuse \
  --profile kbit4+fuse@bulk-large --profile-graph --trace-dir /tmp/tr --out "$OUT/b1_8b.json" > "$OUT/b1_8b.log" 2>&1
echo "8b exit $? at $(( $(date +%s) - start )) s"; grep -E "^===|tok/s|Error" "$OUT/b1_8b.log"
f=/tmp/tr/kbit4_fuse_bulk-large.trace.json
[ -f $f ] && python3 benchmarks/tools/step_trace.py $f --critical decode_attention > "$OUT/critical_bulk_large.txt" 2>&1 && tail -8 "$OUT/critical_bulk_large.txt"
timeout $(( 570 - ($(date +%s) - start) )) python3 benchmarks/e2e_gpu.py --model llama-3-70b --layers 20 --batch 1 \
  --variants kbit4+fuse,kbit4+fuse@bulk-large,kbit4+fuse@bulk-large,kbit4+fuse --out "$OUT/b1_70b.json" > "$OUT/b1_70b.log" 2>&1
echo "70b exit $? at $(( $(date +%s) - start )) s"; grep -E "^===|tok/s|Error" "$OUT/b1_70b.log"
