#!/usr/bin/env bash
# One device call (library built here and carried in .lowbit_cache): a part of the GPU suite, then
# optionally the end-to-end run of the README's headline command.
#
#   SUITE=a|b|c|d|e the whole `pytest -m gpu` takes five calls of up to 10 minutes (-n 4): a = kbit GEMV
#                 (+ `pytest -m timing` alone); d = dense GEMV, dequantize, bench harness; b = kbit GEMM, NVFP4 tiled;
#                 c = decode formats, models, NVFP4 checkpoint-layout GEMV, GPTQ, the transformers quantizer, input checks; e = SBVR, decode
#                 attention, MoE router, tensor parallelism on NCCL (2 GPUs; skipped on one)
#   TESTS=...     instead of SUITE: these test paths
#   E2E=1         also `lowbit generate --model random:llama-3-8b --compile --compare --format kbit,nvfp4`
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
case "${SUITE:-}" in
  a) FILES="tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_layers_gpu.py" ;;
  d) FILES="tests/gpu/test_dense_gemv_gpu.py tests/gpu/test_head_gpu.py tests/gpu/test_kbit_dequant_gpu.py tests/gpu/test_kbit_tiled_dequant_gpu.py
            tests/gpu/test_bench_gpu.py tests/gpu/test_smem_limit_gpu.py" ;;
  b) FILES="tests/gpu/test_kbit_gemm_gpu.py tests/gpu/test_nvfp4_gpu.py" ;;
  c) FILES="tests/gpu/test_decode_formats_gpu.py tests/gpu/test_models_gpu.py tests/gpu/test_nvfp4_plain_gpu.py tests/gpu/test_gptq_gpu.py
            tests/gpu/test_hf_quantizer_gpu.py tests/test_input_checks.py" ;;
  e) FILES="tests/gpu/test_sbvr_gpu.py tests/gpu/test_attention_gpu.py tests/gpu/test_router_gpu.py
            tests/gpu/test_hf_tp_gpu.py" ;;
  *) FILES="${TESTS:-tests/gpu/test_decode_formats_gpu.py tests/test_input_checks.py}" ;;
esac
{
  nvidia-smi --query-gpu=name,driver_version --format=csv
  echo "== gpu tests ${SUITE:-}"
  # shellcheck disable=SC2086
  # -v into a log: a run stopped by the timeout still says which tests passed
  timeout "${TEST_TIMEOUT:-500}" python3 -m pytest -m gpu -v -p no:cacheprovider -n "${WORKERS:-4}" -rf --durations=10 $FILES \
      > "$OUT/pytest_${SUITE:-custom}.log" 2>&1
  echo "exit $?; $(grep -c ' PASSED' "$OUT/pytest_${SUITE:-custom}.log") passed, $(grep -c ' FAILED' "$OUT/pytest_${SUITE:-custom}.log") failed lines"
  grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest_${SUITE:-custom}.log" | grep -v " PASSED" | tail -25
  if [ "${SUITE:-}" = a ]; then
    echo "== timing tests (the GPU alone)"; timeout 120 python3 -m pytest -m timing -q -p no:cacheprovider tests 2>&1 | tail -3
  fi
  if [ -n "${E2E:-}" ]; then
    echo "== lowbit generate --model random:llama-3-8b --compile --compare --format kbit,nvfp4"
    timeout 300 python3 -m lowbit generate --model random:llama-3-8b --compile --compare --format kbit,nvfp4 2>&1 \
        | grep -v "it/s\]"
  fi
} 2>&1 | tee "$OUT/device_check_${SUITE:-custom}.log"
