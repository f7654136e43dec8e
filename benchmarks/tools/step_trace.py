"""Read a decode step's Chrome trace (``benchmarks/e2e_gpu.py --profile X --trace-dir D``): the kernels of
one step in launch order, with durations, the idle gaps between them and what each kernel family costs.

    python3 benchmarks/tools/step_trace.py D/kbit4+fuse.trace.json [--steps 3] [--layer 5] [--top 12]

A step's kernels are the trace's kernels split into ``--steps`` equal runs (the profiler records that many
replays). ``--layer L`` prints the kernels of decoder layer L (of ``--layers``), so one layer's timeline can be read
kernel by kernel.
"""

import argparse
import json
import re
from collections import defaultdict


def short(name: str) -> str:
    n = re.sub(r"\(.*", "", name)  # drop the argument list
    n = re.sub(r"^void ", "", n)
    return n[:90]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layer", type=int, default=None)
    p.add_argument("--layers", type=int, default=32, help="decoder layers of the model (for --layer)")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    events = json.load(open(args.trace))
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    ks = sorted((e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"), key=lambda e: e["ts"])
    per = len(ks) // args.steps
    step = ks[per * (args.steps - 1): per * args.steps]  # the last whole step
    t0, t1 = step[0]["ts"], max(e["ts"] + e["dur"] for e in step)
    busy = sum(e["dur"] for e in step)
    gaps, overl = 0.0, 0.0
    end = step[0]["ts"]
    fam = defaultdict(lambda: [0, 0.0, 0.0])  # count, kernel us, gap before us
    for e in step:
        gap = e["ts"] - end
        if gap > 0:
            gaps += gap
        else:
            overl -= gap
        f = fam[short(e["name"])]
        f[0] += 1
        f[1] += e["dur"]
        f[2] += max(gap, 0.0)
        end = max(end, e["ts"] + e["dur"])
    print(f"{args.trace}: {len(ks)} kernels, {per} per step")
    print(f"step span {t1 - t0:.1f} us; kernels {busy:.1f} us; idle gaps {gaps:.1f} us; overlapped {overl:.1f} us")
    print(f"{'kernel':90s} {'n':>4s} {'us':>9s} {'us/call':>8s} {'gap us':>8s}")
    for name, (n, us, gap) in sorted(fam.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{name:90s} {n:4d} {us:9.1f} {us / n:8.2f} {gap:8.1f}")
    if args.layer is not None:
        # a decoder layer: the step's kernels minus the few before the first layer and after the last,
        # split evenly (every layer launches the same sequence)
        n_layers = args.layers
        per_layer = len(step) // n_layers
        head = (len(step) - per_layer * n_layers) // 2
        i0 = head + args.layer * per_layer
        print(f"\nlayer {args.layer} (kernels {i0}..{i0 + per_layer - 1} of the step, {per_layer} per layer):")
        prev_end = step[i0 - 1]["ts"] + step[i0 - 1]["dur"] if i0 else step[0]["ts"]
        for e in step[i0:i0 + per_layer]:
            print(f"  +{e['ts'] - step[i0]['ts']:8.2f} gap {e['ts'] - prev_end:6.2f}  {e['dur']:7.2f} us  {short(e['name'])}")
            prev_end = max(prev_end, e["ts"] + e["dur"])

if __name__ == "__main__":
    main()
