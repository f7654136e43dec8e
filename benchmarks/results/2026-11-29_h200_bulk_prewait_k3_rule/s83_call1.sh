#!/usr/bin/env bash
# s83 call 1 (carry .variants/s83a.so.xz = the tree's library at f19aea8, s83e = + maxring2_aligned.patch,
# s83f = + bulk_two_tiles.patch; and this file): the bulk kernel alone at K = 3, 4, M = 1 on a and f, then
# Llama-3-8B b1 generate alternated a/e/f twice, then kbit3 e2e rows a/f.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
for v in $(ls .variants | sed "s/.so.xz//"); do xz -dc .variants/$v.so.xz > /tmp/$v.so; done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
SH=4096x6144,4096x4096,4096x28672,14336x4096,8192x29568
for v in s83a s83f; do for b in 3 4; do
  LOWBIT_LIBRARY=/tmp/$v.so timeout 60 python3 benchmarks/gemv_sweep.py --bits $b --m 1 --no-warps --no-streamk --pdl --bulk --shapes $SH >> "$OUT/sweep.txt" 2>&1
  echo "== sweep $v k$b exit $? at $(el) s"; tail -12 "$OUT/sweep.txt" | grep bulk | awk '{print $1, $(NF-2), $(NF-1), $NF}'
done; done
i=0
for v in s83a s83f s83a s83f; do i=$((i+1))
  LOWBIT_LIBRARY=/tmp/$v.so timeout 110 python3 -m lowbit generate --model random:llama-3-8b --compile --compare >> "$OUT/generate.log" 2>&1
  echo "generate $i $v exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate.log" | tail -2
done
for v in s83a s83f; do
  LOWBIT_LIBRARY=/tmp/$v.so timeout 100 python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants kbit3+fuse,kbit3+fuse --out "$OUT/k3_$v.json" >> "$OUT/k3.log" 2>&1
  echo "k3 $v exit $? at $(el) s"; grep -E "tok/s|Error" "$OUT/k3.log" | tail -2
done
for p in 0 1 0 1; do
  LOWBIT_BULK_PREWAIT=$p LOWBIT_LIBRARY=/tmp/s83a.so timeout 60 python3 benchmarks/gemv_sweep.py --bits 4 --m 4 --no-warps --no-streamk --pdl --bulk --shapes $SH >> "$OUT/sweep_m4.txt" 2>&1
  echo "== sweep m4 prewait $p exit $? at $(el) s"; tail -12 "$OUT/sweep_m4.txt" | grep bulk | awk '{print $1, $(NF-2), $(NF-1), $NF}'
done
