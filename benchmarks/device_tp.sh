#!/usr/bin/env bash
# One call on a 2-GPU kind (library built here and carried in .lowbit_cache): TP = 1 against TP = 2 on
# Llama-3-70B shapes, kbit4, batch 1 and 4, each all-reduce kind (benchmarks/tp_scaling.py).
#   MODEL=random:llama-3-70b LAYERS= TOKENS=96 LIMIT=200 [TESTS=1] [COMPILE=1] [PROFILE=1] [OWN=1] [KINDS=nccl,symm-mem] bash benchmarks/device_tp.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # NVLink multicast stays off on the lent machines
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvidia-smi topo -m
  if [ -n "${TESTS:-}" ]; then  # the TP GPU tests first: every case on NCCL with every all-reduce kind
    timeout 240 python3 -m pytest -m gpu -v -p no:cacheprovider -rf tests/gpu/test_hf_tp_gpu.py > "$OUT/pytest_tp.log" 2>&1
    echo "pytest exit $?"; grep -E "PASSED|FAILED|ERROR|passed|failed|skipped" "$OUT/pytest_tp.log" | tail -8
  fi
  timeout "${LIMIT:-200}" python3 -m torch.distributed.run --nproc-per-node "${NPROC:-2}" benchmarks/tp_scaling.py \
      --model "${MODEL:-random:llama-3-70b}" ${LAYERS:+--layers $LAYERS} --batch "${BATCH:-1,4}" \
      --max-new-tokens "${TOKENS:-96}" ${COMPILE:+--compile} ${PROFILE:+--profile} ${OWN:+--own-layers} ${KINDS:+--allreduce $KINDS} --out "$OUT/tp${COMPILE:+_compile}"
  echo "exit $?"
} 2>&1 | grep -v "Warning\|warnings.warn" | tee "$OUT/device_tp.log"
