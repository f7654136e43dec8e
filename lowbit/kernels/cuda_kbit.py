"""CUDA implementations of the kbit ops (registered on the ``lowbit::`` ops for device 'cuda')."""

from __future__ import annotations

import warnings

import torch

from .. import ops
from ..formats import kbit
from .library import LibraryUnavailable, get_library, ptr, stream_of

_warned = False


def _library_or_none(device: torch.device):
    """The compiled library, or None (with one warning) so the op falls back to the reference."""
    global _warned
    try:
        return get_library(device)
    except LibraryUnavailable as e:
        if not _warned:
            warnings.warn(f"{e}; lowbit ops on CUDA fall back to the PyTorch reference (slow)", stacklevel=3)
            _warned = True
        return None


@ops.kbit_dequantize.register_kernel("cuda")
def _(planes, absmax, codebook, scale, bits, dtype):
    n, k_in = ops.check_kbit_dequantize_args(planes, absmax, codebook, scale, bits, dtype)
    lib = _library_or_none(planes.device)
    if lib is None:
        return kbit.dequantize_reference(planes, absmax, codebook, scale, bits, dtype)
    out = torch.empty((n, k_in), dtype=dtype, device=planes.device)
    args = [ptr(planes), ptr(absmax), ptr(codebook), ptr(scale), ptr(out), n * (k_in // kbit.BLOCK)]
    lib.call("kbit_dequant", [*args, stream_of(planes.device)], bits=bits, dtype=dtype)
    return out


@ops.kbit_linear.register_kernel("cuda")
def _(x, planes, absmax, codebook, scale, bits):
    # Dequantize (kernel) to x's dtype, then cuBLAS. Right for large M; decode-sized M gets a
    # fused GEMV once that kernel exists. Rounding W to fp16/bf16 before the product adds
    # at most one half-ulp per weight to the fp32 reference.
    m, n, k_in = ops.check_kbit_linear_args(x, planes, absmax, codebook, scale, bits)
    w = ops.kbit_dequantize(planes, absmax, codebook, scale, bits, x.dtype)
    return torch.nn.functional.linear(x, w)
