"""The unquantized (fp16/bf16) decode GEMV op."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_same_device, check_tensor

def check_dense_gemv_args(x, weight) -> tuple[int, int, int]:
    check_tensor("weight", weight, dtypes=(torch.float16, torch.bfloat16), dim=2)
    check_tensor("x", x, dtypes=(weight.dtype,), dim=2)
    n, k = weight.shape
    if x.shape[1] != k:
        raise ValueError(f"x must have shape [M, K={k}] to match weight [N, K], got {tuple(x.shape)}")
    if not 1 <= x.shape[0] <= 4:
        raise ValueError(f"dense_gemv takes M = 1..4 rows of x, got {x.shape[0]} (use torch.nn.functional.linear)")
    if n < 1 or k < 1:
        raise ValueError(f"weight must be non-empty, got shape {tuple(weight.shape)}")
    if n >= 2**31 or k >= 2**31:
        raise ValueError(f"weight dimensions must be < 2^31, got {tuple(weight.shape)}")
    check_same_device(x=x, weight=weight)
    return x.shape[0], n, k


def dense_gemv_reference(x: Tensor, weight: Tensor) -> Tensor:
    """The definition: fp32 products and sums, rounded once to x's dtype."""
    return (x.float() @ weight.float().t()).to(x.dtype)


@torch.library.custom_op("lowbit::dense_gemv", mutates_args=())
def dense_gemv(x: Tensor, weight: Tensor) -> Tensor:
    """Decode GEMV ``x[M<=4, K] @ weight[N, K]^T`` for fp16/bf16 weights, fp32 accumulation."""
    check_dense_gemv_args(x, weight)
    return dense_gemv_reference(x, weight)


@dense_gemv.register_fake
def _(x, weight):
    m, n, _ = check_dense_gemv_args(x, weight)
    return x.new_empty((m, n))

