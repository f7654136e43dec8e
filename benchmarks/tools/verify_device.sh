#!/usr/bin/env bash
# One device call that re-checks a library built here and carried:
#   LIB=.lowbit_cache/liblowbit-<key>.so [SUITE=1] [ROWS="tag:e2e_gpu.py args;..."] bash benchmarks/tools/verify_device.sh
# SUITE: the whole GPU suite (6 workers); ROWS: e2e_gpu.py calls, each logged as $OUT/<tag>.{log,json}.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
export LOWBIT_LIBRARY=$PWD/${LIB:?the library to load, as carried}
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
if [ -n "${SUITE:-}" ]; then
  timeout 260 python3 -m pytest -m gpu tests -n 6 -q -p no:cacheprovider > "$OUT/gpu_suite.log" 2>&1
  echo "suite exit $?"; tail -n 2 "$OUT/gpu_suite.log"; grep -E "^FAILED|^ERROR" "$OUT/gpu_suite.log" | head
fi
IFS=';' read -ra rows <<< "${ROWS:-}"
for row in "${rows[@]}"; do
  tag=${row%%:*}; args=${row#*:}
  # shellcheck disable=SC2086
  timeout "${ROW_TIMEOUT:-300}" python3 benchmarks/e2e_gpu.py $args --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1
  echo "$tag exit $?"; grep -E "tok/s|Error" "$OUT/$tag.log"
done
