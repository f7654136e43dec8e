#!/usr/bin/env bash
# One device call (library built here and carried in .lowbit_cache): the decode-attention grid plan and the
# EARLY K/V loads (benchmarks/journal/2026-11-25_attention_grid_at_batch_4.md).
#   1. the attention GPU tests (both EARLY settings, the occupancy the plan reads);
#   2. the plan against the old one alone: batch 4, batch 8, a 4096-position cache (the default row is the
#      plan, "chunk 128, 1 head splits" the old choice);
#   3. warp_sum8 against the one-score-at-a-time reduction (--reduce-each), alone;
#   4. Llama-3-8B end to end: batch 4, batch 1, then kbit4 at batch 1 with --reduce-each and with --early-kv.
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
  for args in "--batch 1" "--batch 4"; do  # warp_sum8 against the reduction it replaced
    echo "== attn_decode_bench.py $args --reduce-each"
    timeout 60 python3 benchmarks/tools/attn_decode_bench.py $args --reduce-each 2>&1 | grep lowbit
  done
  echo "== e2e batch 4"
  timeout 200 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 --variants bf16,kbit4+fuse \
      --out "$OUT/e2e_b4.json" 2>&1 | grep -E "===|tok/s"
  echo "== e2e batch 1"
  timeout 200 python3 benchmarks/e2e_gpu.py --model llama-3-8b --variants bf16,kbit4+fuse \
      --out "$OUT/e2e_b1.json" 2>&1 | grep -E "===|tok/s"
  for opt in --reduce-each --early-kv; do
    echo "== e2e batch 1, kbit4 $opt"
    timeout 150 python3 benchmarks/e2e_gpu.py --model llama-3-8b --variants kbit4+fuse $opt \
        --out "$OUT/e2e_b1_${opt#--}.json" 2>&1 | grep -E "===|tok/s"
  done
} 2>&1 | tee "$OUT/attention_plan_device.log"
