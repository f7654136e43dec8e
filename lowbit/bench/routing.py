"""Random top-k MoE routing for decode benchmarks."""

from __future__ import annotations

import torch


def route(m: int, experts: int, top_k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each of ``m`` tokens picks ``top_k`` distinct experts uniformly at random.

    Returns per-expert token counts ``[experts]`` (int64), which sum to ``m * top_k``.
    """
    if m < 0 or not (0 < top_k <= experts):
        raise ValueError(f"need m >= 0 and 0 < top_k <= experts, got m={m}, top_k={top_k}, experts={experts}")
    if m == 0:
        return torch.zeros(experts, dtype=torch.int64)
    scores = torch.rand(m, experts, generator=generator)
    chosen = scores.topk(top_k, dim=1).indices  # distinct per token
    return torch.bincount(chosen.flatten(), minlength=experts)


def expert_offsets(counts: torch.Tensor) -> torch.Tensor:
    """Counts ``[E]`` -> offsets ``[E + 1]`` into the expert-sorted token rows."""
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])
