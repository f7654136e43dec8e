#!/usr/bin/env bash
# A/B of two built libraries carried xz-compressed as .variants/A.so.xz and .variants/B.so.xz (two uncompressed
# libraries do not fit the device's 64 MiB carry), in one device call: TESTS (pytest args) run on B, then CMD
# (a command line; $LIB names the library) once per library, A then B, twice. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "
import lzma, shutil
for n in 'AB':
    with lzma.open(f'.variants/{n}.so.xz') as f, open(f'/tmp/{n}.so', 'wb') as g:
        shutil.copyfileobj(f, g)
"
if [[ -n ${TESTS:-} ]]; then
    LOWBIT_LIBRARY=/tmp/B.so timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 --tb=short $TESTS > "$OUT/tests.log" 2>&1
    grep -E "^(E  |FAILED|ERROR)|passed|failed" "$OUT/tests.log" | head -30
fi
for round in 1 2; do
    for n in A B; do
        echo "== $n round $round" | tee -a "$OUT/ab.txt"
        LIB=/tmp/$n.so LOWBIT_LIBRARY=/tmp/$n.so bash -c "$CMD" 2>&1 | grep -v "it/s\]" | tee -a "$OUT/ab.txt"
    done
done
