#!/usr/bin/env bash
# Session 77, call 5 (carry .variants/head76.so.xz + this file): the H200's picks for the real models' shapes too
# (`--preset real-shapes`, merged into the shipped file), then the NVFP4 and M = 16 targets on this GPU:
# kbit4, NVFP4 and cuBLAS fp16 at M = 1, 4, 16, 64 on the four seed presets (MoE blocks included).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/head76.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
timeout 120 python3 -m lowbit tune --kbit-gemv --preset real-shapes --out lowbit/data/kbit_dispatch.json > "$OUT/tune_real_shapes.txt" 2>&1
echo "tune exit $? at $(( $(date +%s) - start )) s"; tail -1 "$OUT/tune_real_shapes.txt"; grep -- "->" "$OUT/tune_real_shapes.txt"
cp lowbit/data/kbit_dispatch.json "$OUT/"
timeout 280 python3 -m lowbit bench --preset llama-3-8b --preset llama-3-70b --preset qwen3-coder-next --preset glm-4.7-flash \
  --m 1,4,16,64 --methods lowbit-kbit4,lowbit-nvfp4,cublas-fp16 --no-hot --no-plots --out "$OUT/bench_nvfp4_m16" \
  > "$OUT/bench_nvfp4_m16.txt" 2>&1
echo "bench exit $? at $(( $(date +%s) - start )) s"
