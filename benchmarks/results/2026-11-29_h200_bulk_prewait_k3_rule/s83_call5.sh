#!/usr/bin/env bash
# s83 call 5 (carry .variants/s83h.so.xz, the tree's library): the plain one-token calls' measured picks re-taken on
# the two-stage ring (they were measured with the deeper one): the default presets, then the real models' shapes,
# into the shipped crossover file (copied to $OUT).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
xz -dc .variants/s83h.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
timeout 95 python3 -m lowbit tune --gemv-kernels --out lowbit/data/kbit_dispatch.json > "$OUT/tune_presets.txt" 2>&1
echo "tune presets exit $? at $(el) s"; tail -2 "$OUT/tune_presets.txt"; cp lowbit/data/kbit_dispatch.json "$OUT/kbit_dispatch_after_presets.json"
timeout 80 python3 -m lowbit tune --gemv-kernels --preset real-shapes --out lowbit/data/kbit_dispatch.json > "$OUT/tune_real_shapes.txt" 2>&1
echo "tune real exit $? at $(el) s"; tail -2 "$OUT/tune_real_shapes.txt"; cp lowbit/data/kbit_dispatch.json "$OUT/kbit_dispatch_after_real_shapes.json"
