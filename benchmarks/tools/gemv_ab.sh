#!/usr/bin/env bash
# A/B of built libraries on the GEMV sweep, in one device call (same card, each library in turn):
#   LIBS="A=/path/liblowbit-old.so B=/path/liblowbit-new.so" bash benchmarks/tools/gemv_ab.sh
# Carry the libraries (xz-compressed if two do not fit the 64 MiB carry). Optional: TESTS="pytest args",
# run first with the last library; SHAPES, MS (token counts), BITS for the sweep. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
last=${LIBS##*=}
if [[ -n ${TESTS:-} ]]; then
    LOWBIT_LIBRARY=$last python3 -m pytest -q -p no:cacheprovider $TESTS 2>&1 | tail -4 | tee "$OUT/tests.log"
fi
SHAPES=${SHAPES:-4096x6144,4096x4096,4096x28672,14336x4096,8192x10240,28672x8192,8192x29568}
for m in ${MS:-1 4}; do
    for spec in $LIBS; do
        echo "== ${spec%%=*} (${spec#*=}) M=$m" | tee -a "$OUT/sweep.txt"
        LOWBIT_LIBRARY=${spec#*=} python3 benchmarks/gemv_sweep.py --bits "${BITS:-4}" --m "$m" --no-warps \
            --shapes "$SHAPES" 2>&1 | tee -a "$OUT/sweep.txt"
    done
done
