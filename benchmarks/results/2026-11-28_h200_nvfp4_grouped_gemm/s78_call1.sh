#!/usr/bin/env bash
# First call of the next session (carry .variants/head76.so.xz = liblowbit-76b1f1ea1313504c, the csrc of this tree,
# and this file): the whole GPU suite on the final tree of 2026-11-28_gemv_picks.md, whose format-keyed picks
# (NVFP4's too) and renamed tuner never ran on a GPU; then NVFP4 against kbit4 at M = 1 through the shipped picks
# (predicted <= 1.09x on the H200's large shapes).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
LIB=.variants/head76.so.xz SUITE=1 SUITE_TIMEOUT=400 bash benchmarks/tools/verify_device.sh
grep -E "picks|tune_gemv" "$OUT/gpu_suite.log" | grep -E "PASSED|FAILED|ERROR" | head
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
timeout 120 python3 -m lowbit bench --preset llama-3-8b --preset llama-3-70b --preset qwen3-coder-next \
  --m 1 --methods lowbit-kbit4,lowbit-nvfp4 --no-moe --no-hot --no-plots --out "$OUT/bench_nvfp4_picks" \
  > "$OUT/bench_nvfp4_picks.txt" 2>&1
echo "bench exit $?"; tail -25 "$OUT/bench_nvfp4_picks.txt"
