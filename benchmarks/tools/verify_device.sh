#!/usr/bin/env bash
# One device call that re-checks a library built here and carried:
#   LIB=.lowbit_cache/liblowbit-<key>.so[.xz] [SUITE=1 | TESTS="pytest args" [TESTS_K="a -k expression"]]
#   [SWEEP="gemv_sweep.py args"]
#   [ROWS="tag:e2e_gpu.py args;..."] bash benchmarks/tools/verify_device.sh
# SUITE: the whole GPU suite (6 workers; 380 s on an H200 with 1,519 tests, 2026-11-28; SUITE_TIMEOUT,
# default 560); TESTS: some of it (TESTS_TIMEOUT, default 260; TESTS is split on spaces, so a -k expression with
# spaces goes in TESTS_K); both logged with -v, each finished test by name;
# SWEEP: benchmarks/gemv_sweep.py ($OUT/sweep.txt);
# ROWS: e2e_gpu.py calls, each logged as $OUT/<tag>.{log,json}.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=$PWD/.lowbit_cache PYTHONPATH=$PWD
export LOWBIT_LIBRARY=$PWD/${LIB:?the library to load, as carried}
if [[ $LOWBIT_LIBRARY == *.xz ]]; then  # carried compressed (tracked files + a library can pass the 64 MiB carry)
  xz -dc "$LOWBIT_LIBRARY" > /tmp/liblowbit.so && export LOWBIT_LIBRARY=/tmp/liblowbit.so
fi
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
if [ -n "${SUITE:-}" ]; then
  # -v: every finished test by name, so a run the timeout stops still says which tests never finished
  timeout "${SUITE_TIMEOUT:-560}" python3 -m pytest -m gpu tests -n 6 -v -p no:cacheprovider > "$OUT/gpu_suite.log" 2>&1
  echo "suite exit $?"; tail -n 2 "$OUT/gpu_suite.log"; grep -E "^FAILED|^ERROR| FAILED | ERROR " "$OUT/gpu_suite.log" | head
  grep -cE " (PASSED|SKIPPED|FAILED|ERROR|XFAIL|XPASS) " "$OUT/gpu_suite.log" | sed 's/^/tests finished: /'
fi
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${TESTS_TIMEOUT:-260}" python3 -m pytest -m gpu -n 6 -v -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} $TESTS \
    > "$OUT/gpu_tests.log" 2>&1
  echo "tests exit $?"; tail -n 2 "$OUT/gpu_tests.log"; grep -E "^FAILED|^ERROR| FAILED | ERROR " "$OUT/gpu_tests.log" | head
fi
if [ -n "${SWEEP:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${SWEEP_TIMEOUT:-200}" python3 benchmarks/gemv_sweep.py $SWEEP > "$OUT/sweep.txt" 2>&1
  echo "sweep exit $?"; grep -E "bulk|bandwidth|Error" "$OUT/sweep.txt"
fi
IFS=';' read -ra rows <<< "${ROWS:-}"
for row in "${rows[@]}"; do
  tag=${row%%:*}; args=${row#*:}
  # shellcheck disable=SC2086
  timeout "${ROW_TIMEOUT:-300}" python3 benchmarks/e2e_gpu.py $args --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1
  echo "$tag exit $?"; grep -E "tok/s|Error" "$OUT/$tag.log"
done
