"""Read a decode step's Chrome trace (``benchmarks/e2e_gpu.py --profile X --trace-dir D``): the kernels of
one step in launch order, with durations, the idle gaps between them and what each kernel family costs.

    python3 benchmarks/tools/step_trace.py D/kbit4+fuse.trace.json[.gz] [--steps 3] [--layer 5] [--top 12]
                                           [--critical decode_attention]

A step's kernels are the trace's kernels split into ``--steps`` equal runs (the profiler records that many
replays). ``--layer L`` prints the kernels of decoder layer L (of ``--layers``), so one layer's timeline can be read
kernel by kernel.
"""

import argparse
import gzip
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
    p.add_argument("--critical", default="", metavar="NAME",
                   help="the critical path per layer: for the kernels of a layer (anchored on each kernel whose name "
                        "holds NAME, e.g. decode_attention, and the one before it), the median time from the previous "
                        "kernel's end to this one's end; kernel spans overlap under PDL, ends do not lie")
    args = p.parse_args()
    opener = gzip.open if args.trace.endswith(".gz") else open
    with opener(args.trace, "rt") as f:
        events = json.load(f)
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

    if args.critical:
        critical(step, args.critical, args.layers)


def critical(step, anchor: str, n_layers: int) -> None:
    """Median end-to-end increments of a layer's kernels, the layer taken as the kernel before each ``anchor``
    kernel and the ones up to the next layer's; every layer but the first counts (the first follows the prologue)."""
    import statistics

    ends = [e["ts"] + e["dur"] for e in step]
    at = [i for i, e in enumerate(step) if anchor in e["name"]]
    if len(at) < 3:
        print(f"\n--critical {anchor!r}: {len(at)} matching kernels, too few")
        return
    period = at[2] - at[1]
    print(f"\ncritical path per layer ({len(at) - 1} layers after the first, {period} kernels each; "
          f"median increments of kernel end times):")
    total = 0.0
    for off in range(-1, period - 1):
        inc = [ends[a + off] - ends[a + off - 1] for a in at[1:] if 0 < a + off < len(step)]
        med = statistics.median(inc)
        total += med
        print(f"  {med:8.2f} us  {short(step[at[1] + off]['name'])}")
    print(f"  {total:8.2f} us  per layer")


if __name__ == "__main__":
    main()
