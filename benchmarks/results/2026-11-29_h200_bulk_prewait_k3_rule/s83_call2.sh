#!/usr/bin/env bash
# s83 call 2 (carry .variants/s83a.so.xz = the tree's library, s83g = + two_tiles_k3.patch (two tiles per ring stage
# at K = 3 as at K = 2); and this file): Llama-3-8B b4 kbit4 with LOWBIT_BULK_PREWAIT 1 against the default,
# alternated, a process each; then kbit3 b1 with and without its layer rule (@bulk-large) on a and g.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
for v in $(ls .variants | sed "s/.so.xz//"); do xz -dc .variants/$v.so.xz > /tmp/$v.so; done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
for p in 0 1 0 1; do
  LOWBIT_BULK_PREWAIT=$p LOWBIT_LIBRARY=/tmp/s83a.so timeout 100 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 4 --variants kbit4+fuse --out "$OUT/b4_p$p.json" >> "$OUT/b4.log" 2>&1
  echo "b4 prewait $p exit $? at $(el) s"; grep -E "tok/s|Error" "$OUT/b4.log" | tail -1
done
for v in s83a s83g; do
  LOWBIT_LIBRARY=/tmp/$v.so timeout 120 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants kbit3+fuse,kbit3+fuse@bulk-large,kbit3+fuse --out "$OUT/k3_$v.json" >> "$OUT/k3.log" 2>&1
  echo "k3 $v exit $? at $(el) s"; grep -E "tok/s|Error" "$OUT/k3.log" | tail -3
done
LOWBIT_LIBRARY=/tmp/s83g.so timeout 60 python3 benchmarks/gemv_sweep.py --bits 3 --m 4 --no-warps --no-streamk --pdl --bulk --shapes 4096x6144,4096x4096,4096x28672,14336x4096,8192x29568 > "$OUT/sweep_g_m4.txt" 2>&1
LOWBIT_LIBRARY=/tmp/s83a.so timeout 60 python3 benchmarks/gemv_sweep.py --bits 3 --m 4 --no-warps --no-streamk --pdl --bulk --shapes 4096x6144,4096x4096,4096x28672,14336x4096,8192x29568 > "$OUT/sweep_a_m4.txt" 2>&1
echo "sweeps at $(el) s"; grep bulk "$OUT"/sweep_*_m4.txt | awk '{print $1, $(NF-2), $(NF-1), $NF}'
