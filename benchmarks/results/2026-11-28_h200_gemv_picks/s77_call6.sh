#!/usr/bin/env bash
# Session 77, call 6 (carry .variants/head76.so.xz + this file): NVFP4 at M = 1 on this GPU, the checkpoint-layout
# GEMV against the tiled one (nvfp4_plain_wins was measured on an H100; lowbit bench put NVFP4 at 1.3-1.45x kbit4's
# time on large shapes here); the tuner's CLI test on its cheaper copies; the tuner on the real models' shapes.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/head76.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
timeout 70 python3 benchmarks/tools/nvfp4_m1_paths.py --preset llama-3-8b --preset llama-3-70b --preset qwen3-coder-next \
  > "$OUT/nvfp4_m1_paths.txt" 2>&1
echo "nvfp4 exit $? at $(( $(date +%s) - start )) s"; cat "$OUT/nvfp4_m1_paths.txt"
timeout 60 python3 -m pytest -m gpu -p no:cacheprovider -q tests/gpu/test_kbit_gemv_gpu.py -k tune_kbit_gemv > "$OUT/cli_test.log" 2>&1
echo "cli test exit $? at $(( $(date +%s) - start )) s"; tail -1 "$OUT/cli_test.log"
timeout 80 python3 -m lowbit tune --kbit-gemv --preset real-shapes --out lowbit/data/kbit_dispatch.json > "$OUT/tune_real_shapes.txt" 2>&1
echo "tune exit $? at $(( $(date +%s) - start )) s"; tail -1 "$OUT/tune_real_shapes.txt"
cp lowbit/data/kbit_dispatch.json "$OUT/"
