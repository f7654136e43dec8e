"""One SBVR popcount GEMV call per shape and M, for ncu (``--kernel-name regex:popcount``), plus the binary MMA's
issue rate alone (a kernel of independent mma.m16n8k128.b1 per warp). Run on the GPU:
    python3 benchmarks/tools/sbvr_gemv_profile.py [--ns 4] [--m 1,8]
    ncu --kernel-name regex:popcount --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 benchmarks/tools/sbvr_gemv_profile.py"""

import argparse

import torch

import lowbit

p = argparse.ArgumentParser()
p.add_argument("--ns", type=int, default=4)
p.add_argument("--m", default="1,8")
p.add_argument("--shapes", default="8192x28672,28672x8192")
a = p.parse_args()
for shape in a.shapes.split(","):
    k, n = map(int, shape.split("x"))
    q = lowbit.quantize_sbvr(torch.randn(n, k, device="cuda") * 0.02, num_sums=a.ns)
    t = q.tiled()
    for m in map(int, a.m.split(",")):
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        for _ in range(2):
            lowbit.ops.sbvr_gemv(x, *t, n, k, q.group)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            lowbit.ops.sbvr_gemv(x, *t, n, k, q.group)
        end.record()
        torch.cuda.synchronize()
        print(f"{shape} M={m}: {start.elapsed_time(end) / 20 * 1e3:.1f} us per call (hot-ish, eager, incl. encoder)")
