"""Run each kbit GEMV schedule once per shape (after a warm-up), for profilers (gemv_ncu.sh).

    python3 benchmarks/tools/gemv_once.py --shapes 4096x1024,4096x4096 --bits 4 [--m 1]

Shapes are K_inxN. For each: the split-in-CTA kernel and the stream-K kernel (the dispatch picks
one of them per shape: `lowbit.kernels.tiled.use_split`, printed).
"""

import argparse

import torch

import lowbit
from lowbit.kernels import tiled
from lowbit.kernels.library import get_library


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--bits", default="4")
    ap.add_argument("--m", type=int, default=1)
    args = ap.parse_args()
    dev = torch.device("cuda")
    lib = get_library()
    for spec in args.shapes.split(","):
        k_in, n = map(int, spec.lower().split("x"))
        for bits in map(int, args.bits.split(",")):
            lin = torch.nn.Linear(k_in, n, bias=False, device=dev, dtype=torch.bfloat16)
            mod = lowbit.nn.KbitLinear.from_linear(lin, bits)
            x = torch.randn(args.m, k_in, device=dev, dtype=torch.bfloat16)
            picked = "split" if tiled.use_split(lib, dev, bits, torch.bfloat16, n, k_in) else "streamk"
            for path in ("split", "streamk"):
                tiled.DENSE_PATH = path
                mod._launcher = None  # rebuilt with this schedule
                with torch.no_grad():
                    mod(x)  # warm-up (and what the profiler sees first)
                    torch.cuda.synchronize()
                    mod(x)
                    torch.cuda.synchronize()
                print(f"{k_in}x{n} kbit{bits} M={args.m}: {path} (dispatch picks {picked})", flush=True)
            tiled.DENSE_PATH = "auto"


if __name__ == "__main__":
    main()
