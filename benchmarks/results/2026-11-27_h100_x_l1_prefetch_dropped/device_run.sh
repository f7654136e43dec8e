#!/usr/bin/env bash
# A = HEAD's library (2288398a), B = the first unit's x prefetched into L1 beside the norm statistics' loads.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
xz -dc .variants/b0/lib.so.xz > /tmp/A.so
xz -dc .variants/px/lib.so.xz > /tmp/B.so
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/summary.txt
SECONDS=0
LOWBIT_LIBRARY=/tmp/B.so timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 16 --tb=short \
  tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_layers_gpu.py tests/gpu/test_nvfp4_gpu.py > $OUT/tests_B.log 2>&1
echo "tests on B: ${SECONDS}s" | tee -a $OUT/summary.txt
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests_B.log | tail -6 | tee -a $OUT/summary.txt
for b in ${BATCHES:-1 1 4}; do
  for lib in A B; do
    echo "== b$b lib $lib" | tee -a $OUT/summary.txt
    LOWBIT_LIBRARY=/tmp/$lib.so timeout 150 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch $b \
      --variants ${VARIANTS:-kbit4+fuse} --out $OUT/e2e_b${b}_$lib.$SECONDS.json 2>&1 | grep -E "tok/s|Error|error" | tail -4 | tee -a $OUT/summary.txt
  done
done
