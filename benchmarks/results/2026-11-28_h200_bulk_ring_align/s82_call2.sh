#!/usr/bin/env bash
# s82 call 2: s82c = liblowbit-fe0b639b81d17aeb (the ring at a 128-byte shared address, kBulkRingAlign, as committed);
# s82d = the same + .probe/ring_off16.patch (the ring 16 bytes past a 128-byte boundary: only 16-byte aligned, like
# the 6%-slower build of 2026-11-28_bulk_ring_depth.md section 3). generate b1 alternated c/d/c/d, then b4 on c, then
# kbit3's layer rules on c (e2e_gpu, one process).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
for v in s82c s82d; do xz -dc .variants/$v.so.xz > /tmp/$v.so; done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
i=0
for v in s82c s82d s82c s82d; do i=$((i+1))
  LOWBIT_LIBRARY=/tmp/$v.so timeout 110 python3 -m lowbit generate --model random:llama-3-8b --compile --compare >> "$OUT/generate.log" 2>&1
  echo "generate $i $v exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate.log" | tail -2
done
LOWBIT_LIBRARY=/tmp/s82c.so timeout 120 python3 -m lowbit generate --model random:llama-3-8b --compile --compare --batch 4 > "$OUT/generate_b4.log" 2>&1
echo "generate b4 exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate_b4.log" | tail -2
LOWBIT_LIBRARY=/tmp/s82c.so timeout 170 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants kbit3+fuse,kbit3+fuse@bulk-large,kbit3+fuse@bulk-swiglu,kbit3+fuse --out "$OUT/k3_rules.json" > "$OUT/k3_rules.log" 2>&1
echo "k3 rules exit $? at $(el) s"; grep -E "tok/s|Error" "$OUT/k3_rules.log"
