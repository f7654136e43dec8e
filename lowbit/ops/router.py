"""MoE router of a decode step: ``logits = x W^T``, softmax, top-k, optionally renormalized top-k weights
(the softmax routers of transformers' Qwen2/3-MoE, Qwen3-Next, OLMoE and Mixtral blocks). The reference is
their computation; CUDA: ``csrc/moe/router.cu`` for up to ROUTER_MAX_TOKENS tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import FLOAT_DTYPES, check_same_device, check_tensor

#: tokens per call the CUDA kernel takes (decode); more go through the reference (cuBLAS + torch)
ROUTER_MAX_TOKENS = 8
#: experts and top-k the CUDA kernel takes
ROUTER_MAX_EXPERTS = 1024
ROUTER_MAX_TOP_K = 64


def check_moe_router_args(x, weight, top_k) -> tuple[int, int, int]:
    """(tokens, experts, hidden) of valid arguments; raises otherwise."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    check_tensor("weight", weight, dtypes=(x.dtype,), dim=2)
    tokens, hidden = x.shape
    experts = weight.shape[0]
    if weight.shape[1] != hidden:
        raise ValueError(f"weight must be [experts, hidden={hidden}], got {tuple(weight.shape)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be an int in 1..experts={experts}, got {top_k!r}")
    check_same_device(x=x, weight=weight)
    return tokens, experts, hidden


@torch.library.custom_op("lowbit::moe_router", mutates_args=())
def moe_router(x: Tensor, weight: Tensor, top_k: int, normalize: bool, fp32_scores: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Route ``x [T, H]`` over ``weight [E, H]``: returns ``(logits [T, E]`` in x's dtype, ``scores [T, top_k]``,
    ``indices`` int64 ``[T, top_k])``: the top-k softmax probabilities (fp32 softmax over the rounded logits),
    highest first (ties: the lower expert), divided by their sum when ``normalize``; scores in x's dtype, or
    fp32 with ``fp32_scores``. A NaN logit makes its token's scores NaN."""
    check_moe_router_args(x, weight, top_k)
    return moe_router_reference(x, weight, top_k, normalize, fp32_scores)


@moe_router.register_fake
def _(x, weight, top_k, normalize, fp32_scores):
    tokens, experts, _ = check_moe_router_args(x, weight, top_k)
    return (x.new_empty((tokens, experts)), x.new_empty((tokens, top_k), dtype=torch.float32 if fp32_scores else x.dtype),
            x.new_empty((tokens, top_k), dtype=torch.int64))


def moe_router_reference(x, weight, top_k, normalize, fp32_scores):
    """transformers' computation (``Qwen3MoeTopKRouter.forward``; Mixtral's with fp32 scores)."""
    logits = torch.nn.functional.linear(x, weight)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top, idx = torch.topk(probs, top_k, dim=-1)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top if fp32_scores else top.to(logits.dtype), idx
