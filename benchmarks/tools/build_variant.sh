#!/usr/bin/env bash
# Build lowbit's CUDA library from csrc/ with experiment patches applied, for A/B timing of kernel
# variants in one device call (build here, carry the result, select it with LOWBIT_LIBRARY):
#   bash benchmarks/tools/build_variant.sh NAME [PATCH ...]   -> .variants/lib_NAME.so
#   LOWBIT_LIBRARY=$PWD/.variants/lib_NAME.so python3 benchmarks/gemv_sweep.py ...   (on the device)
# Patches are `patch -p1` diffs against the repository root (benchmarks/tools/patches/ has the
# diagnostic ones). ARCH (default sm_90a) picks the target.
set -euo pipefail
name=${1:?usage: build_variant.sh NAME [PATCH ...]}; shift
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$root/.variants"
cp -r "$root/csrc" "$work/src/csrc"
for p in "$@"; do patch -s -d "$work/src" -p1 < "$p"; done
LOWBIT_CSRC_DIR="$work/src/csrc" LOWBIT_CACHE_DIR="$work/cache" PYTHONPATH="$root" \
    python3 -m lowbit build --arch "${ARCH:-sm_90a}" | tail -1
cp "$work"/cache/liblowbit-*.so "$root/.variants/lib_$name.so"
echo "$root/.variants/lib_$name.so"
