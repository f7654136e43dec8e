"""Does reading weights get slower once the process has allocated and freed other big models? (The e2e rows of a
variant that runs after another model read up to 6% slower than the same variant in a fresh process.)

    python3 benchmarks/tools/read_after_churn.py [--gb 16] [--parts 64] [--churn-gb 60]

Times a decode-like pass (every part read once, sum kernels, CUDA graph, cold: parts together larger than L2) over
``--gb`` of bf16 in ``--parts`` tensors: (1) in the fresh process; (2) after allocating ``--churn-gb`` in mixed sizes,
freeing it and emptying the cache (a model built, then deleted); (3) the same tensors as slices of a few large
allocations (``--arenas`` GB each, then one for all), each after a churn of its own.
"""
import argparse
import random

import torch

from lowbit.bench.timing import graph_time


def timed_pass(parts):
    """(ms per pass, TB/s): every part summed once per pass, in one CUDA graph (lowbit.bench.timing.graph_time: the
    median over replays)."""
    out = torch.empty(len(parts), device="cuda", dtype=torch.float32)
    calls = [lambda i=i, p=p: torch.sum(p, dim=0, dtype=torch.float32, out=out[i]) for i, p in enumerate(parts)]
    ms = graph_time(calls).median_us * len(parts) / 1e3
    nbytes = sum(p.numel() * p.element_size() for p in parts)
    return ms, nbytes / ms / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=16)
    ap.add_argument("--parts", type=int, default=64)
    ap.add_argument("--churn-gb", type=float, default=60)
    ap.add_argument("--arenas", default="0.25,0.5,1,2", help="GB per arena of the arena rows (the last row: one)")
    args = ap.parse_args()
    n = int(args.gb * 2**30 / 2 / args.parts)

    def make():
        return [torch.ones(n, device="cuda", dtype=torch.bfloat16) for _ in range(args.parts)]

    parts = make()
    ms, tbs = timed_pass(parts)
    print(f"fresh process, {args.parts} tensors:     {ms:7.3f} ms per pass, {tbs:5.2f} TB/s")
    del parts
    torch.cuda.empty_cache()
    rnd = random.Random(0)

    def churn():
        held, total = [], 0
        while total < args.churn_gb * 2**30:
            size = rnd.choice([2**20, 2**22, 2**24, 2**26, 2**27, 2**28])  # bytes: 1 MB .. 256 MB, a model's tensors
            held.append(torch.empty(size // 2, device="cuda", dtype=torch.bfloat16))
            total += size
        del held
        torch.cuda.empty_cache()

    churn()
    parts = make()
    ms, tbs = timed_pass(parts)
    print(f"after {args.churn_gb:.0f} GB churn, {args.parts} tensors: {ms:7.3f} ms per pass, {tbs:5.2f} TB/s")
    del parts
    torch.cuda.empty_cache()
    # the same tensors as slices of arenas of `arena` bytes, each after a fresh churn
    for arena in [int(float(a) * 2**30) for a in args.arenas.split(",")] + [n * 2 * args.parts]:
        churn()
        per = max(1, arena // (n * 2))
        flats = [torch.ones(n * min(per, args.parts - i), device="cuda", dtype=torch.bfloat16)
                 for i in range(0, args.parts, per)]
        parts = [t for f in flats for t in f.view(-1, n).unbind(0)]
        ms, tbs = timed_pass(parts)
        print(f"after a churn, arenas of {per * n * 2 / 2**30:5.2f} GB: {ms:7.3f} ms per pass, {tbs:5.2f} TB/s")
        del parts, flats
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
