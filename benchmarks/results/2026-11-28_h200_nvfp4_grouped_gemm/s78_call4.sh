#!/usr/bin/env bash
# Session 78, call 4: NvFp4MoeExperts on the GPU (its model test, graph, compile), the NVFP4 grouped tests, then
# Qwen3-30B-A3B shapes (16 layers) decode b1: bf16, kbit4, NVFP4 with its expert blocks now in NVFP4.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
LIB=.variants/s78a.so.xz TESTS="tests/gpu/test_models_gpu.py::test_nvfp4_moe_model_on_cuda tests/gpu/test_nvfp4_plain_gpu.py tests/gpu/test_models_gpu.py::test_torch_compile_fullgraph tests/test_readme.py" TESTS_TIMEOUT=150 bash benchmarks/tools/verify_device.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
timeout 240 python3 benchmarks/e2e_gpu.py --model qwen3-30b-a3b --layers 16 --batch 1 --variants bf16,kbit4+fuse,nvfp4+fuse \
  --out "$OUT/moe_b1.json" > "$OUT/moe_b1.log" 2>&1
echo "e2e exit $?"; grep -E "tok/s|Error|error" "$OUT/moe_b1.log" | tail -8
