#!/usr/bin/env bash
# call 1 (carry .variants/final74c.so.xz = the previous session's committed library
# liblowbit-df7e53fc0a350116, and this file): the whole GPU suite on it (its host code differs from the last library
# run on the device only by an unused branch of Launch), then the main job.
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
start=$(date +%s)
LIB=.variants/final74c.so.xz SUITE=1 SUITE_TIMEOUT=400 bash benchmarks/tools/verify_device.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOWBIT_LIBRARY=/tmp/liblowbit.so
timeout $(( 585 - ($(date +%s) - start) )) python3 -m lowbit generate --model random:llama-3-8b --compile --compare > "$OUT/generate.log" 2>&1
echo "generate exit $?"; grep -v "it/s\]" "$OUT/generate.log" | tail -12
