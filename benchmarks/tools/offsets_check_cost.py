"""What the device-side expert-offsets check costs (GPU): the grouped kbit4 op with and without it.

    python3 benchmarks/tools/offsets_check_cost.py

Offsets that live on the GPU are checked by one extra 1-CTA launch (csrc/expert_offsets.cu) before
the grouped kernel; lowbit's own MoE modules build valid offsets and skip it. This times both, as a
decode step sees them (CUDA graph, weights rotated over copies larger than L2), on Qwen3-30B-A3B's
expert shapes (128 experts, hidden 2048, expert intermediate 768, top-8) at 1 and 8 tokens.
"""

from __future__ import annotations

import torch

import lowbit
from lowbit import dispatch
from lowbit.bench.timing import copies_for_cold, graph_time, l2_bytes


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    E, H, I, top_k = 128, 2048, 768, 8
    print(f"{torch.cuda.get_device_name()}; kbit4 grouped op, {E} experts, top-{top_k}; median of 20 graph replays")
    print(f"{'projection':>18} {'tokens':>6} {'checked us':>11} {'unchecked us':>13} {'cost us':>8}")
    for name, (n, k) in {"gate|up 2048->1536": (2 * I, H), "down 768->2048": (H, I)}.items():
        w = torch.randn(E, n, k, device=dev, generator=g, dtype=torch.bfloat16)
        experts = lowbit.quantize_kbit_experts(w, bits=4)
        del w
        qweight, qabsmax = experts.tiled()
        copies = copies_for_cold(qweight.nbytes + qabsmax.nbytes, l2_bytes())
        stacks = [(qweight.clone(), qabsmax.clone()) for _ in range(copies)]
        for tokens in (1, 8):
            rows = tokens * top_k
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16, generator=g)
            chosen = torch.randperm(E, device=dev, generator=g)[:rows].sort().values  # distinct experts, sorted
            counts = torch.bincount(chosen, minlength=E)
            offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
            out = {}
            for check in (True, False):
                calls = [lambda q=q, a=a, c=check: dispatch.kbit_grouped_op(
                    x, offsets, q, a, experts.codebook, experts.scales, 4, n, k, c) for q, a in stacks]
                out[check] = graph_time(calls).median_us
            print(f"{name:>18} {tokens:>6} {out[True]:>11.2f} {out[False]:>13.2f} {out[True] - out[False]:>8.2f}")


if __name__ == "__main__":
    main()
