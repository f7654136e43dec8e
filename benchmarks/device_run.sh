#!/usr/bin/env bash
# One device call: GPU tests, memcheck, and benchmarks; everything lands in $OUT (one log, one tarball).
# Usage (repo root, on the GPU machine): bash benchmarks/device_run.sh [bench args for an extra run...]
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache}
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"; LOG=$OUT/run.log
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{
  echo "== env (commit ${LOWBIT_GIT_COMMIT:-unknown})"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "== build"; python3 -m lowbit build --arch sm_90a
  if [ -n "${SKIP_TESTS:-}" ]; then echo "== tests skipped (SKIP_TESTS)"; else
  echo "== gpu tests"; python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -25
  echo "== memcheck"; compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_kbit_dequant_gpu.py -k "poisoned and (float16 or bfloat16)" 2>&1 | tail -4
  compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_kbit_gemv_gpu.py -k "poisoned or grouped_all or grouped_many_active or misaligned or long_k" 2>&1 | tail -4
  compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_dense_gemv_gpu.py -k "poisoned or misaligned or chain" 2>&1 | tail -4
  echo "== dequant bandwidth"; python3 benchmarks/tools/dequant_bw.py 2>&1
  fi
} 2>&1 | tee "$LOG"
mkdir -p "$OUT/results"
for spec in "$@"; do
  echo "== bench $spec" | tee -a "$LOG"
  start=$(date +%s)
  # shellcheck disable=SC2086
  python3 -m lowbit bench $spec 2>&1 | tee -a "$LOG"
  echo "wall: $(( $(date +%s) - start )) s" | tee -a "$LOG"
done
cp -r benchmarks/results/* "$OUT/results/" 2>/dev/null
tar -C "$OUT" -czf "$OUT/results.tar.gz" results && rm -rf "$OUT/results"
