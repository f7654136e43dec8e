"""Run one kbit GEMV launch per (K, shape) for Nsight Compute (ncu) to profile.

    ncu --section WarpStateStats ... python benchmarks/tools/profile_gemv.py --bits 2,4 --shape 8192x28672
"""

from __future__ import annotations

import argparse

import torch

import lowbit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="2,4")
    ap.add_argument("--shape", default="8192x28672", help="K_in x N")
    ap.add_argument("--m", type=int, default=1)
    args = ap.parse_args()
    k_in, n = map(int, args.shape.split("x"))
    dev = torch.device("cuda")
    for bits in map(int, args.bits.split(",")):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, device=dev, dtype=torch.float16), bits=bits)
        x = torch.randn(args.m, k_in, device=dev, dtype=torch.float16)
        lowbit.kbit_linear(x, q)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
