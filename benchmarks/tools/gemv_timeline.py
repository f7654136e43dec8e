"""Summarize gemv_timeline.cu's per-warp CSV: where each step of a GEMV call falls, in us from the call's
first warp entry (percentiles over warps), the per-unit intervals, and the gap between the two calls.

    python3 benchmarks/tools/gemv_timeline.py timeline.csv [more.csv ...]
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from itertools import pairwise

NAMES = {0: "entry", 1: "table built", 2: "past PDL wait", 19: "units done", 20: "partials published", 21: "done"}


def pct(vals, q):
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(q * (len(vals) - 1) + 0.5))]


def summarize(path: str) -> None:
    ev = defaultdict(dict)  # (call, warp) -> {event: ns}
    with open(path) as f:
        for r in csv.DictReader(f):
            ev[(int(r["call"]), int(r["warp"]))][int(r["event"])] = int(r["ns"])
    print(f"== {path}")
    ends = {}
    for call in (0, 1):
        warps = {w: e for (c, w), e in ev.items() if c == call and 0 in e}
        t0 = min(e[0] for e in warps.values())
        end = max(max(e.values()) for e in warps.values())
        ends[call] = (t0, end)
        print(f"call {call}: {len(warps)} warps, first entry to last event {(end - t0) / 1e3:.2f} us")
        print("  step                 p0      p10     p50     p90     p100   (us from the first entry)")
        for k in (0, 1, 2, 3, 4, 5, 6, 19, 20, 21):
            vals = [(e[k] - t0) / 1e3 for e in warps.values() if k in e]
            if not vals:
                continue
            name = NAMES.get(k, f"unit {k - 3} decoded")
            print(f"  {name:18s} " + " ".join(f"{pct(vals, q):7.2f}" for q in (0, .1, .5, .9, 1)))
        # per-warp intervals
        inter = defaultdict(list)
        for e in warps.values():
            units = sorted(k for k in e if 3 <= k < 19)
            if 2 in e and units:
                inter["past wait -> unit 0"].append((e[units[0]] - e[2]) / 1e3)
            for a, b in pairwise(units):
                inter["unit -> next unit"].append((e[b] - e[a]) / 1e3)
            if 1 in e:
                inter["entry -> table built"].append((e[1] - e[0]) / 1e3)
            if 19 in e and 21 in e:
                inter["units done -> done"].append((e[21] - e[19]) / 1e3)
        for k, v in inter.items():
            print(f"  {k:22s} median {statistics.median(v):6.2f} us, p90 {pct(v, .9):6.2f}, n {len(v)}")
    print(f"gap: call 0's last event -> call 1's first entry {(ends[1][0] - ends[0][1]) / 1e3:.2f} us")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarize(p)
