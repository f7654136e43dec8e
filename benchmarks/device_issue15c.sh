#!/usr/bin/env bash
# Issue 15, last device call: the NVFP4 GPU test files (checkpoint-layout kernels, grouped, tiled instances),
# memcheck on the grouped / nvfp4_linear paths, and the grouped MoE timing beside kbit4.
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_nvfp4_plain_gpu.py tests/gpu/test_nvfp4_gpu.py 2>&1 | tail -4
compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_nvfp4_plain_gpu.py -k "grouped or every_path or quantize_then" 2>&1 | tail -2
python3 benchmarks/nvfp4_moe.py --tokens 1,4 2>&1 | tail -3
