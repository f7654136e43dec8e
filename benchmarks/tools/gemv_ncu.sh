#!/usr/bin/env bash
# Nsight Compute over the kbit GEMVs of a few decode shapes (issue 14: what costs the fixed time).
# One device call; reports and a CSV summary under $OUT. Carry .lowbit_cache.
#   SHAPES="4096x1024,4096x4096,4096x14336,14336x4096,576x576" BITS=4 [PATHS=split,streamk] bash benchmarks/tools/gemv_ncu.sh
# PATHS: the kernels per shape (gemv_once.py --paths; e.g. PATHS=bulk,local for the bulk-copy GEMV beside the CTA-local
# stream-K kernel; the pipe and stall sections say which of the two decodes cheaper per weight and why).
# M: tokens (default 1).
# SOURCE=1: also the per-instruction stall samples (SourceCounters), kept as $OUT/gemv.ncu-rep and exported per kernel
# as $OUT/sass_<id>.csv (the SASS with its samples by stall reason; sass_top.py ranks them).
set -uo pipefail
export PYTHONUNBUFFERED=1 LOWBIT_CACHE_DIR=${LOWBIT_CACHE_DIR:-$PWD/.lowbit_cache} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/lowbit_out}; mkdir -p "$OUT"
SHAPES=${SHAPES:-4096x1024,4096x4096,4096x6144,4096x14336,4096x28672,14336x4096,576x576,2048x512}
BITS=${BITS:-4}
[[ -n ${LOWBIT_LIBRARY:-} ]] || python3 -m lowbit build --arch sm_90a | tail -1
# every shape through both dense schedules (split-in-CTA, stream-K), one launch each after a warm-up
src=(); [[ -n ${SOURCE:-} ]] && src=(--section SourceCounters --import-source no -o "$OUT/gemv")
ncu --target-processes all --kernel-name regex:kbit_ --launch-skip 0 --clock-control none "${src[@]}" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --csv --page details \
    python3 benchmarks/tools/gemv_once.py --shapes "$SHAPES" --bits "$BITS" --m "${M:-1}" --paths "${PATHS:-split,streamk}" \
    > "$OUT/ncu_details.csv" 2> "$OUT/ncu.log"
tail -3 "$OUT/ncu.log"
if [[ -n ${SOURCE:-} ]]; then  # with -o the details go to the report: print them from it, then each kernel's SASS
  ncu -i "$OUT/gemv.ncu-rep" --csv --page details > "$OUT/ncu_details.csv" 2>> "$OUT/ncu.log"
  n=$(ncu -i "$OUT/gemv.ncu-rep" --csv --page raw --metrics launch__grid_size 2>/dev/null | grep -c '^"[0-9]')
  for ((i = 0; i < n; i++)); do
    ncu -i "$OUT/gemv.ncu-rep" --csv --page source --print-source sass --launch-skip "$i" --launch-count 1 \
      > "$OUT/sass_$i.csv" 2>> "$OUT/ncu.log"
  done
fi
python3 - "$OUT/ncu_details.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')))
want = ("Duration", "Memory Throughput", "DRAM Throughput", "Achieved Occupancy", "Registers Per Thread",
        "Grid Size", "Dynamic Shared Memory Per Block")
seen = {}
for r in rows:
    key = (r["ID"], r["Kernel Name"][:60])
    if r["Metric Name"] in want:
        seen.setdefault(key, {})[r["Metric Name"]] = f'{r["Metric Value"]} {r["Metric Unit"]}'.strip()
for (i, name), m in seen.items():
    print(i, name, "|", ", ".join(f"{k}: {v}" for k, v in m.items()))
PY
