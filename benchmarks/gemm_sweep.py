"""Every dense kbit path at every batch size, beside cuBLAS fp16 and torch int4, cold L2: the data
behind the dispatcher's GEMM / dequantize + cuBLAS crossover (lowbit/data/kbit_dispatch.json).

    python3 benchmarks/gemm_sweep.py [--bits 4] [--shapes 8192x28672,28672x8192] [--m 1,8,16,...]
                                     [--json out.json]

Paths: gemv (M <= 8), gemm (the tensor-core kbit GEMM, any M; with --tiles-per-warp also gemm-r1 /
gemm-r2, its one- and two-tiles-per-warp instances pinned), dequant (the tiled dequantize kernel +
cuBLAS), what the dispatcher picks ("auto"); peers: cublas-fp16, torch-int4 (tinygemm, bf16, g128).
Prints us per call and, per shape, the largest M at which the GEMM is still no slower than dequant +
cuBLAS (the crossover).
"""

from __future__ import annotations

import argparse
import json

import torch

import lowbit
from lowbit import dispatch
from lowbit.bench.crossover import path_time
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes
from lowbit.kernels import tiled

SHAPES = [(8192, 28672), (28672, 8192), (4096, 4096), (4096, 14336)]
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2048]


def cold_time(fns: list) -> float:
    return graph_time(fns, replays=8, warmup=2).median_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--shapes", default=None, help="comma-separated K_inxN")
    ap.add_argument("--m", default=",".join(map(str, MS)))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--tiles-per-warp", action="store_true",
                    help="also time the GEMM with 1 and 2 row tiles per warp pinned (columns gemm-r1, gemm-r2)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.m.split(",")]
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}, K={args.bits}, fp16 activations, cold L2, us per call")
    rows = []
    for k_in, n in shapes:
        w = torch.randn(n, k_in, device=dev, dtype=torch.float16)
        q = lowbit.quantize_kbit(w, bits=args.bits)
        q.tiled()
        kb = q.nbytes()
        qs = [q] + [lowbit.quantize_kbit(w, bits=args.bits) for _ in range(copies_for_cold(kb, l2_bytes()) - 1)]
        for c in qs:
            c.tiled()
        ws = [w] + [w.clone() for _ in range(copies_for_cold(w.numel() * 2, l2_bytes()) - 1)]
        int4 = []
        if not args.no_peers and k_in % 128 == 0:
            from lowbit.bench.methods import INT4_GROUP, _int4_prepare

            int4 = [_int4_prepare(v.to(torch.bfloat16)) for v in ws[: copies_for_cold(n * k_in // 2, l2_bytes())]]
        for m in ms:
            x = torch.randn(m, k_in, device=dev, dtype=torch.float16)
            res = {"k_in": k_in, "n": n, "m": m}

            for path in ("gemv", "gemm", "gemm-r1", "gemm-r2", "dequant", "auto"):
                if (path == "gemv" and m > dispatch.GEMV_MAX_M) or (path.startswith("gemm-") and not args.tiles_per_warp):
                    continue
                p = {"dequant": "dequant_matmul", "auto": None}.get(path, path.split("-")[0])
                tiled.GEMM_TILES_PER_WARP = int(path[-1]) if path.startswith("gemm-") else None
                try:
                    res[path] = path_time(x, qs, p, replays=8)
                finally:
                    tiled.GEMM_TILES_PER_WARP = None
            res["auto_path"] = dispatch.kbit_path(x, n)
            if not args.no_peers:
                res["cublas-fp16"] = cold_time([lambda v=v, x=x: torch.nn.functional.linear(x, v) for v in ws])
                if int4:
                    xb = x.to(torch.bfloat16)
                    res["torch-int4"] = cold_time(
                        [lambda p=p, xb=xb: torch.ops.aten._weight_int4pack_mm(xb, p[0], INT4_GROUP, p[1]) for p in int4])
            rows.append(res)
            cols = " ".join(f"{k}={v:9.1f}" for k, v in res.items() if isinstance(v, float))
            print(f"{k_in}x{n} M={m:5d} {cols}  auto->{res['auto_path']}", flush=True)
        cross = [r["m"] for r in rows if (r["k_in"], r["n"]) == (k_in, n) and r["m"] > 8 and r["gemm"] <= r["dequant"]]
        print(f"{k_in}x{n}: GEMM no slower than dequant+cuBLAS up to M={max(cross) if cross else None}", flush=True)
        del qs, ws, int4
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(dev), "bits": args.bits, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
