#!/usr/bin/env bash
# Issue 15's first device call (library built here and carried in .lowbit_cache): the NVFP4 GPU tests
# (GEMV and GEMM instances, written before any device run), memcheck on them, then the W4A16 sweep.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
  echo "== nvfp4 gpu tests"; python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_nvfp4_gpu.py 2>&1 | tail -15
  echo "== memcheck"; compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_nvfp4_gpu.py -k "extremes or deterministic or (gemv and 5)" 2>&1 | tail -2
  echo "== kbit gpu tests (kernels share the templates)"; python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_kbit_gemm_gpu.py 2>&1 | tail -3
  echo "== sweep"; python3 benchmarks/nvfp4_sweep.py --json "$OUT/nvfp4_sweep.json"
} 2>&1 | tee "$OUT/issue15.log"
