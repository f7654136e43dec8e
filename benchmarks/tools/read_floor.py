"""The floor under any kernel that reads a weight once: read_ceiling.py's size-matched read probe (csrc/membw.cu,
every mode and 1-8 CTAs per SM, best kept) on exactly a layer's kbit bytes, cold (rotating copies, CUDA graph: how
`lowbit bench` times every method), beside cuBLAS fp16 at M tokens on the same shape. Where the floor is above half
of cuBLAS's time, no kernel can be 2x cuBLAS on that shape.

    python3 benchmarks/tools/read_floor.py [--bits 4] [--m 16] [--min-weights 8e6] [--presets a,b]
"""

import argparse

import torch
from read_ceiling import kbit_bytes, probe_time_us  # this folder: the size-matched read probe

from lowbit.bench.presets import default_preset_names, load_presets
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--min-weights", type=float, default=8e6)
    p.add_argument("--presets", default=",".join(default_preset_names()))
    p.add_argument("--replays", type=int, default=20)
    args = p.parse_args()
    dev = torch.device("cuda", 0)
    table = load_presets()
    shapes = []
    for name in args.presets.split(","):
        for lin in table[name].linears:
            if lin.k_in * lin.n >= args.min_weights and (lin.k_in, lin.n) not in shapes:
                shapes.append((lin.k_in, lin.n))
    print(f"{torch.cuda.get_device_name(dev)}; kbit{args.bits} bytes; cuBLAS fp16 at M = {args.m}; us, cold")
    print(f"{'K_in x N':>14} {'MB':>7} {'floor':>7} {'cuBLAS':>8} {'cuBLAS/2':>9}  2x possible  (probe setting)")
    for k_in, n in shapes:
        nbytes = kbit_bytes(k_in, n, args.bits)
        floor_us, how = probe_time_us(nbytes, per_sm=(1, 2, 4, 8))
        ws = [torch.randn(n, k_in, dtype=torch.float16, device=dev)
              for _ in range(copies_for_cold(2 * n * k_in, l2_bytes(dev)))]
        x = torch.randn(args.m, k_in, dtype=torch.float16, device=dev)
        cub = graph_time([lambda w=w: torch.nn.functional.linear(x, w) for w in ws], replays=args.replays).median_us
        del ws
        print(f"{k_in:>6} x {n:<6} {nbytes / 1e6:7.2f} {floor_us:7.2f} {cub:8.2f} {cub / 2:9.2f}  "
              f"{'yes' if floor_us <= cub / 2 else 'no':<11}  ({how})")


if __name__ == "__main__":
    main()
