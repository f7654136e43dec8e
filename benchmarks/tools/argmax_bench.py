"""The decode step's last kernel: argmax over a vocabulary of logits, one-stage (torch's, eager and compiled)
vs lowbit.hf.decode.argmax_rows (two stages), CUDA-graph timed.

    python3 benchmarks/tools/argmax_bench.py [--vocab 128256] [--batch 1]
"""
import argparse

import torch

from lowbit.bench.timing import graph_time
from lowbit.hf.decode import argmax_rows


def time_us(fn, x) -> float:
    """Median per-call time, 16 calls per CUDA-graph replay (lowbit.bench.timing.graph_time)."""
    return graph_time([lambda: fn(x)]).median_us


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batch", type=int, default=1)
    a = p.parse_args()
    x = torch.randn(a.batch, a.vocab, device="cuda", dtype=torch.bfloat16)
    ways = {"torch argmax (eager)": lambda t: t.argmax(-1),
            "torch argmax (compiled)": torch.compile(lambda t: t.argmax(-1), fullgraph=True),
            "argmax_rows (eager)": argmax_rows,
            "argmax_rows (compiled)": torch.compile(argmax_rows, fullgraph=True)}
    want = x.argmax(-1)
    for name, fn in ways.items():
        assert torch.equal(fn(x), want), name
        print(f"{name:28s} {time_us(fn, x):7.2f} us  (batch {a.batch}, vocab {a.vocab})", flush=True)


if __name__ == "__main__":
    main()
