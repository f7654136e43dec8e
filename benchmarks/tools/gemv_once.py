"""Run each kbit GEMV schedule once per shape (after a warm-up), for profilers (gemv_ncu.sh).

    python3 benchmarks/tools/gemv_once.py --shapes 4096x1024,4096x4096 --bits 4 [--m 1] [--paths split,streamk]

Shapes are K_inxN. For each: the kernels named by --paths (``lowbit.kernels.tiled.DENSE_PATH`` values;
default the split-in-CTA and the global stream-K kernel; the dispatch's pick for the shape is printed).
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
    ap.add_argument("--paths", default="split,streamk", help="DENSE_PATH values to run (split, streamk, local, bulk)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    lib = get_library()
    for spec in args.shapes.split(","):
        k_in, n = map(int, spec.lower().split("x"))
        for bits in map(int, args.bits.split(",")):
            lin = torch.nn.Linear(k_in, n, bias=False, device=dev, dtype=torch.bfloat16)
            mod = lowbit.nn.KbitLinear.from_linear(lin, bits)
            x = torch.randn(args.m, k_in, device=dev, dtype=torch.bfloat16)
            picked = ("bulk" if tiled.bulk_ctas(lib, dev, bits, torch.bfloat16, args.m, n, k_in)
                      else tiled.dense_path(lib, dev, bits, torch.bfloat16, n, k_in))
            for path in args.paths.split(","):
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
