#!/usr/bin/env bash
# Session 77, call 3 (carry .variants/head76.so.xz + this file; the Python tree as committed with the picks):
# the touched GPU tests; lowbit bench (plain M = 1 calls) on the rules; `lowbit tune --kbit-gemv` into the shipped
# crossover file; lowbit bench again on its picks.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
LIB=.variants/head76.so.xz TESTS_TIMEOUT=200 \
TESTS='tests/gpu/test_kbit_gemv_gpu.py -k picks_choose|tune_kbit_gemv|bulk_gemv_refuses|bulk_gemv_poisoned' \
  bash benchmarks/tools/verify_device.sh
echo "tests done at $(( $(date +%s) - start )) s"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
B="--preset llama-3-8b --preset llama-3-70b --preset qwen3-coder-next --preset glm-4.7-flash --m 1 --methods lowbit-kbit2,lowbit-kbit3,lowbit-kbit4 --no-moe --no-hot --no-plots"
timeout 120 python3 -m lowbit bench $B --out "$OUT/bench_rules" > "$OUT/bench_rules.txt" 2>&1; echo "bench rules exit $? at $(( $(date +%s) - start )) s"
timeout 330 python3 -m lowbit tune --kbit-gemv --out lowbit/data/kbit_dispatch.json > "$OUT/tune_kbit_gemv.txt" 2>&1
echo "tune exit $? at $(( $(date +%s) - start )) s"; tail -3 "$OUT/tune_kbit_gemv.txt"; grep -- "->" "$OUT/tune_kbit_gemv.txt"
cp lowbit/data/kbit_dispatch.json "$OUT/"
timeout 120 python3 -m lowbit bench $B --out "$OUT/bench_picks" > "$OUT/bench_picks.txt" 2>&1; echo "bench picks exit $? at $(( $(date +%s) - start )) s"
tail -40 "$OUT/bench_picks.txt"
