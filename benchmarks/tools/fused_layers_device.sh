#!/usr/bin/env bash
# One device call for the fused decoder layers (lowbit.hf.layers): PART=tests runs the GPU tests the GEMV epilogue
# touches; PART=e2e (default: both) times Llama-3-8B shapes with and without the fused layers in one process
# (BATCH, default 1), alternating; PART=gemv times the GEMVs of this tree against .variants/head (HEAD's Python and
# library, carried xz-compressed) where the epilogue's registers moved spills; PART=e2ehead times VARIANTS_HEAD in
# .variants/head. Logs under $OUT.
#   LOWBIT_LIBRARY=<this tree's library> PART=tests,e2e bash benchmarks/tools/fused_layers_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
PART=${PART:-tests,e2e}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
if [[ ,$PART, == *,tests,* ]]; then
    timeout 360 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short ${TESTS:-tests/gpu/test_layers_gpu.py \
        tests/gpu/test_kbit_gemv_gpu.py tests/gpu/test_nvfp4_gpu.py} > "$OUT/tests.log" 2>&1
    grep -E "^(E  |FAILED|ERROR)|passed|failed" "$OUT/tests.log" | head -40
    grep -qE "[0-9]+ failed|error" "$OUT/tests.log" && { echo "tests failed: no timing"; exit 1; }
fi
if [[ ,$PART, == *,e2e,* ]]; then
    V=${VARIANTS:-bf16,kbit4+fuse@no-fused-layers,kbit4+fuse,kbit4+fuse@no-fused-layers,kbit4+fuse}
    timeout 480 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch "${BATCH:-1}" --variants "$V" \
        --out "$OUT/e2e_b${BATCH:-1}.json" 2>&1 | grep -v "it/s\]" | grep -E "===|tok/s|Error|error" | tee "$OUT/e2e_b${BATCH:-1}.txt"
fi
if [[ ,$PART, == *,e2ehead,* ]]; then  # the same model in .variants/head (HEAD's tree and library), VARIANTS_HEAD
    python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.variants/head/old.so.xz'), open('/tmp/old.so', 'wb'))"
    # its own inductor caches: a cached graph of this tree's ops would be reused with HEAD's (other signatures)
    (cd .variants/head && PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/old.so TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_head \
        TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 timeout 480 python3 benchmarks/e2e_gpu.py \
        --model llama-3-8b --batch "${BATCH:-1}" --variants "${VARIANTS_HEAD:-kbit4+fuse}" --out "$OUT/e2e_head_b${BATCH:-1}.json") \
        2>&1 | grep -v "it/s\]" | grep -E "===|tok/s|Error|error" | tee "$OUT/e2e_head_b${BATCH:-1}.txt"
fi
if [[ ,$PART, == *,gemv,* ]]; then
    python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.variants/head/old.so.xz'), open('/tmp/old.so', 'wb'))"
    S=${SHAPES:-8192x29568,4096x28672,4096x6144}
    for r in $(seq "${ROUNDS:-2}"); do
        for bits in ${BITS:-3 2 4}; do
            echo "== round $r K=$bits HEAD" | tee -a "$OUT/gemv.txt"
            (cd .variants/head && PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/old.so python3 benchmarks/gemv_sweep.py --bits $bits \
                --m 1 --no-warps --no-streamk --shapes "$S") 2>&1 | grep -v "it/s\]" | tee -a "$OUT/gemv.txt"
            echo "== round $r K=$bits this tree" | tee -a "$OUT/gemv.txt"
            python3 benchmarks/gemv_sweep.py --bits $bits --m 1 --no-warps --no-streamk --shapes "$S" 2>&1 \
                | grep -v "it/s\]" | tee -a "$OUT/gemv.txt"
        done
    done
fi
