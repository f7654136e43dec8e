#!/usr/bin/env bash
# Session 76, call 4 (H200): the bulk-copy GEMV for up to 8 tokens. Its GPU tests, the kernels alone at M = 4, and
# Llama-3-8B b4 with the layers' multi-token calls on it against off it (@bulk-m1), alternated; b1 as a check.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/bulk_m8.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_layers_gpu.py \
  -k "bulk or swiglu or epilogue or pdl_chain or matches_reference" > "$OUT/tests.log" 2>&1
echo "tests exit $? at $(( $(date +%s) - start )) s"; tail -3 "$OUT/tests.log"
timeout 60 python3 benchmarks/gemv_sweep.py --bits 3,4 --m 4 --no-warps --no-streamk --pdl --bulk \
  --shapes 4096x6144,4096x4096,4096x28672,14336x4096 > "$OUT/sweep_m4.txt" 2>&1
echo "sweep exit $? at $(( $(date +%s) - start )) s"; grep -E "bulk|auto" "$OUT/sweep_m4.txt" | head -20
timeout $(( 540 - ($(date +%s) - start) )) python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 \
  --variants kbit4+fuse,kbit4+fuse@bulk-m1,kbit4+fuse,kbit4+fuse@bulk-m1,kbit3+fuse,kbit3+fuse@bulk-m1 --out "$OUT/b4.json" > "$OUT/b4.log" 2>&1
echo "b4 exit $? at $(( $(date +%s) - start )) s"; grep -E "^===|tok/s|Error" "$OUT/b4.log"
