"""NVFP4's ops: the tiled-layout GEMV / GEMM / grouped and routed GEMV / grouped GEMM (kbit's kernels instantiated for
E2M1 + E4M3), the checkpoint-layout GEMV and dequantize, and the W4A4 pieces (GPU MODE's batched GEMV,
activation quantization)."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import FLOAT_DTYPES, check_same_device, check_tensor
from ..formats import nvfp4
from ..formats.nvfp4 import tiled as nvfp4_tiled
from .common import (GEMV_MAX_M, apply_epilogue, check_bias, check_epilogue_parts, per_expert, per_route, routed_operand,
                     swiglu_reference)

def check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k) -> int:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    check_tensor("qweight", qweight, dtypes=(torch.int32,))
    check_tensor("qscales", qscales, dtypes=(torch.uint8,))
    check_tensor("scale_2", scale_2, dtypes=(torch.float32,))
    if not (isinstance(n, int) and isinstance(k, int) and n >= 1 and k >= 32 and k % 32 == 0):
        raise ValueError(f"n >= 1 and k (a multiple of 32) must be ints, got n={n!r}, k={k!r}")
    t, g = nvfp4_tiled.tiled_shape(n, k)
    if tuple(qweight.shape) != (t, g, 4, 32, 4) or tuple(qscales.shape) != (t, g, nvfp4_tiled.SCALE_BYTES):
        raise ValueError(f"qweight / qscales must be {(t, g, 4, 32, 4)} / {(t, g, nvfp4_tiled.SCALE_BYTES)} for "
                         f"[{n}, {k}], got {tuple(qweight.shape)} / {tuple(qscales.shape)}")
    if scale_2.numel() != 1:
        raise ValueError(f"scale_2 must be one value, got shape {tuple(scale_2.shape)}")
    if x.shape[1] != k:
        raise ValueError(f"x must have shape [M, K={k}], got {tuple(x.shape)}")
    check_same_device(x=x, qweight=qweight, qscales=qscales, scale_2=scale_2)
    return x.shape[0]


def nvfp4_tiled_reference(x, qweight, qscales, scale_2, n, k) -> Tensor:
    """``x @ W^T`` in fp32 from the NVFP4 tiled layout, rounded once to x's dtype."""
    w = nvfp4.dequantize_tiled(qweight, qscales, scale_2, n, k)
    return (x.to(torch.float32) @ w.t()).to(x.dtype)


@torch.library.custom_op("lowbit::nvfp4_gemm", mutates_args=())
def nvfp4_gemm(x: Tensor, qweight: Tensor, qscales: Tensor, scale_2: Tensor, n: int, k: int) -> Tensor:
    """``x [M, K] @ W^T`` for an NVFP4 weight in the tiled layout, on tensor cores (fp16/bf16 x on
    CUDA; CPU and fp32: the reference)."""
    check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    return nvfp4_tiled_reference(x, qweight, qscales, scale_2, n, k)


@nvfp4_gemm.register_fake
def _(x, qweight, qscales, scale_2, n, k):
    m = check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    return x.new_empty((m, n))


@torch.library.custom_op("lowbit::nvfp4_gemv", mutates_args=())
def nvfp4_gemv(x: Tensor, qweight: Tensor, qscales: Tensor, scale_2: Tensor, n: int, k: int) -> Tensor:
    """``x [M, K] @ W^T`` for M = 1..8 rows: the decode GEMV kernels (kbit's, instantiated for NVFP4)
    on CUDA fp16/bf16; CPU and fp32: the reference."""
    m = check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"nvfp4_gemv takes 1..{GEMV_MAX_M} rows, got {m}")
    return nvfp4_tiled_reference(x, qweight, qscales, scale_2, n, k)


@nvfp4_gemv.register_fake
def _(x, qweight, qscales, scale_2, n, k):
    m = check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    return x.new_empty((m, n))


# ------------------------------------------------------------------ the GEMV with the decode step's glue
def check_nvfp4_gemv_epilogue_args(x, qweight, qscales, scale_2, n, k, bias, rms_x, residual, norm_weight,
                                   swiglu: bool = False) -> int:
    m = check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"nvfp4_gemv_epilogue takes 1..{GEMV_MAX_M} rows, got {m}")
    check_bias(bias, n, x)
    check_epilogue_parts(x, m, n, k, rms_x, residual, norm_weight, swiglu)
    return m


def nvfp4_gemv_epilogue_reference(x, qweight, qscales, scale_2, n, k, bias=None, rms_x=None, eps=1e-6, residual=None,
                                  norm_weight=None, swiglu=False):
    y32 = x.to(torch.float32) @ nvfp4.dequantize_tiled(qweight, qscales, scale_2, n, k).t()  # unrounded
    y, yw = apply_epilogue(y32, x.dtype, bias, rms_x, eps, residual, norm_weight)
    return (swiglu_reference(y), yw) if swiglu else (y, yw)


@torch.library.custom_op("lowbit::nvfp4_gemv_epilogue", mutates_args=())
def nvfp4_gemv_epilogue(x: Tensor, qweight: Tensor, qscales: Tensor, scale_2: Tensor, n: int, k: int,
                        bias: Tensor | None = None, rms_x: Tensor | None = None, eps: float = 1e-6,
                        residual: Tensor | None = None, norm_weight: Tensor | None = None,
                        swiglu: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`nvfp4_gemv` (tiled layout, 1..8 rows) with a decode step's glue in its output: the definition of
    :func:`lowbit.ops.kbit_gemv_epilogue` (the norm's factor of ``rms_x``, bias, residual, one rounding; ``yw``
    with ``norm_weight``; ``swiglu``: ``silu(g) * u`` of the halves) on an NVFP4 weight."""
    check_nvfp4_gemv_epilogue_args(x, qweight, qscales, scale_2, n, k, bias, rms_x, residual, norm_weight, swiglu)
    return nvfp4_gemv_epilogue_reference(x, qweight, qscales, scale_2, n, k, bias, rms_x, eps, residual, norm_weight,
                                         swiglu)


@nvfp4_gemv_epilogue.register_fake
def _(x, qweight, qscales, scale_2, n, k, bias=None, rms_x=None, eps=1e-6, residual=None, norm_weight=None,
      swiglu=False):
    m = check_nvfp4_gemv_epilogue_args(x, qweight, qscales, scale_2, n, k, bias, rms_x, residual, norm_weight, swiglu)
    return x.new_empty((m, n // 2 if swiglu else n)), x.new_empty((m, n) if norm_weight is not None else (0,))


def check_nvfp4_grouped_args(x, expert_offsets, qweight, qscales, scale_2, n, k) -> int:
    e = _check_nvfp4_stack(x, qweight, qscales, scale_2, n, k)
    check_tensor("expert_offsets", expert_offsets, dtypes=(torch.int64,), dim=1)
    if expert_offsets.shape[0] != e + 1:
        raise ValueError(f"expert_offsets must have E + 1 = {e + 1} entries, got {expert_offsets.shape[0]}")
    check_same_device(x=x, expert_offsets=expert_offsets, qweight=qweight, qscales=qscales, scale_2=scale_2)
    return e


def _check_nvfp4_stack(x, qweight, qscales, scale_2, n, k) -> int:
    """The expert count of a valid NVFP4 expert stack (tiled layout) and x [rows, K]; raises otherwise."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    check_tensor("qweight", qweight, dtypes=(torch.int32,))
    check_tensor("qscales", qscales, dtypes=(torch.uint8,))
    check_tensor("scale_2", scale_2, dtypes=(torch.float32,), dim=1)
    if not (isinstance(n, int) and isinstance(k, int) and n >= 1 and k >= 32 and k % 32 == 0):
        raise ValueError(f"n >= 1 and k (a multiple of 32) must be ints, got n={n!r}, k={k!r}")
    e = qweight.shape[0] if qweight.dim() == 6 else -1
    t, g = nvfp4_tiled.tiled_shape(n, k)
    if e < 1 or tuple(qweight.shape) != (e, t, g, 4, 32, 4) or tuple(qscales.shape) != (e, t, g, nvfp4_tiled.SCALE_BYTES):
        raise ValueError(f"qweight / qscales must be [E, {t}, {g}, 4, 32, 4] / [E, {t}, {g}, {nvfp4_tiled.SCALE_BYTES}], "
                         f"got {tuple(qweight.shape)} / {tuple(qscales.shape)}")
    if tuple(scale_2.shape) != (e,):
        raise ValueError(f"scale_2 must be [E={e}], got {tuple(scale_2.shape)}")
    if x.shape[1] != k:
        raise ValueError(f"x must have shape [tokens, K={k}], got {tuple(x.shape)}")
    check_same_device(qweight=qweight, qscales=qscales, scale_2=scale_2)
    return e


@torch.library.custom_op("lowbit::nvfp4_grouped_gemv", mutates_args=())
def nvfp4_grouped_gemv(x: Tensor, expert_offsets: Tensor, qweight: Tensor, qscales: Tensor, scale_2: Tensor,
                       n: int, k: int, check_offsets: bool = True) -> Tensor:
    """MoE rows ``x [tokens, K]`` sorted by expert (``expert_offsets`` int64 [E + 1]) times their NVFP4 expert
    weights (tiled layout, :class:`lowbit.formats.nvfp4.NvFp4Experts`), one launch: the kbit grouped
    GEMV's NVFP4 instance on CUDA fp16/bf16; CPU and fp32: the reference, expert by expert. Offsets: as
    :func:`kbit_grouped_gemv`."""
    check_nvfp4_grouped_args(x, expert_offsets, qweight, qscales, scale_2, n, k)
    return nvfp4_grouped_reference(x, expert_offsets, qweight, qscales, scale_2, n, k)


def nvfp4_grouped_reference(x, expert_offsets, qweight, qscales, scale_2, n, k) -> Tensor:
    return per_expert(x, expert_offsets, n, qweight.shape[0],
                      lambda e, rows: nvfp4_tiled_reference(rows, qweight[e], qscales[e], scale_2[e], n, k))


@nvfp4_grouped_gemv.register_fake
def _(x, expert_offsets, qweight, qscales, scale_2, n, k, check_offsets=True):
    check_nvfp4_grouped_args(x, expert_offsets, qweight, qscales, scale_2, n, k)
    return x.new_empty((x.shape[0], n))


@torch.library.custom_op("lowbit::nvfp4_grouped_gemm", mutates_args=())
def nvfp4_grouped_gemm(x: Tensor, expert_offsets: Tensor, qweight: Tensor, qscales: Tensor, scale_2: Tensor,
                       n: int, k: int, check_offsets: bool = True) -> Tensor:
    """MoE experts in one call on tensor cores (prefill, large decode batches): the kbit grouped GEMM's NVFP4
    instance; same contract as :func:`nvfp4_grouped_gemv`. CPU and fp32: the reference."""
    check_nvfp4_grouped_args(x, expert_offsets, qweight, qscales, scale_2, n, k)
    return nvfp4_grouped_reference(x, expert_offsets, qweight, qscales, scale_2, n, k)


@nvfp4_grouped_gemm.register_fake
def _(x, expert_offsets, qweight, qscales, scale_2, n, k, check_offsets=True):
    check_nvfp4_grouped_args(x, expert_offsets, qweight, qscales, scale_2, n, k)
    return x.new_empty((x.shape[0], n))


def check_nvfp4_routed_args(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x, swiglu: bool = False) -> int:
    """:func:`lowbit.ops.check_kbit_routed_args` for an NVFP4 expert stack."""
    e = _check_nvfp4_stack(routed_operand(x, route_ids, k, rows_per_x, swiglu), qweight, qscales, scale_2, n, k)
    check_same_device(x=x, route_ids=route_ids, qweight=qweight)
    return e


@torch.library.custom_op("lowbit::nvfp4_routed_gemv", mutates_args=())
def nvfp4_routed_gemv(x: Tensor, route_ids: Tensor, qweight: Tensor, qscales: Tensor, scale_2: Tensor, n: int, k: int,
                      rows_per_x: int = 1, swiglu: bool = False) -> Tensor:
    """:func:`lowbit.ops.kbit_routed_gemv` for an NVFP4 expert stack (the routed GEMV's NVFP4 instance): output row r
    is x row ``r // rows_per_x`` times expert ``route_ids[r]`` -> ``[len(route_ids), n]``; ``swiglu=True``: the operand
    is ``silu(gate) * up`` of x ``[rows, 2 K]``; ids outside ``[0, E)`` give zero rows. fp16/bf16 x with at most
    ``ROUTED_MAX_ROUTES`` routes runs the CUDA kernel; fp32 x and CPU the reference."""
    check_nvfp4_routed_args(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x, swiglu)
    return nvfp4_routed_reference(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x, swiglu)


@nvfp4_routed_gemv.register_fake
def _(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x=1, swiglu=False):
    check_nvfp4_routed_args(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x, swiglu)
    return x.new_empty((route_ids.shape[0], n))


def nvfp4_routed_reference(x, route_ids, qweight, qscales, scale_2, n, k, rows_per_x=1, swiglu=False) -> Tensor:
    return per_route(x, route_ids, n, qweight.shape[0], rows_per_x, swiglu,
                     lambda e, rows: nvfp4_tiled_reference(rows, qweight[e], qscales[e], scale_2[e], n, k))


# ------------------------------------------------------------------ NVFP4 on the checkpoint layout
#: K granularity of the checkpoint-layout kernels (a lane's 32 values; the format needs 16)
PLAIN_K_MULTIPLE = 32


def check_nvfp4_plain_args(x, packed, scales, scale_2) -> tuple[int, int, int]:
    """(M, N, K) of ``x [M, K] @ W^T`` with W in the plain checkpoint layout."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    check_tensor("packed", packed, dtypes=(torch.uint8,), dim=2)
    check_tensor("scales", scales, dtypes=(torch.float8_e4m3fn,), dim=2)
    check_tensor("scale_2", scale_2, dtypes=(torch.float32,))
    n, half = packed.shape
    k = 2 * half
    if n < 1 or k < PLAIN_K_MULTIPLE or k % PLAIN_K_MULTIPLE:
        raise ValueError(f"packed must be [N >= 1, K/2] with K a multiple of {PLAIN_K_MULTIPLE} for this kernel, got "
                         f"{tuple(packed.shape)} (K = {k}; K % 16 == 0 alone: use lowbit.nvfp4_linear)")
    if tuple(scales.shape) != (n, k // 16):
        raise ValueError(f"scales must be [N, K/16] = [{n}, {k // 16}], got {tuple(scales.shape)}")
    if scale_2.numel() != 1:
        raise ValueError(f"scale_2 must be one value, got shape {tuple(scale_2.shape)}")
    if x.shape[1] != k:
        raise ValueError(f"x must have shape [M, K={k}], got {tuple(x.shape)}")
    check_same_device(x=x, packed=packed, scales=scales, scale_2=scale_2)
    return x.shape[0], n, k


def nvfp4_plain_reference(x, packed, scales, scale_2) -> Tensor:
    """``x @ W^T`` in fp32 from the plain layout (e2m1 * scale * scale_2, exact), rounded once to x's dtype."""
    return (x.to(torch.float32) @ _plain_weight(packed, scales, scale_2).t()).to(x.dtype)


@torch.library.custom_op("lowbit::nvfp4_plain_gemv", mutates_args=())
def nvfp4_plain_gemv(x: Tensor, packed: Tensor, scales: Tensor, scale_2: Tensor) -> Tensor:
    """``x [M, K] @ W^T`` for an NVFP4 weight in the checkpoint layout (packed uint8 [N, K/2], E4M3 scales
    [N, K/16], fp32 scale_2), no repack: the decode GEMV of csrc/nvfp4/gemv.cu on CUDA fp16/bf16 (up to
    8 rows of x per pass over W: meant for M <= 8); CPU and fp32: the reference."""
    check_nvfp4_plain_args(x, packed, scales, scale_2)
    return nvfp4_plain_reference(x, packed, scales, scale_2)


@nvfp4_plain_gemv.register_fake
def _(x, packed, scales, scale_2):
    m, n, _ = check_nvfp4_plain_args(x, packed, scales, scale_2)
    return x.new_empty((m, n))


@torch.library.custom_op("lowbit::nvfp4_dequantize", mutates_args=())
def nvfp4_dequantize(packed: Tensor, scales: Tensor, scale_2: Tensor, dtype: torch.dtype) -> Tensor:
    """NVFP4 weight in the checkpoint layout -> dense ``[N, K]`` of ``dtype`` (e2m1 * scale * scale_2 in
    fp32, rounded once: bit-identical to the reference). CUDA fp16/bf16 with K % 32 == 0:
    csrc/nvfp4/dequant.cu; otherwise the reference."""
    check_nvfp4_dequantize_args(packed, scales, scale_2, dtype)
    return _plain_weight(packed, scales, scale_2).to(dtype)


@nvfp4_dequantize.register_fake
def _(packed, scales, scale_2, dtype):
    n, k = check_nvfp4_dequantize_args(packed, scales, scale_2, dtype)
    return packed.new_empty((n, k), dtype=dtype)


def check_nvfp4_dequantize_args(packed, scales, scale_2, dtype) -> tuple[int, int]:
    check_tensor("packed", packed, dtypes=(torch.uint8,), dim=2)
    check_tensor("scales", scales, dtypes=(torch.float8_e4m3fn,), dim=2)
    check_tensor("scale_2", scale_2, dtypes=(torch.float32,))
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    n, half = packed.shape
    if tuple(scales.shape) != (n, 2 * half // 16) or (2 * half) % 16:
        raise ValueError(f"packed [N, K/2] / scales [N, K/16] with K % 16 == 0, got {tuple(packed.shape)} / "
                         f"{tuple(scales.shape)}")
    if scale_2.numel() != 1:
        raise ValueError(f"scale_2 must be one value, got shape {tuple(scale_2.shape)}")
    check_same_device(packed=packed, scales=scales, scale_2=scale_2)
    return n, 2 * half


def _plain_weight(packed, scales, scale_2) -> Tensor:
    """fp32 [N, K] of the plain layout (the reference's arithmetic)."""
    n = packed.shape[0]
    vals = nvfp4.decode_e2m1(nvfp4.unpack(packed)).reshape(n, -1, nvfp4.BLOCK)
    return (vals * (scales.to(torch.float32) * scale_2.reshape(()).to(torch.float32))[..., None]).reshape(n, -1)


_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)


def _as_codes(t):
    """uint8 view of packed E2M1 given as torch.float4_e2m1fn_x2 (other dtypes pass through, checked later)."""
    return t.view(torch.uint8) if isinstance(t, torch.Tensor) and _FP4X2 is not None and t.dtype == _FP4X2 else t


def check_w4a4_args(a, b, sfa, sfb) -> tuple[int, int, int]:
    """(M, K, L) of GPU MODE nvfp4_gemv operands: a [M, K/2, L], b [1, K/2, L] packed E2M1, sfa [M, K/16, L],
    sfb [1, K/16, L] float8_e4m3fn, any strides (K-major ones, as GPU MODE allocates them, run without a copy)."""
    a, b = _as_codes(a), _as_codes(b)
    for name, t in (("a", a), ("b", b)):
        check_tensor(name, t, dtypes=(torch.uint8,), dim=3, contiguous=False)
    for name, t in (("sfa", sfa), ("sfb", sfb)):
        check_tensor(name, t, dtypes=(torch.float8_e4m3fn,), dim=3, contiguous=False)
    m, half, l_ = a.shape
    k = 2 * half
    if k < PLAIN_K_MULTIPLE or k % PLAIN_K_MULTIPLE:
        raise ValueError(f"K = {k} must be a positive multiple of {PLAIN_K_MULTIPLE} for the W4A4 kernel")
    if tuple(b.shape) != (1, half, l_):
        raise ValueError(f"b must be [1, K/2, L] = [1, {half}, {l_}], got {tuple(b.shape)}")
    if tuple(sfa.shape) != (m, k // 16, l_) or tuple(sfb.shape) != (1, k // 16, l_):
        raise ValueError(f"sfa / sfb must be [{m}, {k // 16}, {l_}] / [1, {k // 16}, {l_}], got "
                         f"{tuple(sfa.shape)} / {tuple(sfb.shape)}")
    check_same_device(a=a, b=b, sfa=sfa, sfb=sfb)
    return m, k, l_


@torch.library.custom_op("lowbit::nvfp4_w4a4_gemv", mutates_args=())
def nvfp4_w4a4_gemv(a: Tensor, b: Tensor, sfa: Tensor, sfb: Tensor) -> Tensor:
    """GPU MODE ``nvfp4_gemv``: ``c [M, 1, L] = A_l @ b_l`` for NVFP4 ``a [M, K/2, L]`` / ``b [1, K/2, L]``
    (uint8 or float4_e2m1fn_x2, any strides; K-major runs without a copy) with E4M3 scales ``sfa [M, K/16, L]`` / ``sfb [1, K/16, L]``,
    fp32 accumulation, fp16 out (stored [L, M]-major, as GPU MODE allocates c). CUDA: csrc/nvfp4/gemv.cu;
    CPU: the reference (lowbit.formats.nvfp4.w4a4_gemv_reference)."""
    check_w4a4_args(a, b, sfa, sfb)
    return nvfp4.w4a4_gemv_reference(_as_codes(a), _as_codes(b), sfa, sfb)


@nvfp4_w4a4_gemv.register_fake
def _(a, b, sfa, sfb):
    m, _, l_ = check_w4a4_args(a, b, sfa, sfb)
    return sfa.new_empty((l_, m, 1), dtype=torch.float16).permute(1, 2, 0)


def check_quantize_act_args(x, scale_2) -> tuple[int, int]:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    check_tensor("scale_2", scale_2, dtypes=(torch.float32,))
    if x.shape[1] < 16 or x.shape[1] % 16:
        raise ValueError(f"x must be [rows, K] with K a positive multiple of 16, got {tuple(x.shape)}")
    if scale_2.numel() != 1:
        raise ValueError(f"scale_2 must be one value, got shape {tuple(scale_2.shape)}")
    check_same_device(x=x, scale_2=scale_2)
    return x.shape[0], x.shape[1]


@torch.library.custom_op("lowbit::nvfp4_quantize_act", mutates_args=())
def nvfp4_quantize_act(x: Tensor, scale_2: Tensor) -> tuple[Tensor, Tensor]:
    """NVFP4 of activations ``x [rows, K]`` with a given tensor scale (multiplier; the W4A4 input side):
    (packed uint8 [rows, K/2], float8_e4m3fn scales [rows, K/16]), bit-identical to
    lowbit.formats.nvfp4.quantize_blocks (the reference, which is also the CPU path). The CUDA kernel
    (csrc/nvfp4/quantize.cu, fp16/bf16) checks neither x nor scale_2 (a device scalar; reading it back would
    sync): non-finite values, or a scale_2 <= 0, give unspecified codes."""
    check_quantize_act_args(x, scale_2)
    return nvfp4.quantize_blocks(x, scale_2)


@nvfp4_quantize_act.register_fake
def _(x, scale_2):
    rows, k = check_quantize_act_args(x, scale_2)
    return (x.new_empty((rows, k // 2), dtype=torch.uint8), x.new_empty((rows, k // 16), dtype=torch.float8_e4m3fn))


