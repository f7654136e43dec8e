#!/usr/bin/env bash
# Issue 13's closing measurements in one device call (H100; library built here and carried in
# .lowbit_cache): the GEMM crossover tuner, every dense path beside cuBLAS / torch int4, the MoE
# grouped paths beside cuBLAS, the bench columns per path on a preset, then the GPU suite and the
# sanitizers on the GEMM kernels. Everything lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
  echo "== tune crossover"; python3 -m lowbit tune --kbit-crossover --shape 14336x4096 --out "$OUT/kbit_dispatch.json" 2>&1 | tail -40
  export LOWBIT_DISPATCH_FILE=$OUT/kbit_dispatch.json
  echo "== gemm sweep"; python3 benchmarks/gemm_sweep.py --shapes 8192x28672,28672x8192,4096x14336,4096x4096 --json "$OUT/gemm_sweep.json"
  echo "== gemm sweep, tiles per warp"; python3 benchmarks/gemm_sweep.py --no-peers --tiles-per-warp \
      --shapes 8192x28672,28672x8192,4096x14336,14336x4096,4096x4096 --m 16,32,64,128 --json "$OUT/gemm_sweep_r.json"
  echo "== moe sweep"; python3 benchmarks/moe_sweep.py --tokens 1,8,64,128,256,512,1024,2048,4096 --json "$OUT/moe_sweep.json"
  echo "== bench"; python3 -m lowbit bench --preset qwen3-coder-next-hf --m 1,8,16,32,64,128,256,512,2048 \
      --methods cublas-fp16,torch-int4,lowbit-kbit4,lowbit-kbit4-gemv,lowbit-kbit4-gemm,lowbit-kbit4-dequant,cublas-fp16-bmm \
      --no-plots --no-hot --replays 5 --out "$OUT/bench" | tail -30
  echo "== gpu tests"; python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -4
  echo "== memcheck"; compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_kbit_gemm_gpu.py -k "grouped or deterministic or (matches_reference and 65)" 2>&1 | tail -2
  echo "== racecheck"; compute-sanitizer --tool racecheck python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/gpu/test_kbit_gemm_gpu.py -k "deterministic or many_experts_one_active or graph_replays" 2>&1 | tail -2
} 2>&1 | tee "$OUT/issue13.log"
