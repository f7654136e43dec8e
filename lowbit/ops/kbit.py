"""kbit's ops: dequantize and matmul on the bit-plane storage (the reference), the repack to the
tiled GPU layout, and the GEMV / GEMM / dequantize / grouped (MoE) ops on that layout."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import FLOAT_DTYPES, check_same_device, check_tensor
from ..formats import kbit
from ..formats.kbit import rotation as kbit_rotation
from ..formats.kbit import tiled as kbit_tiled
from .common import (GEMV_MAX_M, _check_out_dtype, apply_epilogue, check_bias, check_epilogue_parts, per_expert, per_route,
                     routed_operand, swiglu_reference)

def check_kbit_dequantize_args(planes, absmax, codebook, scale, bits, dtype) -> tuple[int, int]:
    kbit.check_kbit_tensors(planes, absmax, codebook, scale, bits)
    _check_out_dtype(dtype)
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


# ------------------------------------------------------------------ tiled layout + GEMV
def check_tiled_args(qweight, qabsmax, codebook, scale, bits, n, k_in, experts=None) -> None:
    kbit.check_bits(bits)
    if not (isinstance(n, int) and n > 0 and isinstance(k_in, int) and k_in > 0 and k_in % kbit.BLOCK == 0):
        raise ValueError(f"n must be > 0 and k_in a positive multiple of 32, got n={n}, k_in={k_in}")
    t, g = kbit_tiled.tiled_shape(n, k_in)
    lead = () if experts is None else (experts,)
    check_tensor("qweight", qweight, dtypes=(torch.int32,))
    if tuple(qweight.shape) != (*lead, t, g, bits, 32, 4):
        raise ValueError(f"qweight must have shape {(*lead, t, g, bits, 32, 4)} for n={n}, k_in={k_in}, got {tuple(qweight.shape)}")
    check_tensor("qabsmax", qabsmax, dtypes=(torch.uint8,))
    if tuple(qabsmax.shape) != (*lead, t, g, 128):
        raise ValueError(f"qabsmax must have shape {(*lead, t, g, 128)}, got {tuple(qabsmax.shape)}")
    kbit.check_codebook(codebook, bits)
    check_tensor("scale", scale, dtypes=(torch.float32,))
    if tuple(scale.shape) != lead:
        raise ValueError(f"scale must have shape {lead}, got {tuple(scale.shape)}")
    check_same_device(qweight=qweight, qabsmax=qabsmax, codebook=codebook, scale=scale)


@torch.library.custom_op("lowbit::kbit_repack", mutates_args=())
def kbit_repack(planes: Tensor, absmax: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """Bit planes -> the GPU tiled layout (qweight, qabsmax); see lowbit/formats/kbit/tiled.py."""
    check_tensor("planes", planes, dtypes=(torch.int32,))
    check_tensor("absmax", absmax, dtypes=(torch.uint8,))
    return kbit_tiled.repack(planes, absmax, bits)


@kbit_repack.register_fake
def _(planes, absmax, bits):
    t, g = kbit_tiled.tiled_shape(planes.shape[-3], planes.shape[-2] * kbit.BLOCK)
    lead = tuple(planes.shape[:-3])
    return planes.new_empty((*lead, t, g, bits, 32, 4)), absmax.new_empty((*lead, t, g, 128))


def _check_kernel_x_args(op, rows, x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias) -> int:
    """The tiled-weight kernels' common checks; ``rows`` = (min, max) rows of x the kernel takes."""
    check_tiled_args(qweight, qabsmax, codebook, scale, bits, n, k_in)
    check_tensor("x", x, dtypes=(torch.float16, torch.bfloat16), dim=2)
    if x.shape[1] != k_in:
        raise ValueError(f"x must have shape [M, K_in={k_in}], got {tuple(x.shape)}")
    if not rows[0] <= x.shape[0] <= rows[1]:
        raise ValueError(f"{op} takes M = {rows[0]}..{rows[1]} rows of x, got {x.shape[0]} (use kbit_linear)")
    check_same_device(x=x, qweight=qweight)
    check_bias(bias, n, x)
    return x.shape[0]


def check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None, rotation=0) -> int:
    kbit_rotation.check_rotation(rotation)
    return _check_kernel_x_args("kbit_gemv", (1, GEMV_MAX_M), x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


@torch.library.custom_op("lowbit::kbit_gemv", mutates_args=())
def kbit_gemv(x: Tensor, qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scale: Tensor, bits: int, n: int, k_in: int,
              bias: Tensor | None = None, rotation: int = 0) -> Tensor:
    """Decode GEMV ``x[M<=8, K_in] @ W^T (+ bias)`` from the tiled layout; fp16/bf16 in and out, fp32
    accumulation, the bias added in fp32 before the one rounding. ``rotation=32``: the weight holds
    ``W H`` (block-32 Hadamard, :mod:`lowbit.formats.kbit.rotation`) and the product is ``(x H) (W H)^T``;
    the kernel rotates x in registers (x H rounded once to x's dtype), the reference in fp32."""
    check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rotation)
    return gemv_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rotation)


@kbit_gemv.register_fake
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None, rotation=0):
    m = check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rotation)
    return x.new_empty((m, n))


# ------------------------------------------------------------------ the GEMV with the decode step's glue
def check_gemv_epilogue_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rms_x, residual,
                             norm_weight, swiglu: bool = False) -> int:
    m = check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    check_epilogue_parts(x, m, n, k_in, rms_x, residual, norm_weight, swiglu)
    return m


@torch.library.custom_op("lowbit::kbit_gemv_epilogue", mutates_args=())
def kbit_gemv_epilogue(x: Tensor, qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scale: Tensor, bits: int, n: int,
                       k_in: int, bias: Tensor | None = None, rms_x: Tensor | None = None,
                       eps: float = 1e-6, residual: Tensor | None = None,
                       norm_weight: Tensor | None = None, swiglu: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`kbit_gemv` with a decode step's glue in its output, one rounding:

    ``y = (x @ W^T) * rsqrt(mean(rms_x^2, -1) + eps) + bias + residual`` (each part only when given; the
    mean over fp32 squares, per row), and ``yw = round(y * norm_weight)`` when ``norm_weight`` is given (else
    an empty tensor). With ``x = yw`` of the GEMV before it and ``rms_x`` its ``y``, the pair computes
    ``residual add -> RMSNorm -> linear`` with no kernel between them (:mod:`lowbit.hf.layers`). Unrotated
    weights only (``rotation=0``).

    ``swiglu=True`` (a gated MLP's fused gate|up weight, rows ``[gate; up]`` of ``N / 2`` each; no residual or
    ``norm_weight``): ``y = silu(g) * u`` of the two halves ``g, u`` of the above, each rounded to x's dtype first,
    the product in fp32 and rounded once: ``[M, N / 2]``, what ``act_fn(gate_proj(x)) * up_proj(x)`` gives."""
    check_gemv_epilogue_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rms_x, residual, norm_weight,
                             swiglu)
    return gemv_epilogue_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rms_x, eps, residual,
                                   norm_weight, swiglu)


@kbit_gemv_epilogue.register_fake
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None, rms_x=None, eps=1e-6, residual=None,
      norm_weight=None, swiglu=False):
    m = check_gemv_epilogue_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rms_x, residual, norm_weight,
                                 swiglu)
    return x.new_empty((m, n // 2 if swiglu else n)), x.new_empty((m, n) if norm_weight is not None else (0,))


def gemv_epilogue_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None, rms_x=None, eps=1e-6,
                            residual=None, norm_weight=None, swiglu=False):
    y32 = tiled_linear_reference(x.to(torch.float32), qweight, qabsmax, codebook, scale, bits, n, k_in)  # unrounded
    y, yw = apply_epilogue(y32, x.dtype, bias, rms_x, eps, residual, norm_weight)
    return (swiglu_reference(y), yw) if swiglu else (y, yw)


#: the GEMM's grid takes 64 rows per CTA in its third dimension (<= 65535)
GEMM_MAX_ROWS = 65535 * 64


def check_kbit_gemm_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None) -> int:
    return _check_kernel_x_args("kbit_gemm", (0, GEMM_MAX_ROWS), x, qweight, qabsmax, codebook, scale, bits, n, k_in,
                                bias)


@torch.library.custom_op("lowbit::kbit_gemm", mutates_args=())
def kbit_gemm(x: Tensor, qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scale: Tensor, bits: int, n: int, k_in: int,
              bias: Tensor | None = None) -> Tensor:
    """Batched ``x[M, K_in] @ W^T (+ bias)`` from the tiled layout on tensor cores (the path for M > 8
    up to the measured crossover with dequantize + cuBLAS); fp16/bf16, fp32 accumulation, one rounding."""
    check_kbit_gemm_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    return gemv_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


@kbit_gemm.register_fake
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None):
    m = check_kbit_gemm_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    return x.new_empty((m, n))


@torch.library.custom_op("lowbit::kbit_tiled_dequantize", mutates_args=())
def kbit_tiled_dequantize(qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scale: Tensor, bits: int, n: int,
                          k_in: int, dtype: torch.dtype) -> Tensor:
    """Dense ``[n, k_in]`` weight in ``dtype`` from the tiled layout (= ``kbit_tiled.dequantize``, bit for bit)."""
    check_tiled_args(qweight, qabsmax, codebook, scale, bits, n, k_in)
    _check_out_dtype(dtype)
    return kbit_tiled.dequantize(qweight, qabsmax, codebook, scale, bits, n, k_in, dtype)


@kbit_tiled_dequantize.register_fake
def _(qweight, qabsmax, codebook, scale, bits, n, k_in, dtype):
    check_tiled_args(qweight, qabsmax, codebook, scale, bits, n, k_in)
    _check_out_dtype(dtype)
    return qweight.new_empty((n, k_in), dtype=dtype)


def check_kbit_tiled_linear_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None) -> int:
    check_tiled_args(qweight, qabsmax, codebook, scale, bits, n, k_in)
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    if x.shape[1] != k_in:
        raise ValueError(f"x must have shape [M, K_in={k_in}], got {tuple(x.shape)}")
    check_same_device(x=x, qweight=qweight)
    check_bias(bias, n, x)
    return x.shape[0]


@torch.library.custom_op("lowbit::kbit_tiled_linear", mutates_args=())
def kbit_tiled_linear(x: Tensor, qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scale: Tensor, bits: int, n: int,
                      k_in: int, bias: Tensor | None = None) -> Tensor:
    """``x[M, K_in] @ W^T (+ bias)`` from the tiled layout for any M and float dtype: the path beyond the
    GEMV (and the CPU reference of the modules, which hold only the tiled layout)."""
    check_kbit_tiled_linear_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    return tiled_linear_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


@kbit_tiled_linear.register_fake
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None):
    m = check_kbit_tiled_linear_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    return x.new_empty((m, n))


def _check_expert_stack(x, qweight, qabsmax, codebook, scales, bits, n, k_in) -> int:
    """The expert count of a valid stacked tiled weight and x [rows, K_in]; raises otherwise."""
    check_tensor("qweight", qweight, dtypes=(torch.int32,))
    if qweight.dim() != 6:
        raise ValueError(f"qweight must be [E, tiles, groups, bits, 32, 4] for grouped experts, got {tuple(qweight.shape)}")
    experts = qweight.shape[0]
    check_tiled_args(qweight, qabsmax, codebook, scales, bits, n, k_in, experts=experts)
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    if x.shape[1] != k_in:
        raise ValueError(f"x must have shape [tokens, K_in={k_in}], got {tuple(x.shape)}")
    return experts


def check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in) -> int:
    experts = _check_expert_stack(x, qweight, qabsmax, codebook, scales, bits, n, k_in)
    check_tensor("expert_offsets", expert_offsets, dtypes=(torch.int64,), dim=1)
    if expert_offsets.shape[0] != experts + 1:
        raise ValueError(f"expert_offsets must have E + 1 = {experts + 1} entries, got {expert_offsets.shape[0]}")
    check_same_device(x=x, expert_offsets=expert_offsets, qweight=qweight)
    if x.shape[0] >= 2**31:
        raise ValueError(f"grouped GEMV supports < 2^31 tokens, got {x.shape[0]}")
    return experts


@torch.library.custom_op("lowbit::kbit_grouped_gemv", mutates_args=())
def kbit_grouped_gemv(
    x: Tensor, expert_offsets: Tensor, qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scales: Tensor,
    bits: int, n: int, k_in: int, check_offsets: bool = True,
) -> Tensor:
    """MoE experts in one call: rows ``offsets[e]:offsets[e+1]`` of x (sorted by expert) use expert e.

    fp16/bf16 x runs the grouped CUDA kernel on GPUs; fp32 x (and CPU) the reference, expert by expert.

    ``expert_offsets`` must be non-decreasing with ``offsets[0] = 0`` and ``offsets[E] = tokens``: the
    reference checks them on the host, the CUDA path on the device (a device-side assertion, one tiny
    launch) unless ``check_offsets=False`` (offsets lowbit built itself, e.g. ``KbitMoeExperts``).
    """
    check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    return grouped_reference(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)


@torch.library.custom_op("lowbit::kbit_grouped_gemm", mutates_args=())
def kbit_grouped_gemm(
    x: Tensor, expert_offsets: Tensor, qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scales: Tensor,
    bits: int, n: int, k_in: int, check_offsets: bool = True,
) -> Tensor:
    """MoE experts in one call on tensor cores (prefill, large decode batches); same contract as
    :func:`kbit_grouped_gemv`. CPU and fp32: the reference."""
    check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    return grouped_reference(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)


@kbit_grouped_gemm.register_fake
def _(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in, check_offsets=True):
    check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    return x.new_empty((x.shape[0], n))


#: Routes the routed GEMV kernel takes in one call (one per thread of a CTA while it orders them;
#: csrc/tiled/gemv.cuh: kMaxRoutes). Decode sizes: 8 tokens x top-8 is 64.
ROUTED_MAX_ROUTES = 256


def check_kbit_routed_args(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x,
                           swiglu: bool = False) -> int:
    operand = routed_operand(x, route_ids, k_in, rows_per_x, swiglu)
    experts = _check_expert_stack(operand, qweight, qabsmax, codebook, scales, bits, n, k_in)
    check_same_device(x=x, route_ids=route_ids, qweight=qweight)
    return experts


@torch.library.custom_op("lowbit::kbit_routed_gemv", mutates_args=())
def kbit_routed_gemv(
    x: Tensor, route_ids: Tensor, qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scales: Tensor,
    bits: int, n: int, k_in: int, rows_per_x: int = 1, swiglu: bool = False,
) -> Tensor:
    """MoE experts on unsorted rows, one call: output row r is x row ``r // rows_per_x`` times expert
    ``route_ids[r]`` -> ``[len(route_ids), n]``.

    ``swiglu=True`` (down after gate|up): x is the gate|up output ``[rows, 2 K_in]`` and the operand is
    ``silu(gate) * up`` in fp32, rounded once to x's dtype (:func:`lowbit.ops.swiglu_reference`); the CUDA kernel
    stages it once per CTA in shared memory, so no activation kernel runs between the two GEMVs.

    Decode's MoE block calls it with the router's flattened top-k ids: ``rows_per_x = k`` for gate|up
    (each token's hidden state read once per expert it is routed to), 1 for down -- no sort, offsets,
    gather or scatter around it. Ids outside ``[0, E)`` (expert-parallel sentinels) give zero rows.
    fp16/bf16 x with at most ``ROUTED_MAX_ROUTES`` routes runs the grouped CUDA kernel (which orders the
    routes by expert itself, so routes sharing an expert share its weight pass); fp32 x and CPU the reference.
    """
    check_kbit_routed_args(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x, swiglu)
    return routed_reference(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x, swiglu)


@kbit_routed_gemv.register_fake
def _(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x=1, swiglu=False):
    check_kbit_routed_args(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x, swiglu)
    return x.new_empty((route_ids.shape[0], n))


def routed_reference(x, route_ids, qweight, qabsmax, codebook, scales, bits, n, k_in, rows_per_x=1, swiglu=False):
    return per_route(x, route_ids, n, qweight.shape[0], rows_per_x, swiglu,
                     lambda e, rows: tiled_linear_reference(rows, qweight[e], qabsmax[e], codebook, scales[e], bits, n, k_in))


def gemv_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None, rotation=0):
    if rotation:
        x32 = kbit_rotation.rotate(x.to(torch.float32))
        return tiled_linear_reference(x32, qweight, qabsmax, codebook, scale, bits, n, k_in, bias).to(x.dtype)
    return tiled_linear_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


def tiled_linear_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None):
    """``x @ W^T (+ bias)`` in fp32 from the tiled layout, rounded once to x's dtype (= kbit.linear_reference)."""
    w = kbit_tiled.dequantize(qweight, qabsmax, codebook, scale, bits, n, k_in)
    y = x.to(torch.float32) @ w.t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def grouped_reference(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in):
    return per_expert(x, expert_offsets, n, qweight.shape[0], lambda e, rows: tiled_linear_reference(
        rows, qweight[e], qabsmax[e], codebook, scales[e], bits, n, k_in))


@kbit_grouped_gemv.register_fake
def _(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in, check_offsets=True):
    check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    return x.new_empty((x.shape[0], n))


