"""Op layer: one ``torch.library`` custom op per operation, under the ``lowbit::`` namespace.

Each op has
* a default implementation = the format's pure-PyTorch reference (runs on CPU, and on any
  device no kernel is registered for),
* a fake implementation (shapes/dtypes only) so ``torch.compile(fullgraph=True)`` traces it,
* device kernels registered by ``lowbit.kernels.*`` (CUDA), which override the default.
All three run the same metadata checks, so bad input fails the same way everywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import FLOAT_DTYPES, check_same_device, check_tensor
from .formats import kbit


def check_kbit_dequantize_args(planes, absmax, codebook, scale, bits, dtype) -> tuple[int, int]:
    kbit.check_kbit_tensors(planes, absmax, codebook, scale, bits)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of float16, bfloat16, float32, got {dtype}")
    return planes.shape[0], planes.shape[1] * kbit.BLOCK


def check_kbit_linear_args(x, planes, absmax, codebook, scale, bits) -> tuple[int, int, int]:
    kbit.check_kbit_tensors(planes, absmax, codebook, scale, bits)
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    n, k_in = planes.shape[0], planes.shape[1] * kbit.BLOCK
    if x.shape[1] != k_in:
        raise ValueError(f"x must have shape [M, K_in={k_in}] to match the weight, got {tuple(x.shape)}")
    check_same_device(x=x, planes=planes)
    return x.shape[0], n, k_in


# ------------------------------------------------------------------ kbit_dequantize
@torch.library.custom_op("lowbit::kbit_dequantize", mutates_args=())
def kbit_dequantize(
    planes: Tensor, absmax: Tensor, codebook: Tensor, scale: Tensor, bits: int, dtype: torch.dtype
) -> Tensor:
    """kbit weight -> dense ``[N, K_in]`` tensor of ``dtype``."""
    check_kbit_dequantize_args(planes, absmax, codebook, scale, bits, dtype)
    return kbit.dequantize_reference(planes, absmax, codebook, scale, bits, dtype)


@kbit_dequantize.register_fake
def _(planes, absmax, codebook, scale, bits, dtype):
    n, k_in = check_kbit_dequantize_args(planes, absmax, codebook, scale, bits, dtype)
    return planes.new_empty((n, k_in), dtype=dtype)


# ------------------------------------------------------------------ kbit_linear
@torch.library.custom_op("lowbit::kbit_linear", mutates_args=())
def kbit_linear(x: Tensor, planes: Tensor, absmax: Tensor, codebook: Tensor, scale: Tensor, bits: int) -> Tensor:
    """``x[M, K_in] @ W^T -> [M, N]`` in x's dtype, fp32 accumulation."""
    check_kbit_linear_args(x, planes, absmax, codebook, scale, bits)
    return kbit.linear_reference(x, planes, absmax, codebook, scale, bits)


@kbit_linear.register_fake
def _(x, planes, absmax, codebook, scale, bits):
    m, n, _ = check_kbit_linear_args(x, planes, absmax, codebook, scale, bits)
    return x.new_empty((m, n))


# CUDA kernels register themselves on import.
from .kernels import cuda_kbit as _cuda_kbit  # noqa: E402,F401
