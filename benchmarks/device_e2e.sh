#!/usr/bin/env bash
# One device call of end-to-end measurements (issue 12). Carry .lowbit_cache (prebuilt library).
#   E2E="llama-3-8b:1::bf16,kbit4 glm-4.7-flash:1:24:bf16,kbit4"  (model:batch:layers:variants[:extra args])
#   TESTS=1 runs the GPU model tests first; SMOL=1 runs `lowbit generate --compare` on SmolLM2 (the GGUF
#   assembled from .smol1/ .smol2/ .smol3/, thirds carried by three calls: the file is over one call's limit).
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache}
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
python3 -m lowbit build --arch sm_90a 2>&1 | tail -1
if [[ -n ${TESTS:-} ]]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider ${TESTS_ARGS:-tests} 2>&1 | tail -15 | tee "$OUT/tests.log"
fi
for spec in ${E2E:-}; do
  IFS=: read -r model batch layers variants extra <<<"$spec"
  tag=${model}_b${batch}${layers:+_l$layers}${extra:+_$(echo "$extra" | tr -c 'a-z0-9' _)}
  python3 benchmarks/e2e_gpu.py --model "$model" --batch "$batch" ${layers:+--layers $layers} --variants "$variants" \
    --profile "${PROFILE:-kbit4,bf16}" --out "$OUT/e2e_$tag.json" ${extra//,/ } 2>&1 \
    | grep -v "it/s\]\|falling back" | tee "$OUT/e2e_$tag.log"
done
if [[ -n ${SMOL:-} ]]; then
  mkdir -p "$LOWBIT_CACHE_DIR/models"
  cat ${SMOL_PARTS:-.smol1/part.* .smol2/part.* .smol3/part.*} > "$LOWBIT_CACHE_DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  sha256sum "$LOWBIT_CACHE_DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf" | tee "$OUT/smol.log"
  for args in "--compare" "--compare --compile"; do
    echo "== lowbit generate $args" | tee -a "$OUT/smol.log"
    /usr/bin/time -f "wall %e s" python3 -m lowbit generate $args 2>&1 | grep -v "it/s\]" | tee -a "$OUT/smol.log"
  done
fi
