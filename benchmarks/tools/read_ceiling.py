"""Size-matched streaming ceiling: how fast lowbit's read probe streams a buffer of the size a GEMV
reads, timed like the GEMVs (CUDA graph over rotating copies, cold L2).

    python3 benchmarks/tools/read_ceiling.py --shapes 8192x28672,28672x8192 --bits 2,3,4,5

The "% of read bandwidth" figures divide by the probe's best on a 2 GB buffer, where the fixed
cost of a launch (start, ramp-up, tail) vanishes. A 40 us GEMV pays that fixed cost too: this
prints the probe's own time and % at each GEMV's byte count (best over walk, load flavour and
grid), the most any kernel reading those bytes in one launch can be expected to reach.
Shapes are K_inxN; bytes = codes (K bits per weight, rows padded to 16, columns to 256) + one
absmax byte per 32 weights, as lowbit.formats.kbit_tiled stores them.
"""

from __future__ import annotations

import argparse

import torch

from lowbit.bench.timing import PROBE_MODES, copies_for_cold, graph_time, l2_bytes, measure_read_bandwidth
from lowbit.kernels.library import get_library, ptr, stream_of


def kbit_bytes(k_in: int, n: int, bits: int) -> int:
    rows, cols = -(-n // 16) * 16, -(-k_in // 256) * 256
    return rows * cols * bits // 8 + rows * cols // 32


def probe_time_us(n_bytes: int, per_sm: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 128)) -> tuple[float, str]:
    """Best cold time of one read of n_bytes (rotating copies), and the setting that gave it."""
    lib = get_library()
    dev = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    n_bytes = n_bytes // 16 * 16
    bufs = [torch.empty(n_bytes, dtype=torch.uint8, device=dev).random_() for _ in range(copies_for_cold(n_bytes, l2_bytes()))]
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    best = (float("inf"), "")
    for mode in PROBE_MODES:
        for k in per_sm:
            calls = [lambda b=b, g=sms * k, m=mode: lib.call("read_bw", [ptr(b), n_bytes, ptr(sink), g, m, stream_of(dev)])
                     for b in bufs]
            t = graph_time(calls, replays=10).median_us
            if t < best[0]:
                best = (t, f"{PROBE_MODES[mode]}, {k} CTAs/SM")
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True, help="comma-separated K_inxN")
    ap.add_argument("--bits", default="4")
    args = ap.parse_args()
    bw = measure_read_bandwidth()
    print(f"read bandwidth (2 GB probe) {bw / 1e12:.3f} TB/s")
    for spec in args.shapes.split(","):
        k_in, n = map(int, spec.lower().split("x"))
        for bits in map(int, args.bits.split(",")):
            nb = kbit_bytes(k_in, n, bits)
            t, how = probe_time_us(nb)
            print(f"{k_in}x{n} K={bits} {nb / 1e6:8.2f} MB  probe {t:8.2f} us  {100 * nb / (t * 1e-6) / bw:5.1f}%  ({how})")


if __name__ == "__main__":
    main()
