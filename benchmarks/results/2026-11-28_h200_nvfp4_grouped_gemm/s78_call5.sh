#!/usr/bin/env bash
# Session 78, call 5: the routed GEMV's NVFP4 instance (new) and the kbit routed tests (launch_split's instance
# choice changed), NvFp4MoeExperts on the GPU; then Qwen3-30B-A3B shapes (16 layers) b1, NVFP4 (routed at decode).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
LIB=.variants/s78b.so.xz TESTS="tests/gpu/test_nvfp4_plain_gpu.py tests/gpu/test_models_gpu.py::test_nvfp4_moe_model_on_cuda tests/gpu/test_kbit_gemv_gpu.py::test_routed_matches_sorted_grouped_kernel tests/gpu/test_kbit_gemv_gpu.py::test_experts_module_routed_equals_sorted_and_replays_new_routing tests/gpu/test_kbit_gemv_gpu.py::test_routed_op_errors_and_fallback" TESTS_TIMEOUT=110 bash benchmarks/tools/verify_device.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
timeout 130 python3 benchmarks/e2e_gpu.py --model qwen3-30b-a3b --layers 16 --batch 1 --variants nvfp4+fuse \
  --out "$OUT/moe_b1_nvfp4_routed.json" > "$OUT/moe_b1_nvfp4_routed.log" 2>&1
echo "e2e exit $?"; grep -E "tok/s|Error|error" "$OUT/moe_b1_nvfp4_routed.log" | tail -4
