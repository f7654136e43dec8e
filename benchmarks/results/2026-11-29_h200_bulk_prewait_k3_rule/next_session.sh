#!/usr/bin/env bash
# Built for the next session's first device call, not run. Build here first (ignored files do not survive sessions):
#   LOWBIT_CACHE_DIR=$PWD/.lowbit_cache python3 -m lowbit build --arch sm_90a --jobs 2      # the tree: .variants/n1
#   patch -p1 < benchmarks/results/2026-11-29_h200_bulk_prewait_k3_rule/k3reg_bulk_0x11.patch  # + K = 3 blocks 0, 4
#   ... build again, xz both into .variants/n1.so.xz and .variants/n2.so.xz, git checkout csrc/  (two libraries at
#   most per call: the tracked tree is 23 MiB of the 64)
# Then: run(command="bash benchmarks/results/2026-11-29_h200_bulk_prewait_k3_rule/next_session.sh", carry=[".variants"])
# It asks: (1) does the bulk-copy GEMV gain at K = 3 from decoding blocks 0 and 4 of each group in registers
# (cb3_block, as the stream-K and split kernels do) now that its ring is two stages deep; (2) with kbit3's 64-unit
# limit gone, does kbit3's gate|up gain on the bulk kernel (@bulk-swiglu: its SwiGLU instance; the last such row ran
# with the limit still holding it off); (3) does kbit3 at b4 gain on the bulk kernel (@bulk-m8) with the two-stage
# ring and one stage before the PDL wait (it lost 4.7% with the deep ring).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
for v in n1 n2; do xz -dc .variants/$v.so.xz > /tmp/$v.so; done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
LOWBIT_LIBRARY=/tmp/n2.so timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --tb=short \
  tests/gpu/test_kbit_gemv_gpu.py -k bulk > "$OUT/tests_n2.log" 2>&1
echo "tests n2 exit $? at $(el) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_n2.log" | head
for v in n1 n2; do
  LOWBIT_LIBRARY=/tmp/$v.so timeout 40 python3 benchmarks/gemv_sweep.py --bits 3 --m 1 --no-warps --no-streamk --pdl \
    --bulk --shapes 4096x6144,4096x4096,4096x28672,14336x4096,8192x29568 >> "$OUT/sweep_k3.txt" 2>&1
  echo "== sweep $v at $(el) s"; tail -15 "$OUT/sweep_k3.txt" | grep "bulk copies"
done
for v in n1 n2; do
  LOWBIT_LIBRARY=/tmp/$v.so timeout 120 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 \
    --variants kbit3+fuse,kbit3+fuse@bulk-swiglu,kbit3+fuse --out "$OUT/k3_b1_$v.json" >> "$OUT/k3_b1.log" 2>&1
  echo "k3 b1 $v exit $? at $(el) s"; grep -E "tok/s|Error" "$OUT/k3_b1.log" | tail -3
done
LOWBIT_LIBRARY=/tmp/n1.so timeout 120 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 \
  --variants kbit3+fuse,kbit3+fuse@bulk-m8,kbit3+fuse --out "$OUT/k3_b4.json" > "$OUT/k3_b4.log" 2>&1
echo "k3 b4 exit $? at $(el) s"; grep -E "tok/s|Error" "$OUT/k3_b4.log" | tail -3
