"""MoE router at decode: lowbit's router kernel (lowbit.ops.moe_router) against transformers' computation
(F.linear, softmax, torch.topk, renormalize), CUDA-graph timed over one call per layer; the kernel with the atomic
handoff and as one thread-block cluster, and with the norm inside (moe_router_rms).

    python3 benchmarks/tools/router_bench.py [--tokens 1] [--experts 128] [--hidden 2048] [--top-k 8]
"""

import argparse

import torch

import lowbit
from lowbit import ops
from lowbit.bench.timing import graph_time
from lowbit.kernels import router as krouter


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
    nw = torch.rand(a.hidden, device=dev, dtype=dt) + 0.5
    ways = {
        "transformers (linear, softmax, topk, renormalize)": (lambda i: ops.moe_router_reference(xs[i], ws[i], a.top_k, True, False), None),
        "lowbit moe_router, atomic handoff": (lambda i: ops.moe_router(xs[i], ws[i], a.top_k, True, False), False),
        "lowbit moe_router, one cluster": (lambda i: ops.moe_router(xs[i], ws[i], a.top_k, True, False), True),
        "lowbit moe_router_rms (with the norm), one cluster": (lambda i: ops.moe_router_rms(xs[i], nw, 1e-6, ws[i], a.top_k, True, False), True),
    }
    for name, (fn, cluster) in ways.items():
        if cluster is not None:
            krouter.CLUSTER = cluster
        for pdl in (False, True):
            with lowbit.programmatic_launch(pdl):
                t = graph_time([lambda i=i: fn(i) for i in range(a.layers)], replays=20)
            print(f"{name:52s} pdl={int(pdl)} {t.median_us:7.2f} us per call", flush=True)


if __name__ == "__main__":
    main()
