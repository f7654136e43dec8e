#!/usr/bin/env bash
# A/B(/C...) of built libraries carried xz-compressed as .variants/<NAME>.so.xz (two uncompressed libraries do
# not fit the device's 64 MiB carry), in one device call: TESTS (pytest args) run on each library named in
# TEST_LIBS (default: the last), then CMD (a command line; $LIB names the library) once per library in name
# order, ROUNDS times (default 2). Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
names=$(python3 -c "
import lzma, shutil, pathlib
for p in sorted(pathlib.Path('.variants').glob('*.so.xz')):
    n = p.name[:-len('.so.xz')]
    with lzma.open(p) as f, open(f'/tmp/{n}.so', 'wb') as g:
        shutil.copyfileobj(f, g)
    print(n)
")
echo "libraries: $names" | tee "$OUT/ab.txt"
if [[ -n ${TESTS:-} ]]; then
    for n in ${TEST_LIBS:-${names##*$'\n'}}; do
        LOWBIT_LIBRARY=/tmp/$n.so timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 6 --tb=short $TESTS > "$OUT/tests_$n.log" 2>&1
        echo "== tests on $n"; grep -E "^(E  |FAILED|ERROR)|passed|failed" "$OUT/tests_$n.log" | head -30
    done
fi
for round in $(seq "${ROUNDS:-2}"); do
    for n in $names; do
        echo "== $n round $round" | tee -a "$OUT/ab.txt"
        LIB=/tmp/$n.so LOWBIT_LIBRARY=/tmp/$n.so bash -c "$CMD" 2>&1 | grep -v "it/s\]" | tee -a "$OUT/ab.txt"
    done
done
