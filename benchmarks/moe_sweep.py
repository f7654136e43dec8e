"""MoE expert prefill / batched decode: one layer's routed experts (gate/up then down) for T tokens,
every grouped kbit path beside cuBLAS fp16 (best of a zero-padded bmm and a per-expert loop), cold:
the expert stacks are far larger than L2, so every call streams its weights from DRAM.

    python3 benchmarks/moe_sweep.py [--experts 512 --hidden 2048 --inter 512 --top-k 8]  (Qwen3-Coder-Next)
                                    [--tokens 1,8,64,512,4096] [--bits 4] [--no-cublas] [--json out.json]

Columns (us per layer = gate/up + down): grouped-gemv, grouped-gemm (its token tiles from the mean
rows per expert), grouped-gemm-tN (pinned to N token tiles of 8), auto (the dispatcher's choice),
cublas-bmm, cublas-loop; speedup = best cuBLAS / auto. Routing: top-k distinct experts per token,
uniform (--skew s: expert e drawn with weight 1 / (1 + e)^s).
"""

from __future__ import annotations

import argparse
import json

import torch

import lowbit
from lowbit import dispatch
from lowbit.bench.timing import graph_time
from lowbit.kernels import tiled
from lowbit.kernels.library import library_or_none


def route(tokens: int, experts: int, top_k: int, skew: float, gen: torch.Generator) -> torch.Tensor:
    """Per-expert counts: each token draws top_k distinct experts without replacement, expert e with
    weight 1 / (1 + e)^skew (Gumbel top-k; skew 0 = uniform)."""
    gumbel = -torch.log(-torch.log(torch.rand(tokens, experts, generator=gen).clamp_min(1e-20)))
    scores = gumbel - skew * torch.log1p(torch.arange(experts, dtype=torch.float32))
    return torch.bincount(scores.topk(top_k, dim=1).indices.flatten(), minlength=experts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--tokens", default="1,8,64,512,1024,2048,4096")
    ap.add_argument("--skew", type=float, default=0.0)
    ap.add_argument("--no-cublas", action="store_true")
    ap.add_argument("--nt", default="2,4,8", help="token tiles to pin in extra grouped-gemm-tN columns ('' for none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    e, h, i = args.experts, args.hidden, args.inter
    shapes = {"gate_up": (2 * i, h), "down": (h, i)}
    print(f"{torch.cuda.get_device_name(dev)}: {e} experts, gate/up {2 * i}x{h} + down {h}x{i}, top-{args.top_k}, "
          f"K={args.bits}, fp16, cold (stacks >> L2), us per layer", flush=True)
    lib = library_or_none(dev)
    stacks, fp16 = {}, {}
    for name, (n, k) in shapes.items():
        w = torch.randn(e, n, k, device=dev, dtype=torch.float16) * 0.02
        ex = lowbit.quantize_kbit_experts(w, bits=args.bits)
        qw, qa = ex.tiled()
        stacks[name] = (ex, qw, qa)
        if not args.no_cublas:
            fp16[name] = w
        else:
            del w
    pinned = [int(v) for v in args.nt.split(",") if v]
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        counts = route(t, e, args.top_k, args.skew, gen)
        off_cpu = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        off = off_cpu.to(dev)
        r = t * args.top_k
        xs = {name: torch.randn(r, k, device=dev, dtype=torch.float16) for name, (n, k) in shapes.items()}
        res = {"tokens": t, "rows": r, "max_rows": int(counts.max()), "active": int((counts > 0).sum())}

        def launchers(cls):
            return {name: cls(lib, qw, qa, ex.codebook, ex.scales, args.bits, *shapes[name])
                    for name, (ex, qw, qa) in stacks.items()}

        gv, gm = launchers(tiled.GroupedLauncher), launchers(tiled.GroupedGemmLauncher)
        cols = {"grouped-gemv": lambda nm: gv[nm](xs[nm], off), "grouped-gemm": lambda nm: gm[nm](xs[nm], off)}
        for nt in pinned:
            cols[f"grouped-gemm-t{nt}"] = lambda nm, nt=nt: gm[nm](xs[nm], off, nt=nt)
        cols["auto"] = lambda nm: lowbit.kbit_grouped_linear(xs[nm], off, stacks[nm][0])
        # correctness gate: every column equals the per-expert reference on a few active experts
        ref_exp = [int(v) for v in torch.nonzero(counts).flatten()[:3]]
        for col, fn in cols.items():
            for nm in shapes:
                y = fn(nm)
                ex, qw, qa = stacks[nm]
                for ei in ref_exp:
                    lo, hi = int(off_cpu[ei]), int(off_cpu[ei + 1])
                    ref = lowbit.ops.tiled_linear_reference(xs[nm][lo:hi].float(), qw[ei], qa[ei], ex.codebook,
                                                            ex.scales[ei], args.bits, *shapes[nm])
                    err = ((y[lo:hi].float() - ref).norm() / ref.norm().clamp(min=1e-30)).item()
                    if not err <= 2e-3:
                        raise SystemExit(f"{col} {nm} T={t} expert {ei}: rel err {err:.3g}")
            res[col] = graph_time([lambda fn=fn: [fn(nm) for nm in shapes]], replays=5, warmup=2).median_us
        res["auto_path"] = dispatch.grouped_path(xs["gate_up"], e)
        if not args.no_cublas:
            cmax = int(counts.max())
            act = [int(v) for v in torch.nonzero(counts).flatten()]
            pads = {}
            for nm, (n, k) in shapes.items():
                xp = torch.zeros(len(act), cmax, k, device=dev, dtype=torch.float16)
                for j, ei in enumerate(act):
                    xp[j, : counts[ei]] = xs[nm][off_cpu[ei]:off_cpu[ei + 1]]
                pads[nm] = (xp, fp16[nm][act] if len(act) < e else fp16[nm])
            res["cublas-bmm"] = graph_time([lambda: [torch.bmm(pads[nm][0], pads[nm][1].transpose(1, 2)) for nm in shapes]],
                                           replays=5, warmup=2).median_us
            del pads
            segs = [(ei, int(off_cpu[ei]), int(off_cpu[ei + 1])) for ei in act]

            def loop():
                for nm in shapes:
                    for ei, lo, hi in segs:
                        torch.nn.functional.linear(xs[nm][lo:hi], fp16[nm][ei])
            res["cublas-loop"] = graph_time([loop], replays=3, warmup=1).median_us
            res["speedup"] = min(res["cublas-bmm"], res["cublas-loop"]) / res["auto"]
        rows.append(res)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(dev), "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
