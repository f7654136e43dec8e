"""Warps per CTA of SBVR's two decode GEMVs, timed the way `lowbit bench` times (CUDA-graph replays over
rotating weight copies larger than 4x L2: cold). Picks the kernels' default rule (0) against fixed counts.
Run on the GPU:  python3 benchmarks/tools/sbvr_warps.py [--shapes 8192x28672,28672x8192] [--m 1,2,4,8]"""

import argparse

import torch

import lowbit
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes
from lowbit.kernels import sbvr as sbvr_kernels

p = argparse.ArgumentParser()
p.add_argument("--shapes", default="8192x28672,28672x8192,4096x4096,4096x14336,14336x4096")
p.add_argument("--m", default="1,2,4,8")
p.add_argument("--ns", type=int, default=4)
p.add_argument("--warps", default="0,4,8,16")
a = p.parse_args()
bw = 3.2e12
for shape in a.shapes.split(","):
    k, n = map(int, shape.split("x"))
    base = lowbit.quantize_sbvr(torch.randn(n, k, device="cuda") * 0.02, num_sums=a.ns)
    copies = [lowbit.SbvrWeight(*(t.clone() for t in base.tensors()), base.group) for _ in
              range(copies_for_cold(base.nbytes(), l2_bytes()))]
    for q in copies:
        q.layouts()
    for m in map(int, a.m.split(",")):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        row = []
        for path in ("popcount", "lookup"):
            for w in map(int, a.warps.split(",")):
                sbvr_kernels.WARPS = w
                with lowbit.dispatch.forced_path(path):
                    calls = [lambda q=q: lowbit.sbvr_linear(x, q, act_bits=8) for q in copies]
                    t = graph_time(calls).median_us
                row.append(f"{path[:3]} w{w}: {t:6.1f} us ({base.nbytes() / (t * 1e-6) / bw:4.0%})")
        print(f"{shape} M={m}: " + " | ".join(row), flush=True)
sbvr_kernels.WARPS = 0
