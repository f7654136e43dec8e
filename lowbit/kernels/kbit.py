"""CUDA implementations of kbit's ops (registered on the ``lowbit::kbit_*`` ops for device 'cuda'):
dequantize from bit planes, and the tiled-layout GEMV / GEMM / grouped / dequantize kernels through
the shared launchers of :mod:`.tiled`."""

from __future__ import annotations

import ctypes

import torch

from .. import ops
from ..formats import kbit
from ..formats.kbit import tiled as kbit_tiled
from .library import library_or_none, ptr, register_signatures, stream_of
from .tiled import (GemmLauncher, GemvLauncher, GroupedGemmLauncher, GroupedLauncher, RoutedLauncher,
                    check_offsets_on_device, kbit_format, run_gemv_epilogue, tiled_signatures, with_bias)

_P, _I64, _I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
register_signatures({
    # planes, absmax, codebook, scale, out, n_blocks, stream
    "kbit_dequant": [_P, _P, _P, _P, _P, _I64, _P],
    # qweight, qabsmax, codebook, scale, out [n, k_in], n, k_in, stream
    "kbit_tiled_dequant": [_P, _P, _P, _P, _P, _I, _I, _P],
    **tiled_signatures("kbit", grouped_gemm=True, routed=True, bulk=True),
})


@ops.kbit_dequantize.register_kernel("cuda")
def _(planes, absmax, codebook, scale, bits, dtype):
    n, k_in = ops.check_kbit_dequantize_args(planes, absmax, codebook, scale, bits, dtype)
    lib = library_or_none(planes.device)
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


@ops.kbit_gemm.register_kernel("cuda")
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None):
    ops.check_kbit_gemm_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    lib = library_or_none(x.device)
    if lib is None:
        return ops.gemv_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    if x.shape[0] == 0:
        return x.new_empty((0, n))
    launch = GemmLauncher(lib, qweight, qabsmax, codebook, scale, kbit_format(bits), n, k_in)
    return with_bias(lambda b: launch(x, b), x, bias)


@ops.kbit_gemv.register_kernel("cuda")
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None, rotation=0):
    ops.check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rotation)
    lib = library_or_none(x.device)
    if lib is None:
        return ops.gemv_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rotation)
    launch = GemvLauncher(lib, qweight, qabsmax, codebook, scale, kbit_format(bits), n, k_in, rotation)
    return with_bias(lambda b: launch(x, x.shape[0], (x.shape[0], n), b), x, bias)


@ops.kbit_gemv_epilogue.register_kernel("cuda")
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None, rms_x=None, eps=1e-6, residual=None,
      norm_weight=None, swiglu=False):
    m = ops.check_gemv_epilogue_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rms_x, residual,
                                     norm_weight, swiglu)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:  # the kernels are fp16/bf16 only
        return ops.gemv_epilogue_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rms_x, eps,
                                           residual, norm_weight, swiglu)
    return run_gemv_epilogue(GemvLauncher(lib, qweight, qabsmax, codebook, scale, kbit_format(bits), n, k_in),
                             x, m, bias, rms_x, eps, residual, norm_weight, swiglu)


@ops.kbit_grouped_gemv.register_kernel("cuda")
def _(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in, check_offsets=True):
    ops.check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:  # the kernel is fp16/bf16 only
        return ops.grouped_reference(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    offsets = expert_offsets.contiguous()
    if check_offsets:
        check_offsets_on_device(lib, offsets, x.shape[0])
    return GroupedLauncher(lib, qweight, qabsmax, codebook, scales, kbit_format(bits), n, k_in)(x, offsets)


@ops.kbit_routed_gemv.register_kernel("cuda")
def _(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x=1, swiglu=False):
    ops.check_kbit_routed_args(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x, swiglu)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32 or route_ids.shape[0] > ops.ROUTED_MAX_ROUTES:
        return ops.routed_reference(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x, swiglu)
    launch = RoutedLauncher(lib, qweight, qabsmax, codebook, scales, kbit_format(bits), n, k_in)
    return launch(x.contiguous(), route_ids.contiguous(), rows_per_x, swiglu)


@ops.kbit_grouped_gemm.register_kernel("cuda")
def _(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in, check_offsets=True):
    ops.check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:
        return ops.grouped_reference(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    offsets = expert_offsets.contiguous()
    if check_offsets:
        check_offsets_on_device(lib, offsets, x.shape[0])
    return GroupedGemmLauncher(lib, qweight, qabsmax, codebook, scales, kbit_format(bits), n, k_in)(x, offsets)


def tiled_dequantize(qweight, qabsmax, codebook, scale, bits, n, k_in, dtype) -> torch.Tensor:
    """Dense [n, k_in] weight: the CUDA kernel for fp16/bf16 (bit-identical to the reference), else the reference."""
    lib = library_or_none(qweight.device)
    aligned = qweight.data_ptr() % 16 == 0 and qabsmax.data_ptr() % 16 == 0
    if lib is None or dtype == torch.float32 or not aligned:
        return kbit_tiled.dequantize(qweight, qabsmax, codebook, scale, bits, n, k_in, dtype)
    out = torch.empty((n, k_in), dtype=dtype, device=qweight.device)
    lib.call("kbit_tiled_dequant", [ptr(qweight), ptr(qabsmax), ptr(codebook), ptr(scale), ptr(out), n, k_in,
                                    stream_of(qweight.device)], bits=bits, dtype=dtype)
    return out


@ops.kbit_tiled_dequantize.register_kernel("cuda")
def _(qweight, qabsmax, codebook, scale, bits, n, k_in, dtype):
    ops.check_tiled_args(qweight, qabsmax, codebook, scale, bits, n, k_in)
    ops.common._check_out_dtype(dtype)
    return tiled_dequantize(qweight, qabsmax, codebook, scale, bits, n, k_in, dtype)


@ops.kbit_tiled_linear.register_kernel("cuda")
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None):
    # Large M (prefill, MLA cache expansion): the weight decoded to x's dtype by the tiled dequantize
    # kernel, then cuBLAS. Rounding W to fp16/bf16 adds at most half an ulp per weight to the fp32 reference.
    ops.check_kbit_tiled_linear_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    w = tiled_dequantize(qweight, qabsmax, codebook, scale, bits, n, k_in, x.dtype)
    return torch.nn.functional.linear(x, w, None if bias is None else bias.to(x.dtype))
