#!/usr/bin/env bash
# Session 81, call 5 (carry .variants/s81a.so.xz = the ring-knob library, s81b.so.xz = the two-stage ring as built
# from the tree, and this file): call 3's main job (s81b) was 531.5 tok/s, call 4's (s81a, LOWBIT_BULK_RING=2)
# 563.5. The same machine, alternated.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
for v in s81a s81b; do xz -dc .variants/$v.so.xz > /tmp/$v.so; done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
i=0
for v in s81b s81a s81b; do i=$((i+1))
  LOWBIT_BULK_RING=2 LOWBIT_LIBRARY=/tmp/$v.so timeout 150 python3 -m lowbit generate --model random:llama-3-8b --compile --compare > "$OUT/generate_${i}_$v.log" 2>&1
  echo "generate $v exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate_${i}_$v.log" | tail -2
done
