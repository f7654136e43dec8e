#!/usr/bin/env bash
# Session 76, call 3 (H200): where batch 4 goes. The step profiled (kbit4 fused, bf16) and the M = 4 kernels alone on
# Llama-3-8B's shapes: every GEMV kernel (with PDL) and the GEMM paths beside cuBLAS.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/final74c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
SH=4096x6144,4096x4096,4096x28672,14336x4096
timeout 120 python3 benchmarks/gemv_sweep.py --bits 3,4 --m 4 --no-warps --pdl --peers --shapes $SH > "$OUT/sweep_m4.txt" 2>&1
echo "sweep exit $? at $(( $(date +%s) - start )) s"
timeout 120 python3 benchmarks/gemm_sweep.py --bits 4 --m 1,2,4,8,16 --shapes $SH > "$OUT/gemm_m4.txt" 2>&1
echo "gemm exit $? at $(( $(date +%s) - start )) s"
mkdir -p /tmp/tr
timeout $(( 560 - ($(date +%s) - start) )) python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 \
  --variants kbit4+fuse,bf16,kbit3+fuse --profile kbit4+fuse,bf16 --profile-graph \
  --trace-dir /tmp/tr --out "$OUT/b4.json" > "$OUT/b4.log" 2>&1
echo "e2e exit $? at $(( $(date +%s) - start )) s"; grep -E "tok/s|Error" "$OUT/b4.log"
for v in kbit4_fuse bf16; do
  [ -f /tmp/tr/$v.trace.json ] && python3 benchmarks/tools/step_trace.py /tmp/tr/$v.trace.json --critical decode_attention > "$OUT/critical_$v.txt" 2>&1
  [ -f /tmp/tr/$v.trace.json ] && python3 benchmarks/tools/step_trace.py /tmp/tr/$v.trace.json --top 25 > "$OUT/top_$v.txt" 2>&1
done
cat "$OUT/critical_kbit4_fuse.txt" 2>/dev/null | head -40
