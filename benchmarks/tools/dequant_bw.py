"""Bandwidth of the kbit dequantize kernel (kbit planes -> fp16/bf16), cold L2, CUDA graphs.

    python benchmarks/tools/dequant_bw.py [--shape 8192x28672]

Bytes moved = planes + absmax read + output written. Reference figures printed beside it: the
harness's streaming-read probe and the copy probe (best of lowbit's copy kernel and torch copy_).
"""

from __future__ import annotations

import argparse

import torch

import lowbit
from lowbit import ops
from lowbit.bench.timing import (copies_for_cold, graph_time, l2_bytes, measure_copy_bandwidth,
                                 measure_read_bandwidth)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192x28672", help="K_in x N")
    args = ap.parse_args()
    k_in, n = map(int, args.shape.split("x"))
    dev = torch.device("cuda")
    read_bw = measure_read_bandwidth()
    copy_bw = measure_copy_bandwidth()
    print(f"read {read_bw / 1e12:.3f} TB/s, copy (read+write; best of lowbit copy kernel and torch copy_) {copy_bw / 1e12:.3f} TB/s")
    for bits in (2, 3, 4, 5):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, device=dev, dtype=torch.float16), bits=bits)
        for dtype in (torch.float16, torch.bfloat16):
            out_bytes = n * k_in * 2
            in_bytes = q.planes.numel() * q.planes.element_size() + q.absmax.numel()
            ncopy = copies_for_cold(in_bytes + out_bytes, l2_bytes())
            planes = [q.planes] + [q.planes.clone() for _ in range(ncopy - 1)]
            t = graph_time([lambda p=p: ops.kbit_dequantize(p, q.absmax, q.codebook, q.scale, bits, dtype)
                            for p in planes], replays=10)
            bw = (in_bytes + out_bytes) / (t.median_us * 1e-6)
            print(f"{k_in}x{n} K={bits} {str(dtype)[6:]}: {t.median_us:8.1f} us  {bw / 1e12:.3f} TB/s  "
                  f"{100 * bw / copy_bw:5.1f}% of copy, {100 * bw / read_bw:5.1f}% of read bw")


if __name__ == "__main__":
    main()
