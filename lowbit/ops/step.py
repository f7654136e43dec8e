"""The decode step's elementwise ops between lowbit's GEMVs: RMSNorm and the gated MLP's SiLU-mul. Each
reference is transformers' own arithmetic (LlamaRMSNorm; ``act_fn(gate) * up`` with SiLU), so swapping
them in changes no rounding step; CUDA: ``csrc/step/`` (kernels that take part in programmatic dependent
launch, so the next GEMV starts loading weights while they run)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import FLOAT_DTYPES, check_same_device, check_tensor


def check_rms_norm_args(x, weight, eps) -> int:
    """The row length of valid arguments; raises otherwise."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, contiguous=False)
    check_tensor("weight", weight, dtypes=(x.dtype,), dim=1, contiguous=False)
    if x.dim() < 1 or x.shape[-1] != weight.shape[0] or x.shape[-1] < 1:
        raise ValueError(f"x must be [..., N={weight.shape[0]}] (N >= 1), got {tuple(x.shape)}")
    if not (isinstance(eps, float) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")
    check_same_device(x=x, weight=weight)
    return x.shape[-1]


@torch.library.custom_op("lowbit::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float, trigger_early: bool = False) -> Tensor:
    """``weight * (x * rsqrt(mean(x^2, -1) + eps))`` over the last dim, as transformers' LlamaRMSNorm computes
    it: in fp32, the normalized value rounded to x's dtype, then multiplied by ``weight`` (x's dtype) and
    rounded again. Returns a tensor of x's shape and dtype. ``trigger_early`` (CUDA, under programmatic launch):
    let the next kernel start before this one waits for its predecessor -- only when the next kernel is one of
    lowbit's GEMVs, which wait for this one before reading anything but their weights (csrc/step/step.cuh)."""
    check_rms_norm_args(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


@rms_norm.register_fake
def _(x, weight, eps, trigger_early=False):
    check_rms_norm_args(x, weight, eps)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def check_silu_mul_args(x) -> int:
    """Half the last dim of valid arguments (the gate's width); raises otherwise."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, contiguous=False)
    if x.dim() < 1 or x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must be [..., 2 I] (gate | up, I >= 1), got {tuple(x.shape)}")
    return x.shape[-1] // 2


@torch.library.custom_op("lowbit::silu_mul", mutates_args=())
def silu_mul(x: Tensor, trigger_early: bool = False) -> Tensor:
    """``silu(gate) * up`` of a fused gate|up projection's output ``x [..., 2 I]`` (gate first), as transformers'
    gated MLPs compute ``act_fn(gate_proj(x)) * up_proj(x)``: SiLU in fp32 rounded to x's dtype, the product
    rounded again. Returns ``[..., I]`` in x's dtype. ``trigger_early``: as :func:`rms_norm`'s."""
    check_silu_mul_args(x)
    return silu_mul_reference(x)


@silu_mul.register_fake
def _(x, trigger_early=False):
    i = check_silu_mul_args(x)
    return x.new_empty((*x.shape[:-1], i))


def silu_mul_reference(x: Tensor) -> Tensor:
    i = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :i]) * x[..., i:]
