#!/usr/bin/env bash
# One device call (library built here and carried in .lowbit_cache): lowbit's decoder-layer decode step
# (benchmarks/journal/2026-11-25_decode_layer_in_lowbit_kernels.md).
#   1. GPU tests: the step kernels and the layer step, the GEMV family (its epilogue changed), attention;
#   2. Llama-3-8B end to end, A/B rows in one process: batch 1 (with and without the layer step, twice,
#      and with EARLY K/V loads), batch 4.
# TESTS=0 skips 1; E2E=0 skips 2.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  if [ "${TESTS:-1}" = 1 ]; then
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/gpu/test_step_gpu.py \
        tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_attention_gpu.py > "$OUT/pytest_step.log" 2>&1
    echo "pytest exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest_step.log" | tail -15
  fi
  if [ "${E2E:-1}" = 1 ]; then
    echo "== e2e batch 1"
    timeout 330 python3 benchmarks/e2e_gpu.py --model llama-3-8b \
        --variants bf16,kbit4+fuse@no-layers,kbit4+fuse,kbit4+fuse@early-kv,kbit4+fuse@no-layers,kbit4+fuse \
        --out "$OUT/e2e_b1.json" 2>&1 | grep -E "===|tok/s|Error|error"
    echo "== e2e batch 4"
    timeout 200 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 \
        --variants bf16,kbit4+fuse@no-layers,kbit4+fuse --out "$OUT/e2e_b4.json" 2>&1 | grep -E "===|tok/s|Error|error"
  fi
} 2>&1 | tee "$OUT/layer_step_device.log"
