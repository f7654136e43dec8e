#!/usr/bin/env bash
# Second call of the next session (carry .variants/final74c.so.xz and this file): the other end-to-end
# targets on this GPU (so far measured on an H100 only): Llama-3-8B batch 4 and Qwen3-30B-A3B batch 1 beside bf16,
# then kbit3's down_proj on the bulk kernel (@bulk-large) against the split kernel, alternated in one process.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/final74c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
row() {  # tag, seconds, e2e_gpu.py args
  local tag=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/e2e_gpu.py "$@" --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1
  echo "$tag exit $? at $(( $(date +%s) - start )) s"; grep -E "^===|tok/s|Error" "$OUT/$tag.log"
}
row b4_8b 150 --model llama-3-8b --batch 4 --variants bf16,kbit4+fuse
row b1_qwen 200 --fresh --model qwen3-30b-a3b --batch 1 --variants bf16,kbit4+fuse
row k3_bulk 200 --model llama-3-8b --batch 1 --variants kbit3+fuse,kbit3+fuse@bulk-large,kbit3+fuse@bulk-large,kbit3+fuse
