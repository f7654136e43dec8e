#!/usr/bin/env bash
# One device call for SBVR's kernels: GPU tests, memcheck, and the kernel benchmark on Llama-3-70B's MLP shapes
# beside kbit4 and cuBLAS (cold L2, CUDA graphs). Library built here and carried in .lowbit_cache.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv
  if [ -z "${SKIP_TESTS:-}" ]; then
    echo "== gpu tests (sbvr)"
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -n "${WORKERS:-4}" -rf tests/gpu/test_sbvr_gpu.py 2>&1 | tail -25
    echo "== memcheck"
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/tools/sbvr_memcheck.py 2>&1 | tail -6
  fi
  if [ -z "${SKIP_BENCH:-}" ]; then
    echo "== bench"
    timeout "${BENCH_TIMEOUT:-300}" python3 -m lowbit bench ${BENCH_ARGS:---shape 8192x28672 --shape 28672x8192 --m 1,2,4,8 --methods cublas-fp16,lowbit-kbit4,lowbit-sbvr4-popcount,lowbit-sbvr4-lookup,lowbit-sbvr3-popcount,lowbit-sbvr3-lookup,lowbit-sbvr2-popcount} \
        --no-hot --no-plots --out "$OUT/bench" 2>&1 | grep -v "it/s\]" | tail -40
  fi
} 2>&1 | tee "$OUT/sbvr_device.log"
