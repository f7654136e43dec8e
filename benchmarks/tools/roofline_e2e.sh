#!/usr/bin/env bash
# The decode-step tables of the roofline work (benchmarks/journal/2026-11-25_decode_step_pdl_attention.md):
# PART=dense  Llama-3-8B shapes, batch 1 and 4, now (PDL, lowbit decode attention and MoE router) and before
#             (--no-pdl --sdpa-attention --torch-router)
# PART=moe    Qwen3-30B-A3B shapes (8 of 48 layers), batch 1 and 4, now and before
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}
run() {  # tag, e2e args...
  local tag=$1; shift
  python3 benchmarks/e2e_gpu.py "$@" --out "$OUT/$tag.json" 2>&1 | grep -v "it/s\]\|falling back\|Warn\|warn" | tee "$OUT/$tag.log"
}
if [[ ${PART:-dense} == dense ]]; then
  run llama_b1 --model llama-3-8b --batch 1 --variants bf16,torch-int4,kbit4+fuse,kbit4+fuse+lm_head4,kbit3+fuse+lm_head4
  run llama_b4 --model llama-3-8b --batch 4 --variants bf16,kbit4+fuse,kbit4+fuse+lm_head4
  run llama_b4_before --model llama-3-8b --batch 4 --variants bf16,kbit4+fuse --no-pdl --sdpa-attention --torch-router
else
  run qwen3_b1 --model qwen3-30b-a3b --layers 8 --batch 1 --variants bf16,kbit4+fuse,kbit4+fuse+lm_head4
  run qwen3_b4 --model qwen3-30b-a3b --layers 8 --batch 4 --variants bf16,kbit4+fuse
  run qwen3_b1_before --model qwen3-30b-a3b --layers 8 --batch 1 --variants bf16,kbit4+fuse --no-pdl --sdpa-attention --torch-router
  run qwen3_b4_before --model qwen3-30b-a3b --layers 8 --batch 4 --variants bf16,kbit4+fuse --no-pdl --sdpa-attention --torch-router
fi
