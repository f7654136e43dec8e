#!/usr/bin/env bash
# Session 78, call 3: the whole GPU suite on the final tree (library liblowbit-32cefa403f9bcb05).
set -uo pipefail
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
LIB=.variants/s78a.so.xz SUITE=1 SUITE_TIMEOUT=560 bash benchmarks/tools/verify_device.sh
grep -E "nvfp4_grouped|swiglu_epilogue\[" "$OUT/gpu_suite.log" | grep -cE "PASSED" | sed 's/^/nvfp4 grouped + swiglu passed: /'
