#!/usr/bin/env bash
# One device call for the bulk-copy GEMV (csrc/tiled/bulk_gemv.cuh), the library built here and carried:
#   LIB=.lowbit_cache/liblowbit-<key>.so [TESTS=1] [ROUNDS=2] [SHAPES=...] [BITS=2,4] bash benchmarks/tools/bulk_device.sh
# TESTS: the kbit GEMV and layer GPU tests first (every dense test also through the bulk kernel: conftest's
# dense_path); then gemv_sweep.py --bulk, ROUNDS times, logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
export LOWBIT_LIBRARY=$PWD/${LIB:?the library to load, as carried}
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  timeout 330 python3 -m pytest -m gpu -n 4 -q -p no:cacheprovider tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_layers_gpu.py > "$OUT/pytest.log" 2>&1
  echo "pytest exit $?"; tail -3 "$OUT/pytest.log"
fi
for r in $(seq 1 "${ROUNDS:-1}"); do
  timeout 280 python3 benchmarks/gemv_sweep.py --bits "${BITS:-2,4,5}" --m 1 --no-warps --no-streamk --bulk \
    --shapes "${SHAPES:-8192x29568,28672x8192,4096x28672,4096x14336,14336x4096,4096x6144,8192x10240,2048x10240,4096x128256}" > "$OUT/sweep_$r.txt" 2>&1
  echo "sweep $r exit $?"; cat "$OUT/sweep_$r.txt"
done
