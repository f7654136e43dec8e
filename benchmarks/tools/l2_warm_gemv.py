"""How fast a kbit GEMV runs when its weights are already in L2, against cold (from DRAM).

    python benchmarks/tools/l2_warm_gemv.py [--shapes 4096x6144,4096x4096] [--bits 4]

Per shape: cold (rotating copies, as gemv_sweep); hot (one copy, L2-resident when it fits); and
"after a read": each copy is first streamed by a plain read kernel (torch sum) and then multiplied,
the GEMV's time being the pair's minus the read's. That last figure is what prefetching a GEMV's
weights into L2 during the glue kernels before it could buy in a decode step.
"""

from __future__ import annotations

import argparse
import copy

import torch

import lowbit.nn
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x6144,4096x4096,4096x28672,14336x4096")
    ap.add_argument("--bits", default="4")
    args = ap.parse_args()
    dev = torch.device("cuda")
    for shape in args.shapes.split(","):
        k_in, n = map(int, shape.split("x"))
        for bits in map(int, args.bits.split(",")):
            lin = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(k_in, n, bias=False, dtype=torch.float16, device=dev),
                                                bits=bits)
            nbytes = sum(t.numel() * t.element_size() for t in (lin.qweight, lin.qabsmax))
            mods = [lin] + [copy.deepcopy(lin) for _ in range(copies_for_cold(nbytes, l2_bytes()) - 1)]
            x = torch.randn(1, k_in, device=dev, dtype=torch.float16)
            cold = graph_time([lambda m=m: m(x) for m in mods], replays=10).median_us
            hot = graph_time([lambda: lin(x)] * 8, replays=10).median_us
            read = graph_time([lambda m=m: m.qweight.sum() for m in mods], replays=10).median_us
            both = graph_time([c for m in mods for c in (lambda m=m: m.qweight.sum(), lambda m=m: m(x))], replays=10).median_us
            after = 2 * both - read  # graph_time is per call: a pair is two calls
            bw = nbytes / 3.0e12 * 1e6
            print(f"{k_in}x{n} K={bits} {nbytes / 1e6:6.1f} MB  roofline(3.0TB/s) {bw:6.2f} us  cold {cold:6.2f}  "
                  f"hot {hot:6.2f}  after-read {after:6.2f}  (read {read:6.2f})", flush=True)
            del mods


if __name__ == "__main__":
    main()
