"""Run the kbit GEMM once per (shape, M) after a warm-up, for profilers:

    ncu --kernel-name regex:kbit_gemm_kernel --launch-skip 1 --launch-count 1 \
        python3 benchmarks/tools/gemm_once.py --shape 8192x28672 --m 32

Shape is K_inxN; the dispatcher is pinned to the GEMM.
"""

import argparse

import torch

import lowbit
from lowbit import dispatch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True)
    ap.add_argument("--m", type=int, required=True)
    ap.add_argument("--bits", type=int, default=4)
    args = ap.parse_args()
    k_in, n = map(int, args.shape.lower().split("x"))
    q = lowbit.quantize_kbit(torch.randn(n, k_in, device="cuda", dtype=torch.float16), bits=args.bits)
    x = torch.randn(args.m, k_in, device="cuda", dtype=torch.float16)
    with dispatch.forced_path("gemm"):
        for _ in range(2):  # warm-up, then the profiled call
            lowbit.kbit_linear(x, q)
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
