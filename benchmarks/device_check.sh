#!/usr/bin/env bash
# One device call: the GPU tests of argument checks and format decoding, then the NVFP4 end-to-end
# measurement beside bf16 (library built here and carried in .lowbit_cache).
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv
  echo "== gpu tests"; timeout ${TEST_TIMEOUT:-330} python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 -x \
      ${TESTS:-tests/gpu/test_decode_formats_gpu.py tests/test_input_checks.py tests/gpu/test_nvfp4_plain_gpu.py} 2>&1 | tail -25
  if [ -n "${E2E-1}" ]; then  # E2E= (empty) skips the end-to-end run
    echo "== lowbit generate --model random:llama-3-8b --format nvfp4 --compare --compile"
    timeout 240 python3 -m lowbit generate --model random:llama-3-8b --format nvfp4 --compare --compile 2>&1 | grep -v "it/s\]"
  fi
} 2>&1 | tee "$OUT/device_check.log"
