#!/usr/bin/env bash
# One device call (library built here and carried in .lowbit_cache): the decode-attention grid plan and the
# EARLY K/V loads (benchmarks/journal/2026-11-25_attention_grid_at_batch_4.md).
#   1. the attention GPU tests (both EARLY settings, the occupancy the plan reads);
#   2. the plan against the old one alone: batch 4, batch 8, a 4096-position cache (the default row is the
#      plan, "chunk 128, 1 head splits" the old choice);
#   3. Llama-3-8B end to end: batch 4, then batch 1 with and without EARLY.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/gpu/test_attention_gpu.py > "$OUT/pytest_attention.log" 2>&1
  echo "pytest exit $?"; tail -3 "$OUT/pytest_attention.log"
  for args in "--batch 4" "--batch 8" "--cache 4096"; do
    echo "== attn_decode_bench.py $args --chunks 128 --splits 1"
    timeout 60 python3 benchmarks/tools/attn_decode_bench.py $args --chunks 128 --splits 1 2>&1 | grep lowbit
  done
  echo "== e2e batch 4"
  timeout 200 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 --variants bf16,kbit4+fuse \
      --out "$OUT/e2e_b4.json" 2>&1 | grep -E "===|tok/s"
  for early in no-early-kv early-kv; do
    echo "== e2e batch 1, --$early"
    timeout 200 python3 benchmarks/e2e_gpu.py --model llama-3-8b --variants bf16,kbit4+fuse --$early \
        --out "$OUT/e2e_b1_$early.json" 2>&1 | grep -E "===|tok/s"
  done
} 2>&1 | tee "$OUT/attention_plan_device.log"
