#!/usr/bin/env bash
# One device call: the GEMV's one-stage-deeper instance (FLAG_DEEP, K = 4) against the default, per kernel,
# on decode shapes at M = 1 and 4 (cold L2), after its bit-equality test. Carry the built library.
#   bash benchmarks/tools/deep_stages_device.sh   (logs under $OUT)
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
python3 -m pytest -q -x tests/gpu/test_kbit_gemv_gpu.py -k deep -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/tests.log"
SHAPES=${SHAPES:-4096x6144,4096x4096,4096x28672,14336x4096,8192x10240,8192x8192,28672x8192,2048x5120,4096x2048,8192x29568}
python3 benchmarks/gemv_sweep.py --deep --bits 4 --m 1 --no-warps --shapes "$SHAPES" 2>&1 | tee "$OUT/sweep_m1.txt"
python3 benchmarks/gemv_sweep.py --deep --bits 4 --m 4 --no-warps --shapes "${SHAPES_M4:-4096x6144,4096x4096,4096x28672,14336x4096}" \
    2>&1 | tee "$OUT/sweep_m4.txt"
