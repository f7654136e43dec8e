"""Tuning aid: cold-L2 time of the kbit GEMV kernels: the split-K-in-CTA kernel, the stream-K
kernel at several warp counts, the stream-K kernel's CTA-local mode (one CTA per SM) and, with ``--bulk``, the
bulk-copy kernel (up to 8 tokens; csrc/tiled/bulk_gemv.cuh).

    python benchmarks/gemv_sweep.py [--bits 2,4,5] [--m 1] [--shapes 2048x4096,1024x1024] [--no-warps]
                                    [--warps 1792,2112] [--split-ctas 132,264,528] [--pdl] [--peers] [--global-x] [--rotate]
                                    [--bulk]

``--global-x``: also time CTA-local with x read from global memory (the kernel stages a shared copy
of x at K <= 3); ``--rotate``: the rotation = 32 instances (x H computed in registers); ``--split-ctas``: also time the split kernel with these grid caps (fewer, fatter CTAs build the
lookup table fewer times); ``--pdl``: every call with programmatic dependent launch (back-to-back
calls of the same GEMV, as in the graph, overlap).

Prints one line per (shape, bits, kernel) with us and % of measured read bandwidth, and which
kernel the dispatch rule (lowbit.kernels.tiled.dense_path) picks.
"""

from __future__ import annotations

import argparse

import torch

import lowbit
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes, measure_read_bandwidth
from lowbit.kernels.tiled import (BULK_MAX_M, FLAG_GLOBAL_X, FLAG_LOCAL, FLAG_ROT32, STREAM_CTA_WARPS, bulk_ctas,
                                  counters, dense_path, gemv_warps, local_ctas, split_max_ctas, x_flag)
from lowbit.kernels.library import get_library, ptr, stream_of

SHAPES = [(8192, 28672), (28672, 8192), (4096, 14336), (2048, 10240), (2048, 4096), (2048, 512), (1024, 1024)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="2,3,4,5")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--shapes", default=None, help="comma-separated K_inxN (default: a fixed list)")
    ap.add_argument("--no-warps", action="store_true", help="stream-K at its default warp count only")
    ap.add_argument("--warps", default="", help="comma-separated stream-K warp counts to time (instead of the list)")
    ap.add_argument("--split-ctas", default="", help="comma-separated grid caps for the split kernel")
    ap.add_argument("--pdl", action="store_true", help="launch with programmatic dependent launch")
    ap.add_argument("--local-ctas", default="", help="comma-separated grids for the CTA-local mode (default: one wave)")
    ap.add_argument("--no-streamk", action="store_true", help="skip the global stream-K lines")
    ap.add_argument("--global-x", action="store_true", help="also time CTA-local with x read from global memory")
    ap.add_argument("--rotate", action="store_true", help="the kernels' rotation = 32 instances (x H in registers)")
    ap.add_argument("--bulk", action="store_true", help="also time the bulk-copy kernel (M = 1, unrotated)")
    ap.add_argument("--peers", action="store_true",
                    help="also time torch int4 (tinygemm, bf16) per shape and, once, a 1-element fill kernel "
                         "(the graph's per-launch floor)")
    args = ap.parse_args()
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    lib = get_library()
    bw = measure_read_bandwidth()
    print(f"read bandwidth {bw / 1e12:.3f} TB/s")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    if args.peers:
        tiny = torch.empty(1, device=dev)
        t = graph_time([lambda: tiny.zero_()] * 8, replays=10)
        print(f"floor: 1-element fill kernel {t.median_us:8.2f} us per launch")
    for k_in, n in shapes:
        for bits in map(int, args.bits.split(",")):
            q = lowbit.quantize_kbit(torch.randn(n, k_in, device=dev, dtype=torch.float16), bits=bits)
            qw, qa = q.tiled()
            nbytes = qw.numel() * 4 + qa.numel()
            copies = [(qw, qa)] + [(qw.clone(), qa.clone()) for _ in range(copies_for_cold(nbytes, l2_bytes()) - 1)]
            x = torch.randn(args.m, k_in, device=dev, dtype=torch.float16)
            y = torch.empty(args.m, n, device=dev, dtype=torch.float16)
            tiles, groups = -(-n // 16), -(-k_in // 256)
            units = tiles * groups
            full = gemv_warps(lib, dev, bits, torch.float16, args.m, n, k_in)
            cands = sorted({min(units, w) for w in (full, full // 2, full // 4, tiles, 2 * tiles, sms * 8, sms * 16, sms * 32)})
            if args.no_warps:
                cands = [full]
            if args.warps:
                cands = sorted({min(units, int(w)) for w in args.warps.split(",")})
            cnt = counters(dev, tiles)
            max_ctas = split_max_ctas(lib, dev, bits, torch.float16, 1)

            pdl = int(args.pdl) | (FLAG_ROT32 if args.rotate else 0)
            bulk = bulk_ctas(lib, dev, bits, torch.float16, args.m, n, k_in, FLAG_ROT32 if args.rotate else 0)
            picked = "bulk" if bulk else dense_path(lib, dev, bits, torch.float16, n, k_in)

            def split_call(c, ctas):
                a = [ptr(x), ptr(None), args.m, ptr(c[0]), ptr(c[1]), ptr(q.codebook), ptr(q.scale), ptr(y), ptr(None), 1, n,
                     k_in, ctas, pdl, None, stream_of(dev)]
                lib.call("kbit_split_gemv", a, bits=bits, dtype=torch.float16)

            for ctas in [max_ctas] + [int(v) for v in args.split_ctas.split(",") if v]:
                t = graph_time([lambda c=c, k=ctas: split_call(c, k) for c in copies], replays=10)
                pct = 100 * nbytes / (t.median_us * 1e-6) / bw
                tag = " <- auto" if ctas == max_ctas and picked == "split" else ""
                print(f"{k_in}x{n} K={bits} split-in-CTA ctas<={ctas:5d} {t.median_us:8.2f} us {pct:5.1f}%{tag}")
            for warps in [] if args.no_streamk else cands:
                ws = torch.empty(warps, 2, 128, device=dev)

                def call(c):
                    a = [ptr(x), ptr(c[0]), ptr(c[1]), ptr(q.codebook), ptr(q.scale), ptr(y), ptr(None), ptr(ws), ptr(cnt),
                         args.m, n, k_in, warps, pdl, None, stream_of(dev)]
                    lib.call("kbit_gemv", a, bits=bits, dtype=torch.float16, m=args.m)

                t = graph_time([lambda c=c: call(c) for c in copies], replays=10)
                pct = 100 * nbytes / (t.median_us * 1e-6) / bw
                tag = " <- auto" if warps == full and picked == "streamk" else ""
                print(f"{k_in}x{n} K={bits} stream-K warps={warps:6d} (units {units}) {t.median_us:8.2f} us {pct:5.1f}%{tag}")
            one_wave = local_ctas(lib, dev, bits, torch.float16, args.m, n)
            for ctas in [one_wave] + [min(tiles, int(v)) for v in args.local_ctas.split(",") if v]:
                def local_call(c, k=ctas, extra=0):
                    a = [ptr(x), ptr(c[0]), ptr(c[1]), ptr(q.codebook), ptr(q.scale), ptr(y), ptr(None), ptr(None),
                         ptr(None), args.m, n, k_in, STREAM_CTA_WARPS * k, pdl | FLAG_LOCAL | extra, None,
                         stream_of(dev)]
                    lib.call("kbit_gemv", a, bits=bits, dtype=torch.float16, m=args.m)

                t = graph_time([lambda c=c: local_call(c) for c in copies], replays=10)
                pct = 100 * nbytes / (t.median_us * 1e-6) / bw
                # the dispatcher's call: x staged (K <= 3) unless x_flag says global (then the "x global" line is it)
                global_x = bits <= 3 and x_flag(units, STREAM_CTA_WARPS * ctas) != 0
                auto = ctas == one_wave and picked == "local"
                tag = " <- auto" if auto and not global_x else ""
                print(f"{k_in}x{n} K={bits} stream-K CTA-local ctas={ctas:5d}        {t.median_us:8.2f} us {pct:5.1f}%{tag}")
                if args.global_x:  # the same, x read from global memory (no shared copy)
                    t = graph_time([lambda c=c: local_call(c, ctas, FLAG_GLOBAL_X) for c in copies], replays=10)
                    pct = 100 * nbytes / (t.median_us * 1e-6) / bw
                    tag = " <- auto" if auto and global_x else ""
                    print(f"{k_in}x{n} K={bits} stream-K CTA-local ctas={ctas:5d} x global {t.median_us:8.2f} us "
                          f"{pct:5.1f}%{tag}")
            ring_ctas = min(tiles, sms)
            if (args.bulk and args.m <= BULK_MAX_M and not args.rotate
                    and lib.symbol("kbit_bulk_gemv_ring", bits=bits)(n, ring_ctas, 0, args.m)):
                def bulk_call(c):
                    a = [ptr(x), ptr(c[0]), ptr(c[1]), ptr(q.codebook), ptr(q.scale), ptr(y), ptr(None), args.m, n, k_in,
                         ring_ctas, int(args.pdl), ptr(None), stream_of(dev)]
                    lib.call("kbit_bulk_gemv", a, bits=bits, dtype=torch.float16)

                t = graph_time([lambda c=c: bulk_call(c) for c in copies], replays=10)
                pct = 100 * nbytes / (t.median_us * 1e-6) / bw
                tag = " <- auto" if picked == "bulk" else ""
                print(f"{k_in}x{n} K={bits} bulk copies ctas={ring_ctas:5d}               {t.median_us:8.2f} us {pct:5.1f}%{tag}")
            if args.peers and bits == 4 and k_in % 128 == 0:
                from lowbit.bench.methods import INT4_GROUP, _int4_prepare

                w = torch.randn(n, k_in, device=dev, dtype=torch.bfloat16)
                packs = [_int4_prepare(w) for _ in range(len(copies))]
                xb = x.to(torch.bfloat16)
                t = graph_time([lambda p=p: torch.ops.aten._weight_int4pack_mm(xb, p[0], INT4_GROUP, p[1]) for p in packs],
                               replays=10)
                ib = packs[0][0].numel() * packs[0][0].element_size() + packs[0][1].numel() * 2
                print(f"{k_in}x{n} torch-int4 (tinygemm, bf16)        {t.median_us:8.2f} us {100 * ib / (t.median_us * 1e-6) / bw:5.1f}%")
                del packs
            del copies


if __name__ == "__main__":
    main()
