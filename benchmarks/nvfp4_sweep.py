"""NVFP4 W4A16 on the GPU beside kbit4, cuBLAS fp16 and torch int4, cold L2 (CUDA graphs over weight
copies >= 4x L2): us per call and % of the measured read bandwidth (weight + scale + x + y bytes).

    python3 benchmarks/nvfp4_sweep.py [--shapes 8192x28672,28672x8192] [--m 1,2,4,8,16,32,64] [--json out.json]

Columns: nvfp4 (lowbit.ops.nvfp4_gemv for M <= 8, nvfp4_gemm above: the tiled layout), nvfp4-plain
(lowbit.ops.nvfp4_plain_gemv: the checkpoint layout, M <= 8 in one pass), nvfp4-gemm (the GEMM at every M),
kbit4 (lowbit.kbit_linear, the dispatcher's path), cublas-fp16, torch-int4 (tinygemm, g128).
"""

from __future__ import annotations

import argparse
import json

import torch

import lowbit
from lowbit.bench.methods import INT4_GROUP, _int4_prepare
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes

SHAPES = [(8192, 28672), (28672, 8192), (4096, 14336), (4096, 4096)]
READ_BW = 3.08e12  # H100 read bandwidth measured here (BENCHMARKS.md); % columns use it


def cold(fns) -> float:
    return graph_time(fns, replays=8, warmup=2).median_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=None, help="comma-separated K_inxN")
    ap.add_argument("--m", default="1,2,4,8,16,32,64")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, help="comma-separated columns to time (default: all)")
    ap.add_argument("--no-check", action="store_true", help="skip the accuracy check (timing-only experiment libraries)")
    args = ap.parse_args()
    shapes = SHAPES if args.shapes is None else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.m.split(",")]
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}, fp16 activations, cold L2, us per call (% of {READ_BW / 1e12:.2f} TB/s)")
    rows = []
    for k, n in shapes:
        w = torch.randn(n, k, device=dev, dtype=torch.float16)
        want = (lambda c: True) if args.only is None else (lambda c: c in args.only.split(","))
        q0 = lowbit.quantize_nvfp4(w)
        fp4 = [q0] + [lowbit.quantize_nvfp4(w) for _ in range(copies_for_cold(q0.nbytes(), l2_bytes()) - 1)]
        if want("nvfp4") or want("nvfp4-gemm") or not args.no_check:
            for q in fp4:
                q.tiled()
        kb0 = lowbit.quantize_kbit(w, bits=4) if want("kbit4") else None
        kb = [kb0] + [lowbit.quantize_kbit(w, bits=4) for _ in range(copies_for_cold(kb0.nbytes(), l2_bytes()) - 1)] if kb0 else []
        for q in kb:
            q.tiled()
        ws = [w] + [w.clone() for _ in range(copies_for_cold(w.numel() * 2, l2_bytes()) - 1)] if want("cublas-fp16") or want("torch-int4") else [w]
        int4 = [_int4_prepare(v.to(torch.bfloat16)) for v in ws[: copies_for_cold(n * k // 2, l2_bytes())]] \
            if k % 128 == 0 and want("torch-int4") else []
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=torch.float16)
            io = 2 * m * (k + n)

            def nv(q, gemm=False):
                qw, qs = q.tiled()
                op = lowbit.ops.nvfp4_gemm if (gemm or m > 8) else lowbit.ops.nvfp4_gemv
                return op(x, qw, qs, q.scale_2, n, k)

            err = float("nan")
            if not args.no_check:
                ref = x.double() @ q0.dequantize(torch.float64).t()
                err = ((nv(q0).double() - ref).norm() / ref.norm()).item()
                plain = lowbit.ops.nvfp4_plain_gemv(x, q0.packed, q0.scales, q0.scale_2)
                err = max(err, ((plain.double() - ref).norm() / ref.norm()).item())
                if not err <= 1e-3:
                    raise SystemExit(f"{k}x{n} M={m}: nvfp4 rel err {err:.3g}")
            res = {"k": k, "n": n, "m": m, "nvfp4_rel_err": err}
            if want("nvfp4"):
                res["nvfp4"] = cold([lambda q=q: nv(q) for q in fp4])
            if want("nvfp4-plain"):
                res["nvfp4-plain"] = cold([lambda q=q: lowbit.ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2)
                                           for q in fp4])
            if want("nvfp4-gemm"):
                res["nvfp4-gemm"] = cold([lambda q=q: nv(q, True) for q in fp4])
            if want("kbit4"):
                res["kbit4"] = cold([lambda q=q: lowbit.kbit_linear(x, q) for q in kb])
            if want("cublas-fp16"):
                res["cublas-fp16"] = cold([lambda v=v: torch.nn.functional.linear(x, v) for v in ws])
            if int4 and want("torch-int4"):
                xb = x.to(torch.bfloat16)
                res["torch-int4"] = cold([lambda p=p: torch.ops.aten._weight_int4pack_mm(xb, p[0], INT4_GROUP, p[1]) for p in int4])
            if "nvfp4" in res:
                res["nvfp4_bw_pct"] = 100 * (q0.nbytes() + io) / (res["nvfp4"] * 1e-6) / READ_BW
            if "nvfp4-plain" in res:
                res["plain_bw_pct"] = 100 * (q0.nbytes() + io) / (res["nvfp4-plain"] * 1e-6) / READ_BW
            if "kbit4" in res:
                res["kbit4_bw_pct"] = 100 * (kb0.nbytes() + io) / (res["kbit4"] * 1e-6) / READ_BW
            rows.append(res)
            print(" ".join(f"{kk}={v:.1f}" if isinstance(v, float) and kk != "nvfp4_rel_err" else f"{kk}={v}"
                           for kk, v in res.items()), flush=True)
        del fp4, kb, ws, int4
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(dev), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
