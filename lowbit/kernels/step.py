"""CUDA implementations of the decode step's elementwise ops, ``lowbit::rms_norm`` and ``lowbit::silu_mul``
(csrc/step/)."""

from __future__ import annotations

import ctypes

import torch

from .. import ops
from .device import pdl_supported
from .library import library_or_none, ptr, register_signatures, stream_of
from .tiled import _pdl_arg

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
register_signatures({
    # x, weight, y, rows, n, eps, flags (bit 0: PDL), stream
    "rms_norm": [_P, _P, _P, _I, _I, _F, _I, _P],
    # x [rows, 2 n], y [rows, n], rows, n, flags (bit 0: PDL), stream
    "silu_mul": [_P, _P, _I, _I, _I, _P],
})

_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


#: launch flag: trigger the next kernel at entry (csrc/step/step.cuh)
FLAG_EARLY = 2


@ops.rms_norm.register_kernel("cuda")
def _(x, weight, eps, trigger_early=False):
    n = ops.check_rms_norm_args(x, weight, eps)
    lib = library_or_none(x.device)
    rows = x.numel() // n
    if lib is None or x.dtype not in _KERNEL_DTYPES or rows >= 2 ** 31:
        return ops.rms_norm_reference(x, weight, eps)
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty_like(x)
    if rows:
        lib.call("rms_norm", [ptr(x), ptr(weight), ptr(y), rows, n, eps,
                              _pdl_arg(pdl_supported(x.device), FLAG_EARLY if trigger_early else 0),
                              stream_of(x.device)], dtype=x.dtype)
    return y


@ops.silu_mul.register_kernel("cuda")
def _(x, trigger_early=False):
    i = ops.check_silu_mul_args(x)
    lib = library_or_none(x.device)
    rows = x.numel() // (2 * i)
    if lib is None or x.dtype not in _KERNEL_DTYPES or rows >= 2 ** 31:
        return ops.silu_mul_reference(x)
    x = x.contiguous()
    y = x.new_empty((*x.shape[:-1], i))
    if rows:
        lib.call("silu_mul", [ptr(x), ptr(y), rows, i, _pdl_arg(pdl_supported(x.device), FLAG_EARLY if trigger_early else 0),
                              stream_of(x.device)], dtype=x.dtype)
    return y
