#!/usr/bin/env bash
# Session 77, call 4 (carry .variants/head76.so.xz + this file; the tree with the H200's measured picks shipped):
# every GPU test of the kbit GEMV file and the dispatch tests' GPU side; then Llama-3-8B b1 (K = 2, 3, 4) and b4 kbit2
# (BULK_LAYER_MAX_M now {2: 4, 4: 4}) to check that the decode steps did not move.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/head76.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
timeout 240 python3 -m pytest -m gpu -n 6 -v -p no:cacheprovider tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_layers_gpu.py \
  > "$OUT/gpu_tests.log" 2>&1
echo "tests exit $? at $(( $(date +%s) - start )) s"; tail -n 2 "$OUT/gpu_tests.log"; grep -E "^FAILED|^ERROR| FAILED | ERROR " "$OUT/gpu_tests.log" | head
timeout 200 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants kbit4+fuse,kbit3+fuse,kbit2+fuse \
  --out "$OUT/b1.json" > "$OUT/b1.log" 2>&1
echo "b1 exit $? at $(( $(date +%s) - start )) s"; grep -E "tok/s|Error" "$OUT/b1.log"
timeout 120 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 --variants bf16,kbit2+fuse \
  --out "$OUT/b4.json" > "$OUT/b4.log" 2>&1
echo "b4 exit $? at $(( $(date +%s) - start )) s"; grep -E "tok/s|Error" "$OUT/b4.log"
