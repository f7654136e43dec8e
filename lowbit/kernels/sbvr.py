"""CUDA implementations of SBVR's ops: the activation encoder, the popcount GEMV on the binary tensor cores
and the dequantize (``csrc/sbvr/gemv.cu``), the weight-only lookup GEMV (``csrc/sbvr/lookup_gemv.cu``)."""

from __future__ import annotations

import ctypes

import torch

from .. import ops
from ..formats import sbvr
from ..formats.sbvr import tiled as sbvr_tiled
from .library import library_or_none, ptr, register_signatures, stream_of
from .tiled import check_offsets_on_device, with_bias

_P, _I = ctypes.c_void_p, ctypes.c_int
register_signatures({
    # x, xq, xs, m, k, group, stream
    "sbvr_encode_x": [_P, _P, _P, _I, _I, _I, _P],
    # qbits, qidx, cache8, xq, xs, bias (null: none), y, n, k, group, warps per CTA (0: the kernel's rule), stream
    "sbvr_gemv": [_P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _P],
    # qbits, qidx, cache8, out [n, k], n, k, group, stream
    "sbvr_dequant": [_P, _P, _P, _P, _I, _I, _I, _P],
    # qbits [E, ...], qidx [E, ...], cache8, cache_offsets int32 [E + 1], expert_offsets int64 [E + 1], xq, xs, y,
    # rows, E, n, k, group, warps (0: the rule), stream
    "sbvr_grouped_gemv": [_P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _P],
    # qcodes, qidx, cache8, x, bias (null: none), y, n, k, group, warps per CTA (0: the rule), stream
    # (csrc/sbvr/lookup_gemv.cu)
    "sbvr_lookup_gemv": [_P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _P],
})

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
#: warps per CTA of both GEMVs, 0: the kernels' own rule (a knob for benchmarks/tools/sbvr_gemv_profile.py)
WARPS = 0


def encode_x(lib, x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    xq = torch.empty((m, -(-k // sbvr_tiled.CHUNK), 8, 4), dtype=torch.int32, device=x.device)
    xs = torch.empty((m, k // sbvr.act_group(group), 2), dtype=torch.float32, device=x.device)
    if m:
        lib.call("sbvr_encode_x", [ptr(x), ptr(xq), ptr(xs), m, k, group, stream_of(x.device)], dtype=x.dtype)
    return xq, xs


@ops.sbvr_encode_x.register_kernel("cuda")
def _(x, group):
    lib = library_or_none(x.device)
    if lib is None or x.dtype not in KERNEL_DTYPES:
        return sbvr_tiled.encode_activations_tiled(x, group)
    if x.shape[1] % sbvr.act_group(group):
        raise ValueError(f"x's K = {x.shape[1]} is not a multiple of the activation group {sbvr.act_group(group)}")
    return encode_x(lib, x.contiguous(), group)


@ops.sbvr_gemv.register_kernel("cuda")
def _(x, qbits, qidx, cache8, n, k, group, bias=None):
    m = ops.check_sbvr_gemv_args(x, qbits, qidx, cache8, n, k, group, bias)
    lib = library_or_none(x.device)
    if lib is None or x.dtype not in KERNEL_DTYPES:
        return ops.sbvr_gemv_reference(x, qbits, qidx, cache8, n, k, group, bias)
    ns = qbits.shape[-1] // 2
    xq, xs = encode_x(lib, x, group)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)

    def run(b):
        lib.call("sbvr_gemv", [ptr(qbits), ptr(qidx), ptr(cache8), ptr(xq), ptr(xs), ptr(b), ptr(y), n, k, group, WARPS,
                               stream_of(x.device)], bits=ns, dtype=x.dtype, m=m)
        return y

    return with_bias(run, x, bias)


@ops.sbvr_lookup_gemv.register_kernel("cuda")
def _(x, qcodes, qidx, cache8, n, k, group, bias=None):
    m = ops.check_sbvr_lookup_args(x, qcodes, qidx, cache8, n, k, group, bias)
    lib = library_or_none(x.device)
    if lib is None or x.dtype not in KERNEL_DTYPES:
        return ops.sbvr_lookup_reference(x, qcodes, qidx, cache8, n, k, group, bias)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)

    def run(b):
        lib.call("sbvr_lookup_gemv", [ptr(qcodes), ptr(qidx), ptr(cache8), ptr(x), ptr(b), ptr(y), n, k, group, WARPS,
                                      stream_of(x.device)], dtype=x.dtype, m=m)
        return y

    return with_bias(run, x, bias)


@ops.sbvr_grouped_gemv.register_kernel("cuda")
def _(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group, check_offsets=True):
    experts = ops.check_sbvr_grouped_args(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group)
    lib = library_or_none(x.device)
    if lib is None or x.dtype not in KERNEL_DTYPES:
        return ops.sbvr_grouped_reference(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group)
    offsets = expert_offsets.contiguous()
    if check_offsets:
        check_offsets_on_device(lib, offsets, x.shape[0])
    y = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        xq, xs = encode_x(lib, x.contiguous(), group)
        lib.call("sbvr_grouped_gemv", [ptr(qbits), ptr(qidx), ptr(cache8), ptr(cache_offsets), ptr(offsets), ptr(xq),
                                       ptr(xs), ptr(y), x.shape[0], experts, n, k, group, WARPS, stream_of(x.device)],
                 bits=qbits.shape[-1] // 2, dtype=x.dtype)
    return y


@ops.sbvr_tiled_dequantize.register_kernel("cuda")
def _(qbits, qidx, cache8, n, k, group, dtype):
    ns = ops.check_sbvr_tiled_args(qbits, qidx, cache8, n, k, group)
    lib = library_or_none(qbits.device)
    if lib is None or dtype not in KERNEL_DTYPES:
        return sbvr.decode(*sbvr_tiled.untile(qbits, qidx, cache8, n, k), group, dtype)
    out = torch.empty((n, k), dtype=dtype, device=qbits.device)
    lib.call("sbvr_dequant", [ptr(qbits), ptr(qidx), ptr(cache8), ptr(out), n, k, group, stream_of(qbits.device)],
             bits=ns, dtype=dtype)
    return out
