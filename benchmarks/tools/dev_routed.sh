#!/usr/bin/env bash
# One device call for an MoE-step A/B: GPU tests (TESTS: pytest node ids / paths, no spaces; default the routed
# GEMV's), then Qwen3-30B-A3B-shaped decode (8 layers) at batch 1 and 4, rows with and without one
# `e2e_gpu.py` switch A (default @no-routed): variants B1 / B4 override the rows. NO_E2E=1: tests only.
#   A=qk-norm-modules bash benchmarks/tools/dev_routed.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 --tb=short ${TESTS:-tests/gpu/test_kbit_gemv_gpu.py -k routed} \
  > $OUT/tests.log 2>&1
grep -E "^(E  |FAILED|ERROR)|passed|failed" $OUT/tests.log | head -40
[ -n "${NO_E2E:-}" ] && exit 0
run() { tag=$1; shift; timeout 200 python3 benchmarks/e2e_gpu.py "$@" --out $OUT/$tag.json 2>&1 | grep -E "tok/s|===|Error|error" | tee $OUT/$tag.log; }
A=${A:-no-routed}  # the other row of the A/B
run qwen3_b1 --model qwen3-30b-a3b --layers 8 --batch 1 --variants ${B1:-bf16,kbit4+fuse@$A,kbit4+fuse,kbit4+fuse@$A,kbit4+fuse}
run qwen3_b4 --model qwen3-30b-a3b --layers 8 --batch 4 --variants ${B4:-bf16,kbit4+fuse@$A,kbit4+fuse}
