"""CUDA implementations of the NVFP4 ops: the kbit tensor-core GEMV, GEMM and grouped GEMM instantiated for NVFP4
weights (``csrc/tiled/gemv.cuh`` / ``gemm.cuh``, instances in ``csrc/nvfp4/tiled_*.cu``, FP4 = true: E2M1 lookup table, E4M3 fragment
scales; layout ``lowbit/formats/nvfp4/tiled.py``), and the kernels on the checkpoint layout itself
(``csrc/nvfp4/gemv.cu``: W4A16 GEMV and GPU MODE's W4A4 batched GEMV; ``csrc/nvfp4/quantize.cu``:
activations to NVFP4)."""

from __future__ import annotations

import ctypes

import torch

from .. import ops
from ..formats import nvfp4
from .library import library_or_none, ptr, register_signatures, stream_of
from .tiled import (NVFP4, GemmLauncher, GemvLauncher, GroupedGemmLauncher, GroupedLauncher, RoutedLauncher,
                    check_offsets_on_device, run_gemv_epilogue, tiled_signatures, with_bias)

_P, _I64, _I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
register_signatures({
    **tiled_signatures("nvfp4", grouped_gemm=True, routed=True),  # qscales = nvfp4/tiled.py scales, values = the E2M1 values, scale = scale_2
    # the checkpoint layout (csrc/nvfp4/gemv.cu): x, packed, scales, packed row stride, scales row stride
    # (bytes), scale_2, y, m (1..8), n, k, stream
    "nvfp4_plain_gemv": [_P, _P, _P, _I64, _I64, _P, _P, _I, _I, _I, _P],
    # a, sfa, b, sfb, c, m, k, l, strides (a m/l, sfa m/l, b l, sfb l: bytes; c m/l: elements), stream
    "nvfp4_w4a4_gemv": [_P, _P, _P, _P, _P, _I, _I, _I, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _P],
    # packed, its row stride, scales, their row stride (bytes), scale_2, out [n, k], n, k, stream
    "nvfp4_dequant": [_P, _I64, _P, _I64, _P, _P, _I, _I, _P],
    # x, x row stride (elements), codes, codes row stride, scales, scales row stride (bytes), scale_2, rows, k,
    # stream (csrc/nvfp4/quantize.cu)
    "nvfp4_quantize": [_P, _I64, _P, _I64, _P, _I64, _P, _I, _I, _P],
})

_e2m1: dict[torch.device, torch.Tensor] = {}


def e2m1_codebook(device: torch.device) -> torch.Tensor:
    """The 16 E2M1 values as the GEMM's codebook (one fp32 tensor per device, kept)."""
    if device not in _e2m1:
        _e2m1[device] = nvfp4.e2m1_values(device)
    return _e2m1[device]


def gemm_launcher(lib, qweight, qscales, scale_2, n: int, k: int) -> GemmLauncher:
    return GemmLauncher(lib, qweight, qscales, e2m1_codebook(qweight.device), scale_2, NVFP4, n, k)


def gemv_launcher(lib, qweight, qscales, scale_2, n: int, k: int) -> GemvLauncher:
    return GemvLauncher(lib, qweight, qscales, e2m1_codebook(qweight.device), scale_2, NVFP4, n, k)


@ops.nvfp4_gemv.register_kernel("cuda")
def _(x, qweight, qscales, scale_2, n, k):
    m = ops.check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    if not 1 <= m <= ops.GEMV_MAX_M:
        raise ValueError(f"nvfp4_gemv takes 1..{ops.GEMV_MAX_M} rows, got {m}")
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:
        return ops.nvfp4_tiled_reference(x, qweight, qscales, scale_2, n, k)
    launch = gemv_launcher(lib, qweight, qscales, scale_2.reshape(()).contiguous(), n, k)
    return launch(x.contiguous(), m, (m, n))


@ops.nvfp4_gemv_epilogue.register_kernel("cuda")
def _(x, qweight, qscales, scale_2, n, k, bias=None, rms_x=None, eps=1e-6, residual=None, norm_weight=None,
      swiglu=False):
    m = ops.check_nvfp4_gemv_epilogue_args(x, qweight, qscales, scale_2, n, k, bias, rms_x, residual, norm_weight,
                                           swiglu)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:
        return ops.nvfp4_gemv_epilogue_reference(x, qweight, qscales, scale_2, n, k, bias, rms_x, eps, residual,
                                                 norm_weight, swiglu)
    launch = gemv_launcher(lib, qweight, qscales, scale_2.reshape(()).contiguous(), n, k)
    return run_gemv_epilogue(launch, x.contiguous(), m, bias, rms_x, eps, residual, norm_weight, swiglu)


@ops.nvfp4_gemm.register_kernel("cuda")
def _(x, qweight, qscales, scale_2, n, k):
    m = ops.check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:
        return ops.nvfp4_tiled_reference(x, qweight, qscales, scale_2, n, k)
    if m == 0:
        return x.new_empty((0, n))
    launch = gemm_launcher(lib, qweight, qscales, scale_2.reshape(()).contiguous(), n, k)
    return with_bias(lambda b: launch(x.contiguous(), b), x, None)


# ------------------------------------------------------------------ the checkpoint-layout kernels
#: Tokens per pass of csrc/nvfp4/gemv.cu's W4A16 GEMV (more rows of x: passes of 8).
PLAIN_MAX_M = 8

def _aligned(t: torch.Tensor, align: int, strides=()) -> bool:
    return t.data_ptr() % align == 0 and all(s % align == 0 for s in strides)


@ops.nvfp4_plain_gemv.register_kernel("cuda")
def _(x, packed, scales, scale_2):
    m, n, k = ops.check_nvfp4_plain_args(x, packed, scales, scale_2)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:
        return ops.nvfp4_plain_reference(x, packed, scales, scale_2)
    if m == 0:
        return x.new_empty((0, n))
    x = x.contiguous()
    if not (_aligned(packed, 16, (packed.stride(0),)) and _aligned(scales, 2, (scales.stride(0),)) and _aligned(x, 16)):
        raise ValueError("nvfp4_plain_gemv needs packed rows 16-byte aligned, scale rows 2-byte aligned and x "
                         "16-byte aligned (contiguous tensors from lowbit.quantize_nvfp4 are)")
    y = x.new_empty((m, n))
    s2 = scale_2.reshape(()).contiguous()
    for i in range(0, m, PLAIN_MAX_M):
        rows = min(PLAIN_MAX_M, m - i)
        lib.call("nvfp4_plain_gemv", [ptr(x[i:]), ptr(packed), ptr(scales), packed.stride(0), scales.stride(0), ptr(s2),
                                      ptr(y[i:]), rows, n, k, stream_of(x.device)], dtype=x.dtype)
    return y


def _k_major(t: torch.Tensor, align: int) -> torch.Tensor:
    """t [R, C, L] with dim 1 contiguous and the pointer and other strides ``align``-byte multiples (a fresh
    [L, R, C] copy viewed back if the given one is not; with K % 32 == 0 the copy always is)."""
    if (t.shape[1] == 1 or t.stride(1) == 1) and _aligned(t, align, (t.stride(0), t.stride(2))):
        return t
    return t.permute(2, 0, 1).contiguous().permute(1, 2, 0)


@ops.nvfp4_w4a4_gemv.register_kernel("cuda")
def _(a, b, sfa, sfb):
    m, k, l_ = ops.check_w4a4_args(a, b, sfa, sfb)
    a, b = ops.nvfp4._as_codes(a), ops.nvfp4._as_codes(b)
    lib = library_or_none(a.device)
    if lib is None:
        return nvfp4.w4a4_gemv_reference(a, b, sfa, sfb)
    c = torch.empty((l_, m, 1), dtype=torch.float16, device=a.device).permute(1, 2, 0)
    if m == 0 or l_ == 0:
        return c
    # codes: 16-byte rows; scales: 2-byte (K % 32 == 0 makes K/16 even), copied into shape if needed
    a, b = _k_major(a, 16), _k_major(b, 16)
    sfa, sfb = (_k_major(t.view(torch.uint8), 2) for t in (sfa, sfb))
    lib.call("nvfp4_w4a4_gemv", [ptr(a), ptr(sfa), ptr(b), ptr(sfb), ptr(c), m, k, l_, a.stride(0), a.stride(2),
                                 sfa.stride(0), sfa.stride(2), b.stride(2), sfb.stride(2), c.stride(0), c.stride(2),
                                 stream_of(a.device)])
    return c


@ops.nvfp4_quantize_act.register_kernel("cuda")
def _(x, scale_2):
    rows, k = ops.check_quantize_act_args(x, scale_2)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:
        return nvfp4.quantize_blocks(x, scale_2)
    x = x.contiguous()
    codes = torch.empty((rows, k // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((rows, k // 16), dtype=torch.uint8, device=x.device)
    if rows:
        s2 = scale_2.reshape(()).to(torch.float32).contiguous()
        lib.call("nvfp4_quantize", [ptr(x), k, ptr(codes), k // 2, ptr(scales), k // 16, ptr(s2), rows, k,
                                    stream_of(x.device)], dtype=x.dtype)
    return codes, scales.view(torch.float8_e4m3fn)


@ops.nvfp4_dequantize.register_kernel("cuda")
def _(packed, scales, scale_2, dtype):
    n, k = ops.check_nvfp4_dequantize_args(packed, scales, scale_2, dtype)
    lib = library_or_none(packed.device)
    if lib is None or dtype == torch.float32 or k % ops.PLAIN_K_MULTIPLE:
        return ops.nvfp4._plain_weight(packed, scales, scale_2).to(dtype)
    if not (_aligned(packed, 16, (packed.stride(0),)) and _aligned(scales, 2, (scales.stride(0),))):
        packed, scales = packed.contiguous(), scales.contiguous()
    out = torch.empty((n, k), dtype=dtype, device=packed.device)
    lib.call("nvfp4_dequant", [ptr(packed), packed.stride(0), ptr(scales), scales.stride(0),
                               ptr(scale_2.reshape(()).contiguous()), ptr(out), n, k, stream_of(packed.device)], dtype=dtype)
    return out


def _grouped(launcher_cls):
    """The CUDA implementation of a grouped op (rows sorted by expert) on ``launcher_cls``'s kernel."""
    def run(x, expert_offsets, qweight, qscales, scale_2, n, k, check_offsets=True):
        ops.check_nvfp4_grouped_args(x, expert_offsets, qweight, qscales, scale_2, n, k)
        lib = library_or_none(x.device)
        if lib is None or x.dtype == torch.float32:
            return ops.nvfp4_grouped_reference(x, expert_offsets, qweight, qscales, scale_2, n, k)
        offsets = expert_offsets.contiguous()
        if check_offsets:
            check_offsets_on_device(lib, offsets, x.shape[0])
        launch = launcher_cls(lib, qweight, qscales, e2m1_codebook(x.device), scale_2.contiguous(), NVFP4, n, k)
        return launch(x.contiguous(), offsets)
    return run


ops.nvfp4_grouped_gemv.register_kernel("cuda")(_grouped(GroupedLauncher))  # 8 rows per expert per weight pass
ops.nvfp4_grouped_gemm.register_kernel("cuda")(_grouped(GroupedGemmLauncher))  # tensor cores, from the crossover


@ops.nvfp4_routed_gemv.register_kernel("cuda")
def _(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x=1, swiglu=False):
    ops.check_nvfp4_routed_args(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x, swiglu)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32 or route_ids.shape[0] > ops.ROUTED_MAX_ROUTES:
        return ops.nvfp4_routed_reference(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x, swiglu)
    launch = RoutedLauncher(lib, qweight, qscales, e2m1_codebook(x.device), scale_2.contiguous(), NVFP4, n, k)
    return launch(x.contiguous(), route_ids.contiguous(), rows_per_x, swiglu)
