"""NVFP4 at M = 1: the checkpoint-layout GEMV against the tiled one (the kbit GEMV's NVFP4 instance),
cold L2, on every linear of the named presets -- the data behind lowbit.dispatch.nvfp4_plain_wins.

    python benchmarks/tools/nvfp4_m1_paths.py [--preset real-shapes --preset llama-3-70b] [--m 1]
"""

from __future__ import annotations

import argparse

import torch

import lowbit
from lowbit import ops
from lowbit.bench.presets import load_presets
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", action="append", default=None)
    ap.add_argument("--m", type=int, default=1)
    args = ap.parse_args()
    presets = load_presets()
    dev = torch.device("cuda")
    seen = set()
    for name in args.preset or ["real-shapes", "llama-3-70b"]:
        for lin in presets[name].linears:
            if (lin.k_in, lin.n) in seen:
                continue
            seen.add((lin.k_in, lin.n))
            w = lowbit.quantize_nvfp4(torch.randn(lin.n, lin.k_in, device=dev, dtype=torch.float16))
            qw, qs = w.tiled()
            n_copies = copies_for_cold(w.nbytes(), l2_bytes())
            plain = [(w.packed.clone(), w.scales.clone()) for _ in range(n_copies)]
            tiled = [(qw.clone(), qs.clone()) for _ in range(n_copies)]
            x = torch.randn(args.m, lin.k_in, device=dev, dtype=torch.float16)
            tp = graph_time([lambda c=c: ops.nvfp4_plain_gemv(x, c[0], c[1], w.scale_2) for c in plain], replays=10)
            tt = graph_time([lambda c=c: ops.nvfp4_gemv(x, c[0], c[1], w.scale_2, lin.n, lin.k_in) for c in tiled],
                            replays=10)
            pick = lowbit.dispatch.nvfp4_plain_wins(args.m, lin.n, lin.k_in)
            print(f"{lin.k_in}x{lin.n} M={args.m} plain {tp.median_us:7.2f} us  tiled {tt.median_us:7.2f} us  "
                  f"plain/tiled {tp.median_us / tt.median_us:5.2f}  dispatch: {'plain' if pick else 'tiled'}",
                  flush=True)
            del plain, tiled


if __name__ == "__main__":
    main()
