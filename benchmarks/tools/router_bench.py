"""MoE router at decode: lowbit's router kernel (lowbit.ops.moe_router) against transformers' computation
(F.linear, softmax, torch.topk, renormalize), CUDA-graph timed over one call per layer.

    python3 benchmarks/tools/router_bench.py [--tokens 1] [--experts 128] [--hidden 2048] [--top-k 8]
"""

import argparse

import torch

import lowbit
from lowbit import ops
from lowbit.bench.timing import graph_time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--layers", type=int, default=48)
    a = p.parse_args()
    dev, dt = "cuda", torch.bfloat16
    xs = [torch.randn(a.tokens, a.hidden, device=dev, dtype=dt) for _ in range(a.layers)]
    ws = [torch.randn(a.experts, a.hidden, device=dev, dtype=dt) * 0.02 for _ in range(a.layers)]
    ways = {
        "transformers (linear, softmax, topk, renormalize)": lambda i: ops.moe_router_reference(xs[i], ws[i], a.top_k, True, False),
        "lowbit moe_router": lambda i: ops.moe_router(xs[i], ws[i], a.top_k, True, False),
    }
    for name, fn in ways.items():
        for pdl in (False, True):
            with lowbit.programmatic_launch(pdl):
                t = graph_time([lambda i=i: fn(i) for i in range(a.layers)], replays=20)
            print(f"{name:52s} pdl={int(pdl)} {t.median_us:7.2f} us per call", flush=True)


if __name__ == "__main__":
    main()
