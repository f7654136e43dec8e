#!/usr/bin/env bash
# Session 79, call 3 (carry .variants/s79b.so.xz = B, the bulk tail's library, .variants/s79c.so.xz = C, B + the norm's
# loads in flight with x's (the bulk GEMV's slice-0 x before rms_partials; the stream-K kernel's stage_x between
# rms_partials' loads and sums), and this file): Llama-3-8B b1 kbit4 / kbit3 / NVFP4 fused, B and C each in its own
# process, then the whole GPU suite on C (the final library).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s79b.so.xz > /tmp/B.so; xz -dc .variants/s79c.so.xz > /tmp/C.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
for L in B C; do
  LOWBIT_LIBRARY=/tmp/$L.so timeout 110 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 \
    --variants kbit4+fuse,kbit3+fuse,nvfp4+fuse --out "$OUT/b1_$L.json" > "$OUT/b1_$L.log" 2>&1
  echo "b1 $L exit $? at $(el) s"; grep -E "^===|tok/s" "$OUT/b1_$L.log"
done
LOWBIT_LIBRARY=/tmp/C.so timeout $(( 585 - $(el) )) python3 -m pytest -m gpu tests -n 8 -v -p no:cacheprovider > "$OUT/gpu_suite.log" 2>&1
echo "suite exit $? at $(el) s"; tail -n 2 "$OUT/gpu_suite.log"; grep -E "^FAILED|^ERROR| FAILED | ERROR " "$OUT/gpu_suite.log" | head
grep -cE " (PASSED|SKIPPED|FAILED|ERROR|XFAIL|XPASS) " "$OUT/gpu_suite.log" | sed 's/^/tests finished: /'
cd "$OUT" && xz -9 gpu_suite.log; tar czf details.tgz --remove-files b1_*.json b1_*.log device.txt; ls
