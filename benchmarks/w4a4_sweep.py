"""W4A4 batched GEMV (GPU MODE ``nvfp4_gemv``) on the GPU, cold L2 (CUDA graphs over operand copies
>= 4x L2): us per call, % of the speed of light (bytes of a, sfa, b, sfb, c over the read bandwidth),
and the B200 speed of light the problem quotes, for scale. Also the activation quantizer alone and the
fp16-activation pipeline (quantize b on the fly + W4A4).

    python3 benchmarks/w4a4_sweep.py [--shapes 7168x16384x1,4096x7168x8,7168x2048x4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from lowbit import ops
from lowbit.formats import nvfp4
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes

# (M, K, L) of the current problem version, with the B200 speed of light it quotes (us)
SHAPES = {(7168, 16384, 1): 8.622, (4096, 7168, 8): 17.275, (7168, 2048, 4): 4.317}
READ_BW = 3.08e12  # H100 read bandwidth measured here (BENCHMARKS.md)


def operands(m, k, l_, gen):
    """Full-range codes and scales in GPU MODE's layout ([L, M, K/2] memory viewed [M, K/2, L])."""
    a = torch.randint(0, 256, (l_, m, k // 2), generator=gen, dtype=torch.uint8).cuda().permute(1, 2, 0)
    b = torch.randint(0, 256, (l_, 1, k // 2), generator=gen, dtype=torch.uint8).cuda().permute(1, 2, 0)
    sfa = torch.randint(0x08, 0x3c, (l_, m, k // 16), generator=gen, dtype=torch.uint8).cuda()
    sfb = torch.randint(0x08, 0x3c, (l_, 1, k // 16), generator=gen, dtype=torch.uint8).cuda()
    return a, b, sfa.view(torch.float8_e4m3fn).permute(1, 2, 0), sfb.view(torch.float8_e4m3fn).permute(1, 2, 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=None, help="comma-separated MxKxL")
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernel-only", action="store_true", help="skip the quantizer timings (experiment libraries)")
    args = ap.parse_args()
    shapes = list(SHAPES) if args.shapes is None else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    gen = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, cold L2, us (% of {READ_BW / 1e12:.2f} TB/s)")
    rows = []
    for m, k, l_ in shapes:
        nbytes = l_ * (m * k // 2 + m * k // 16 + k // 2 + k // 16 + 2 * m)
        sets = [operands(m, k, l_, gen) for _ in range(copies_for_cold(nbytes, l2_bytes()))]
        a, b, sfa, sfb = sets[0]
        ref = nvfp4.w4a4_gemv_reference(a.cpu(), b.cpu(), sfa.cpu(), sfb.cpu()).double()
        err = ((ops.nvfp4_w4a4_gemv(a, b, sfa, sfb).cpu().double() - ref).norm() / ref.norm()).item()
        if not err <= 1e-3:
            raise SystemExit(f"M={m} K={k} L={l_}: rel err {err:.3g}")
        t = graph_time([lambda s=s: ops.nvfp4_w4a4_gemv(*s) for s in sets], replays=10, warmup=3).median_us
        sol = nbytes / READ_BW * 1e6
        x = torch.randn(l_, k, device="cuda", dtype=torch.float16)
        one = torch.ones((), device="cuda")
        if args.kernel_only:
            print(f"M={m} K={k} L={l_}: {t:.2f} us "
                  f"H100 SOL {sol:.2f} us -> {100 * sol / t:.1f}%", flush=True)
            continue
        tq = graph_time([lambda: ops.nvfp4_quantize_act(x, one)], replays=10, warmup=3).median_us

        def pipeline(s):
            codes, scales = ops.nvfp4_quantize_act(x, one)
            return ops.nvfp4_w4a4_gemv(s[0], codes.t()[None], s[2], scales.t()[None])

        tp = graph_time([lambda s=s: pipeline(s) for s in sets], replays=10, warmup=3).median_us
        row = {"m": m, "k": k, "l": l_, "bytes": nbytes, "us": t, "rel_err": err,
               "sol_us": sol, "pct_sol": 100 * sol / t,
               "b200_sol_us": SHAPES.get((m, k, l_)), "quantize_us": tq, "quantize_plus_w4a4_us": tp}
        rows.append(row)
        print(f"M={m} K={k} L={l_}: {t:.2f} us H100 SOL {sol:.2f} us -> {row['pct_sol']:.1f}% "
              f"(B200 SOL {row['b200_sol_us']}); quantize b {tq:.2f} us, quantize + W4A4 {tp:.2f} us", flush=True)
        del sets
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "read_bw": READ_BW, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
