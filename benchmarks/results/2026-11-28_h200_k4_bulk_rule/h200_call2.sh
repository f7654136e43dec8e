#!/usr/bin/env bash
# call 2 (H200): the step profiled at K = 4 / 3 beside bf16 and torch int4, and the kbit GEMVs alone
# (every kernel, M = 1, with PDL) on Llama-3-8B's shapes and 8192 -> 29568.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/final74c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
timeout 170 python3 benchmarks/gemv_sweep.py --bits 2,3,4 --m 1 --no-warps --no-streamk --bulk --pdl --peers \
  --shapes 4096x6144,4096x4096,4096x28672,14336x4096,8192x29568 > "$OUT/sweep.txt" 2>&1
echo "sweep exit $? at $(( $(date +%s) - start )) s"
mkdir -p /tmp/tr
timeout $(( 560 - ($(date +%s) - start) )) python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 \
  --variants kbit4+fuse,kbit3+fuse,bf16,torch-int4,kbit2+fuse --profile kbit4+fuse,kbit3+fuse --profile-graph \
  --trace-dir /tmp/tr --out "$OUT/b1.json" > "$OUT/b1.log" 2>&1
echo "e2e exit $? at $(( $(date +%s) - start )) s"; grep -E "tok/s|Error" "$OUT/b1.log"
for v in kbit4_fuse kbit3_fuse; do
  [ -f /tmp/tr/$v.trace.json ] && python3 benchmarks/tools/step_trace.py /tmp/tr/$v.trace.json --critical decode_attention > "$OUT/critical_$v.txt" 2>&1
  [ -f /tmp/tr/$v.trace.json ] && python3 benchmarks/tools/step_trace.py /tmp/tr/$v.trace.json --top 25 > "$OUT/top_$v.txt" 2>&1
done
cat "$OUT"/critical_*.txt 2>/dev/null | head -60
