#!/usr/bin/env bash
# Session 81, call 4 (carry .variants/s79c.so.xz = HEAD's library, s81a.so.xz = the ring-knob library, and this file;
# s81a with LOWBIT_BULK_RING=2 stands for the two-stage ring): the main job disagreed with e2e_gpu.py (512-token context) on the two-stage
# ring. The main job with each library, then the knob library at the main job's context (16 tokens), 4 stages / 2.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
for v in s79c s81a; do xz -dc .variants/$v.so.xz > /tmp/$v.so; done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
for v in s81a s79c; do
  LOWBIT_BULK_RING=2 LOWBIT_LIBRARY=/tmp/$v.so timeout 200 python3 -m lowbit generate --model random:llama-3-8b --compile --compare > "$OUT/generate_$v.log" 2>&1
  echo "generate $v exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate_$v.log" | tail -2
done
e2e() {  # name [env...]
  local name=$1; shift
  env LOWBIT_LIBRARY=/tmp/s81a.so "$@" timeout 120 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --context 16 --tokens 48 --variants kbit4+fuse --out "$OUT/e2e_$name.json" > "$OUT/e2e_$name.log" 2>&1
  echo "== e2e $name ($*) exit $? at $(el) s"; grep -E "tok/s" "$OUT/e2e_$name.log" | tail -1
}
e2e c16_def
e2e c16_r2 LOWBIT_BULK_RING=2
e2e c16_r3 LOWBIT_BULK_RING=3
