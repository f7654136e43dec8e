#!/usr/bin/env bash
# Llama-3-8B decode with and without programmatic dependent launch: lowbit's GEMVs (LOWBIT_PDL) and
# inductor's Triton glue (TORCHINDUCTOR_ENABLE_PDL), one process each, Chrome traces of graph replays.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}
python3 -c "import torch._inductor.config as c; print('inductor has enable_pdl:', hasattr(c.triton, 'enable_pdl'))"
run() {
  local tag=$1 variants=$2; shift 2
  mkdir -p "$OUT/$tag"
  env "$@" python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants "$variants" --profile "$variants" \
    --profile-graph --trace-dir "$OUT/$tag" --out "$OUT/e2e_$tag.json" 2>&1 | grep -v "it/s\]\|falling back" | tee "$OUT/$tag.log"
}
run base kbit4+fuse X=1
run pdl kbit4+fuse,kbit4+fuse+lm_head4 LOWBIT_PDL=1 TORCHINDUCTOR_ENABLE_PDL=1
run inductor_pdl kbit4+fuse TORCHINDUCTOR_ENABLE_PDL=1
