#!/usr/bin/env bash
# One device call, parts chosen by PART (comma list), logs under $OUT:
#   suite    the whole GPU test suite (pytest -m gpu -n 8)
#   tests    TESTS only (default: the epilogue and NVFP4 files)
#   headbench  the lm_head shapes (HEAD_SHAPES) cold, cuBLAS against lowbit's dense GEMV, M = 1..4
#   tune     lowbit tune on HEAD_SHAPES into $LOWBIT_TUNING_FILE (default $OUT/tuning.json), then headbench again
#   e2e      benchmarks/e2e_gpu.py --model $MODEL --batch $BATCH --variants $VARIANTS
#   attn     benchmarks/tools/attn_decode_bench.py at batch 1 and 4 (ATTN_BATCHES, ATTN_ARGS)
#   libab    LIBS="A=<a.so.xz> B=<b.so.xz>": the same e2e rows (VARIANTS) with each library, alternating processes
#   runs     RUNS="<batch>:<variants>[:<args>];..." one e2e_gpu.py process each (E2E_LIMIT seconds)
#   LOWBIT_LIBRARY=<built library> PART=suite,tune,e2e VARIANTS=... bash benchmarks/tools/session_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
export LOWBIT_TUNING_FILE=${LOWBIT_TUNING_FILE:-$OUT/tuning.json}
PART=${PART:-tests}
HEAD_SHAPES=${HEAD_SHAPES:-4096x128256}
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$OUT/device.txt"
has() { [[ ,$PART, == *,$1,* ]]; }
if has suite; then
    SECONDS=0
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short tests > "$OUT/gpu_suite.log" 2>&1
    echo "suite: ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_suite.log" | tail -20
    grep -qE "[0-9]+ failed|[0-9]+ error" "$OUT/gpu_suite.log" && { echo "suite failed: no timing"; exit 1; }
fi
if has tests; then
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short ${TESTS:-tests/gpu/test_layers_gpu.py \
        tests/gpu/test_nvfp4_gpu.py} > "$OUT/tests.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -20
    grep -qE "[0-9]+ failed|[0-9]+ error" "$OUT/tests.log" && { echo "tests failed: no timing"; exit 1; }
fi
headbench() {  # $1: tag
    local args=(); for s in ${HEAD_SHAPES//,/ }; do args+=(--shape "$s"); done
    timeout 240 python3 -m lowbit bench "${args[@]}" --m 1,2,3,4 --methods cublas-bf16,lowbit-bf16 --no-hot \
        --out "$OUT/headbench_$1" 2>&1 | grep -v "it/s\]" | tail -30 | tee "$OUT/headbench_$1.txt"
}
has headbench && headbench untuned
if has tune; then
    args=(); for s in ${HEAD_SHAPES//,/ }; do args+=(--shape "$s"); done
    SECONDS=0
    timeout 300 python3 -m lowbit tune "${args[@]}" --dtype bf16 --m 1,2,3,4 --out "$LOWBIT_TUNING_FILE" 2>&1 \
        | grep -v "it/s\]" | tail -20 | tee "$OUT/tune.txt"
    echo "tune: ${SECONDS}s"
    headbench tuned
fi
if has e2e; then
    timeout ${E2E_LIMIT:-420} python3 benchmarks/e2e_gpu.py --model "${MODEL:-llama-3-8b}" --batch "${BATCH:-1}" \
        --variants "${VARIANTS:-bf16,kbit4+fuse,kbit4+fuse+dense_head}" --out "$OUT/e2e_${TAG:-b${BATCH:-1}}.json" 2>&1 \
        | grep -v "it/s\]" | grep -E "===|tok/s|Error|error" | tee "$OUT/e2e_${TAG:-b${BATCH:-1}}.txt"
fi
if has runs; then  # RUNS="<batch>:<variants>[:<more e2e_gpu.py args>];..." each its own process, in order
    IFS=';' read -ra runs <<< "${RUNS:?RUNS=<batch>:<variants>;...}"
    i=0
    for r in "${runs[@]}"; do
        i=$((i + 1)); b=${r%%:*}; v=${r#*:}; extra=""
        if [[ $v == *:* ]]; then extra=${v#*:}; v=${v%%:*}; fi
        echo "--- run $i: batch $b $v $extra" | tee -a "$OUT/runs.txt"
        timeout ${E2E_LIMIT:-300} python3 benchmarks/e2e_gpu.py --model "${MODEL:-llama-3-8b}" --batch "$b" --variants "$v" $extra \
            --out "$OUT/e2e_run${i}_b$b.json" 2>&1 | grep -v "it/s\]" | grep -E "===|tok/s|Error|error" \
            | tee "$OUT/e2e_run${i}_b$b.txt"
    done
fi
if has attn; then  # decode attention alone, batch 1 and 4 (ATTN_ARGS: more attn_decode_bench.py options)
    for b in ${ATTN_BATCHES:-1 4}; do
        timeout 120 python3 benchmarks/tools/attn_decode_bench.py --batch "$b" ${ATTN_ARGS:-} 2>&1 | grep -v "it/s\]" \
            | tee "$OUT/attn_b$b.txt"
    done
fi
if has libab; then  # the same e2e row with two libraries (LIBS="A=<file.so.xz> B=<file.so.xz>"), alternating processes
    declare -A lib
    for kv in ${LIBS:?LIBS=\"A=path.so.xz B=path.so.xz\"}; do
        k=${kv%%=*}; lib[$k]=/tmp/lib_$k.so
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "${kv#*=}" "${lib[$k]}"
    done
    for b in ${AB_BATCHES:-1 4}; do
        for r in $(seq "${ROUNDS:-2}"); do
            for k in $(echo "${!lib[@]}" | tr ' ' '\n' | sort); do
                echo "--- batch $b round $r library $k" | tee -a "$OUT/libab.txt"
                LOWBIT_LIBRARY=${lib[$k]} TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$k timeout ${E2E_LIMIT:-150} python3 \
                    benchmarks/e2e_gpu.py --model "${MODEL:-llama-3-8b}" --batch "$b" --variants "${VARIANTS:-kbit4+fuse}" \
                    --out "$OUT/libab_b${b}_r${r}_$k.json" 2>&1 | grep -E "tok/s|Error" | tee -a "$OUT/libab.txt"
            done
        done
    done
fi
