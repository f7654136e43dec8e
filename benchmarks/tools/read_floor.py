"""The floor under any kernel that reads a weight once: lowbit's streaming-read probe (csrc/membw.cu, every mode and
grid, best kept) timed on exactly a layer's kbit bytes, cold (rotating copies, CUDA graph: how `lowbit bench` times
every method), beside cuBLAS fp16 at M tokens on the same shape. Where the floor is above half of cuBLAS's time,
no kernel can be 2x cuBLAS on that shape.

    python3 benchmarks/tools/read_floor.py [--bits 4] [--m 16] [--min-weights 8e6] [--presets a,b]
"""

import argparse

import torch

from lowbit.bench.presets import default_preset_names, load_presets
from lowbit.bench.timing import PROBE_MODES, copies_for_cold, graph_time, l2_bytes
from lowbit.kernels.library import get_library, ptr, stream_of


def kbit_bytes(bits: int, k_in: int, n: int) -> int:
    """Codes plus one E4M4 byte per 32-element block (the tiled layout pads N to 16 and K_in to 256)."""
    n_p, k_p = -(-n // 16) * 16, -(-k_in // 256) * 256
    return n_p * k_p * bits // 8 + n_p * k_p // 32


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--min-weights", type=float, default=8e6)
    p.add_argument("--presets", default=",".join(default_preset_names()))
    p.add_argument("--replays", type=int, default=20)
    args = p.parse_args()
    lib, dev = get_library(), torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    table = load_presets()
    shapes = []
    for name in args.presets.split(","):
        for lin in table[name].linears:
            if lin.k_in * lin.n >= args.min_weights and (lin.k_in, lin.n) not in shapes:
                shapes.append((lin.k_in, lin.n))
    print(f"{torch.cuda.get_device_name(dev)}; kbit{args.bits} bytes; cuBLAS fp16 at M = {args.m}; us, cold")
    print(f"{'K_in x N':>14} {'MB':>7} {'floor':>7} {'mode/per-SM':>12} {'cuBLAS':>8} {'cuBLAS/2':>9}  2x possible")
    for k_in, n in shapes:
        nbytes = kbit_bytes(args.bits, k_in, n)
        bufs = [torch.empty(nbytes // 16 * 16, dtype=torch.uint8, device=dev).random_()
                for _ in range(copies_for_cold(nbytes, l2_bytes(dev)))]
        best = None
        for mode in PROBE_MODES:
            for per_sm in (1, 2, 4, 8):
                calls = [lambda b=b, g=sms * per_sm, mo=mode: lib.call(
                    "read_bw", [ptr(b), b.numel(), ptr(sink), g, mo, stream_of(dev)]) for b in bufs]
                us = graph_time(calls, replays=args.replays).median_us
                if best is None or us < best[0]:
                    best = (us, f"{mode}/{per_sm}")
        del bufs
        ws = [torch.randn(n, k_in, dtype=torch.float16, device=dev)
              for _ in range(copies_for_cold(2 * n * k_in, l2_bytes(dev)))]
        x = torch.randn(args.m, k_in, dtype=torch.float16, device=dev)
        cub = graph_time([lambda w=w: torch.nn.functional.linear(x, w) for w in ws], replays=args.replays).median_us
        del ws
        print(f"{k_in:>6} x {n:<6} {nbytes / 1e6:7.2f} {best[0]:7.2f} {best[1]:>12} {cub:8.2f} {cub / 2:9.2f}  "
              f"{'yes' if best[0] <= cub / 2 else 'no'}")


if __name__ == "__main__":
    main()
