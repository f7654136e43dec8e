#!/usr/bin/env bash
# First call of the next session: the shipped tuning files list only the H100, so an H200 runs lowbit's generic
# defaults (kbit GEMM up to M = 32 on every shape, the grouped GEMM from 16 rows per expert, the dense GEMV's
# heuristic). Measure this GPU's entries into copies of the shipped files ($OUT), to be committed if they differ.
# Before them, the plain-call sweep on this GPU. Needs the committed library: carry .variants/final74c.so.xz (liblowbit-df7e53fc0a350116, still HEAD's csrc).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/final74c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_decode_formats_gpu.py -k untuned \
  > "$OUT/untuned_test.log" 2>&1; echo "untuned-note test exit $?"; tail -1 "$OUT/untuned_test.log"
# the plain-call rule (tiled.bulk_rule) was measured on an H100 before the relay: every kernel on the presets'
# shapes of >= 8M weights, M = 1, cold, two rounds, as that rule's sweep was
for r in 1 2; do timeout 100 python3 benchmarks/gemv_sweep.py --bits 2,3,4 --m 1 --no-warps --no-streamk --bulk \
  --shapes 2048x4096,2048x5120,5120x2048,4096x4096,2048x10240,10240x2048,2048x12288,14336x4096,4096x14336,8192x8192,28672x8192,8192x28672,4096x28672,4096x6144,8192x29568 > "$OUT/sweep_plain_$r.txt" 2>&1; echo "sweep $r exit $?"; done
cp lowbit/data/kbit_dispatch.json "$OUT/kbit_dispatch.json"; cp lowbit/data/tuning.json "$OUT/tuning.json"
timeout 280 python3 -m lowbit tune --kbit-crossover --out "$OUT/kbit_dispatch.json" > "$OUT/tune_crossover.log" 2>&1
echo "crossover exit $? at $(( $(date +%s) - start )) s"; tail -5 "$OUT/tune_crossover.log"
timeout $(( 570 - ($(date +%s) - start) )) python3 -m lowbit tune --out "$OUT/tuning.json" > "$OUT/tune_gemv.log" 2>&1
echo "gemv tune exit $? at $(( $(date +%s) - start )) s"; tail -3 "$OUT/tune_gemv.log"
