"""Grouped (MoE) NVFP4 GEMV beside kbit4's, cold: 512 experts [N, K] (default Qwen3-Coder-Next's
gate/up 1024x2048), ``tokens`` tokens routed top-8 to distinct experts; every replay of the CUDA graph
set uses another routing, so the experts' weights stream from DRAM. us per call and % of the read
bandwidth over the active experts' bytes.

    python3 benchmarks/nvfp4_moe.py [--experts 512] [--n 1024] [--k 2048] [--tokens 1,4]
"""

from __future__ import annotations

import argparse

import torch

import lowbit
from lowbit.bench.timing import graph_time

READ_BW = 3.08e12


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=512)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--tokens", default="1,4")
    args = ap.parse_args()
    e, n, k = args.experts, args.n, args.k
    w = torch.randn(e, n, k, device="cuda", dtype=torch.float16)
    fp4 = lowbit.quantize_nvfp4_experts(w)
    kb = lowbit.quantize_kbit_experts(w, bits=4)
    del w
    gen = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, {e} experts [{n}, {k}], top-8, cold; us (% of {READ_BW / 1e12:.2f} TB/s)")
    for tokens in map(int, args.tokens.split(",")):
        rows = 8 * tokens
        x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        routings = []
        for _ in range(64):  # distinct experts per routing, rows spread over them
            active = torch.randperm(e, generator=gen)[:8]
            counts = torch.zeros(e, dtype=torch.int64)
            counts[active] = tokens
            routings.append(torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).cuda())
        per_expert = n * k // 2 + n * k // 16
        t_fp4 = graph_time([lambda o=o: lowbit.nvfp4_grouped_linear(x, o, fp4) for o in routings], replays=8, warmup=2).median_us
        t_kb = graph_time([lambda o=o: lowbit.kbit_grouped_linear(x, o, kb) for o in routings], replays=8, warmup=2).median_us
        bw = lambda t, b: 100 * 8 * b / (t * 1e-6) / READ_BW  # noqa: E731
        print(f"tokens={tokens}: nvfp4 {t_fp4:.1f} us ({bw(t_fp4, per_expert):.0f}%), kbit4 {t_kb:.1f} us "
              f"({bw(t_kb, n * k // 2 + n * k // 32):.0f}%)", flush=True)


if __name__ == "__main__":
    main()
