#!/usr/bin/env bash
# One device call at the end of a session: PART=1 the whole GPU suite, then Llama-3-8B and Qwen3-30B-A3B
# (8 layers) decode at batch 1; PART=2 both at batch 4. Rows: bf16, kbit4 fused, kbit4 fused + kbit4 head.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
run() { tag=$1; shift; timeout 240 python3 benchmarks/e2e_gpu.py "$@" --out "$OUT/$tag.json" 2>&1 \
          | grep -E "tok/s|===|Error|error" | tee "$OUT/$tag.log"; }
V=bf16,kbit4+fuse,kbit4+fuse+lm_head4
if [[ ${PART:-1} == 1 ]]; then
  timeout 300 python3 -m pytest -m gpu tests -n 6 -q -p no:cacheprovider > "$OUT/gpu_suite.log" 2>&1
  tail -3 "$OUT/gpu_suite.log"; grep -E "^FAILED" "$OUT/gpu_suite.log" | head
  run llama_b1 --model llama-3-8b --batch 1 --variants $V
  run qwen3_b1 --model qwen3-30b-a3b --layers 8 --batch 1 --variants $V
else
  run qwen3_b4 --model qwen3-30b-a3b --layers 8 --batch 4 --variants $V
  run llama_b4 --model llama-3-8b --batch 4 --variants $V
fi
