#!/usr/bin/env bash
# call 4 (H200): the main job on the K = 4 rule change (Python only; the library is session 74's), then
# the whole GPU suite on it.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
xz -dc .variants/final74c.so.xz > /tmp/liblowbit.so
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
timeout 150 python3 -m lowbit generate --model random:llama-3-8b --compile --compare > "$OUT/generate.log" 2>&1
echo "generate exit $? at $(( $(date +%s) - start )) s"; grep -v "it/s\]" "$OUT/generate.log" | grep -A8 "lowbit generate:"
LIB=.variants/final74c.so.xz SUITE=1 SUITE_TIMEOUT=$(( 440 - ($(date +%s) - start) )) bash benchmarks/tools/verify_device.sh
echo "done at $(( $(date +%s) - start )) s"
