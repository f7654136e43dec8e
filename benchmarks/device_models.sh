#!/usr/bin/env bash
# One device call for the model layer (issue 11): GPU tests (all), memcheck of the module paths,
# model measurements (benchmarks/models_gpu.py), and the wheel installed into a fresh venv.
# Carry: .lowbit_cache (prebuilt library) and dist/ (the wheel, `pip wheel --no-deps . -w dist`).
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache}
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
STEPS=${STEPS:-tests,memcheck,models,wheel}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 -m lowbit build --arch sm_90a
  if [[ $STEPS == *tests* ]]; then
    echo "== gpu tests"; python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -30
  fi
  if [[ $STEPS == *memcheck* ]]; then
    echo "== memcheck (modules)"; compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_models_gpu.py -k "fast_path or on_cuda_matches" 2>&1 | tail -4
  fi
} 2>&1 | tee "$OUT/tests.log"
if [[ $STEPS == *models* ]]; then
  python3 benchmarks/models_gpu.py --out "$OUT/models_gpu.json" ${MODELS_ARGS:-} 2>&1 | grep -v "it/s\]" | tee "$OUT/models.log"
fi
if [[ $STEPS == *wheel* ]]; then
  {
    echo "== wheel installed into a fresh target (the image's torch, lowbit only from the wheel)"
    python3 -m pip install -q --no-index --no-deps --target /tmp/wheel_site dist/lowbit-*.whl
    cp benchmarks/tools/wheel_smoke.py /tmp/wheel_smoke.py
    (cd /tmp && env -u PYTHONPATH PYTHONPATH=/tmp/wheel_site LOWBIT_CACHE_DIR=/tmp/fresh_cache python3 /tmp/wheel_smoke.py)
  } 2>&1 | tee "$OUT/wheel.log"
fi
