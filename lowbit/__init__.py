"""lowbit: low-bit weight kernels for LLM decoding on NVIDIA GPUs.

Public API (every function works on CPU through the PyTorch reference, and on CUDA through
the compiled kernels where one exists):

    w = lowbit.quantize_kbit(weight, bits=4)      # KbitWeight
    W = lowbit.dequantize_kbit(w, torch.float16)  # [N, K_in]
    y = lowbit.kbit_linear(x, w)                  # x[..., K_in] -> y[..., N]
"""

from __future__ import annotations

import torch

from . import ops
from ._checks import check_tensor
from .formats import e4m4, kbit
from .formats.kbit import KbitWeight, normal_float_codebook
from .formats.kbit import quantize as quantize_kbit

__version__ = "0.1.0"


def _check_weight(w: object) -> KbitWeight:
    if not isinstance(w, KbitWeight):
        raise TypeError(f"w must be a lowbit KbitWeight (from lowbit.quantize_kbit), got {type(w).__name__}")
    return w


def dequantize_kbit(w: KbitWeight, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Dense ``[N, K_in]`` weight of ``dtype`` from a :class:`KbitWeight`."""
    _check_weight(w)
    return ops.kbit_dequantize(*w.tensors(), w.bits, dtype)


def kbit_linear(x: torch.Tensor, w: KbitWeight) -> torch.Tensor:
    """``x[..., K_in] @ W^T -> [..., N]`` in x's dtype (fp16/bf16/fp32), fp32 accumulation.

    Leading dimensions of ``x`` are flattened; a batch of 0 rows gives an empty result.
    """
    _check_weight(w)
    check_tensor("x", x, contiguous=True)
    if x.dim() < 1:
        raise ValueError(f"x must have at least 1 dimension [..., K_in], got shape {tuple(x.shape)}")
    lead = x.shape[:-1]
    y = ops.kbit_linear(x.reshape(-1, x.shape[-1]), *w.tensors(), w.bits)
    return y.reshape(*lead, y.shape[-1])


__all__ = [
    "KbitWeight",
    "dequantize_kbit",
    "e4m4",
    "kbit",
    "kbit_linear",
    "normal_float_codebook",
    "ops",
    "quantize_kbit",
]
