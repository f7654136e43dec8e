#!/usr/bin/env bash
# s83 call 3 (carry .variants/s83h.so.xz = liblowbit-b713b0eb74b41379, the tree: one stage before the PDL wait at
# M > 1, kbit3's layer limit dropped): the whole GPU suite, then lowbit generate b1 and b4.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
SUITE=1 SUITE_TIMEOUT=420 LIB=.variants/s83h.so.xz bash benchmarks/tools/verify_device.sh
echo "suite done at $(el) s"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so LOWBIT_CACHE_DIR=$PWD/.lowbit_cache
timeout 80 python3 -m lowbit generate --model random:llama-3-8b --compile --compare > "$OUT/generate_b1.log" 2>&1
echo "generate b1 exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate_b1.log" | tail -2
timeout 80 python3 -m lowbit generate --model random:llama-3-8b --compile --compare --batch 4 > "$OUT/generate_b4.log" 2>&1
echo "generate b4 exit $? at $(el) s"; grep -E "kbit4|unquantized" "$OUT/generate_b4.log" | tail -2
