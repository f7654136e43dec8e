#!/usr/bin/env bash
# s82 call 1: s82a = liblowbit-fbac5489bb3db9b5 (the tree at HEAD 1ce4ab9), s82b = the same + .probe/ring_align128.patch
# (liblowbit-bdac1481199b1dad). Bulk + ring-knob tests on s82a, then generate b1 alternated a/b/a/b.
# The whole GPU suite on the tree's library is the second call: SUITE=1 LIB=.variants/s82a.so.xz bash benchmarks/tools/verify_device.sh
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
for v in s82a s82b; do xz -dc .variants/$v.so.xz > /tmp/$v.so; done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
LOWBIT_LIBRARY=/tmp/s82a.so timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 --tb=short tests/gpu/test_kbit_gemv_gpu.py -k "bulk or ring_knobs" > "$OUT/tests.log" 2>&1
echo "tests exit $? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | head
i=0
for v in s82a s82b s82a s82b; do i=$((i+1))
  LOWBIT_LIBRARY=/tmp/$v.so timeout 150 python3 -m lowbit generate --model random:llama-3-8b --compile --compare > "$OUT/generate_${i}_$v.log" 2>&1
  echo "generate $v exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate_${i}_$v.log" | tail -2
done
