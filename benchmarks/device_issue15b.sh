#!/usr/bin/env bash
# Issue 15, round 2 (library built here, carried in .lowbit_cache): the checkpoint-layout NVFP4 kernels
# (W4A16 GEMV, W4A4 batched GEMV, activation quantizer): GPU tests, memcheck, then the sweeps.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
  echo "== plain gpu tests"; python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/gpu/test_nvfp4_plain_gpu.py 2>&1 | tail -15
  echo "== memcheck"; compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_nvfp4_plain_gpu.py -k "(reference and bfloat16 and (1 or 3 or 11)) or (w4a4 and full-range and 33) or quantize_act or dequant" 2>&1 | tail -2
  echo "== w4a16 sweep"; python3 benchmarks/nvfp4_sweep.py --m ${SWEEP_M:-1,2,4,8} --only ${SWEEP_ONLY:-nvfp4,nvfp4-plain,kbit4,cublas-fp16,torch-int4} --json "$OUT/nvfp4_sweep.json"
  echo "== w4a4 sweep"; python3 benchmarks/w4a4_sweep.py --json "$OUT/w4a4_sweep.json"
  if [ -n "${FULL_GPU_TESTS:-}" ]; then
    echo "== full gpu suite"; timeout ${FULL_GPU_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -8
  fi
} 2>&1 | tee "$OUT/issue15b.log"
