"""Op layer: one ``torch.library`` custom op per operation, under the ``lowbit::`` namespace.

Each op has
* a default implementation = the format's pure-PyTorch reference (runs on CPU, and on any
  device no kernel is registered for),
* a fake implementation (shapes/dtypes only) so ``torch.compile(fullgraph=True)`` traces it,
* device kernels registered by ``lowbit.kernels.*`` (CUDA; imported by the package, never by
  this module), which override the default.
All three run the same metadata checks, so bad input fails the same way everywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import FLOAT_DTYPES, check_offsets_values, check_same_device, check_tensor
from .formats import kbit, kbit_tiled


def _check_out_dtype(dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of float16, bfloat16, float32, got {dtype}")


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
    """Bit planes -> the GPU tiled layout (qweight, qabsmax); see lowbit/formats/kbit_tiled.py."""
    check_tensor("planes", planes, dtypes=(torch.int32,))
    check_tensor("absmax", absmax, dtypes=(torch.uint8,))
    return kbit_tiled.repack(planes, absmax, bits)


@kbit_repack.register_fake
def _(planes, absmax, bits):
    t, g = kbit_tiled.tiled_shape(planes.shape[-3], planes.shape[-2] * kbit.BLOCK)
    lead = tuple(planes.shape[:-3])
    return planes.new_empty((*lead, t, g, bits, 32, 4)), absmax.new_empty((*lead, t, g, 128))


def check_bias(bias, n, x) -> None:
    if bias is None:
        return
    check_tensor("bias", bias, dtypes=FLOAT_DTYPES, dim=1, contiguous=False)
    if bias.shape[0] != n:
        raise ValueError(f"bias must have shape [N={n}], got {tuple(bias.shape)}")
    check_same_device(x=x, bias=bias)


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


def check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None) -> int:
    return _check_kernel_x_args("kbit_gemv", (1, 8), x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


@torch.library.custom_op("lowbit::kbit_gemv", mutates_args=())
def kbit_gemv(x: Tensor, qweight: Tensor, qabsmax: Tensor, codebook: Tensor, scale: Tensor, bits: int, n: int, k_in: int,
              bias: Tensor | None = None) -> Tensor:
    """Decode GEMV ``x[M<=8, K_in] @ W^T (+ bias)`` from the tiled layout; fp16/bf16 in and out, fp32
    accumulation, the bias added in fp32 before the one rounding."""
    check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    return gemv_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


@kbit_gemv.register_fake
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None):
    m = check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    return x.new_empty((m, n))


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


def check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in) -> int:
    check_tensor("qweight", qweight, dtypes=(torch.int32,))
    if qweight.dim() != 6:
        raise ValueError(f"qweight must be [E, tiles, groups, bits, 32, 4] for grouped experts, got {tuple(qweight.shape)}")
    experts = qweight.shape[0]
    check_tiled_args(qweight, qabsmax, codebook, scales, bits, n, k_in, experts=experts)
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    if x.shape[1] != k_in:
        raise ValueError(f"x must have shape [tokens, K_in={k_in}], got {tuple(x.shape)}")
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


def gemv_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None):
    return tiled_linear_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


def tiled_linear_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in, bias=None):
    """``x @ W^T (+ bias)`` in fp32 from the tiled layout, rounded once to x's dtype (= kbit.linear_reference)."""
    w = kbit_tiled.dequantize(qweight, qabsmax, codebook, scale, bits, n, k_in)
    y = x.to(torch.float32) @ w.t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def per_expert(x, expert_offsets, n: int, experts: int, linear) -> Tensor:
    """The grouped references: rows ``[off[e], off[e+1])`` of x through ``linear(e, rows)`` expert by expert."""
    off = check_offsets_values(expert_offsets, x.shape[0])
    y = x.new_empty((x.shape[0], n))
    for e in range(experts):
        if off[e + 1] > off[e]:
            y[off[e]:off[e + 1]] = linear(e, x[off[e]:off[e + 1]])
    return y


def grouped_reference(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in):
    return per_expert(x, expert_offsets, n, qweight.shape[0], lambda e, rows: tiled_linear_reference(
        rows, qweight[e], qabsmax[e], codebook, scales[e], bits, n, k_in))


@kbit_grouped_gemv.register_fake
def _(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in, check_offsets=True):
    check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    return x.new_empty((x.shape[0], n))


# ------------------------------------------------------------------ NVFP4
def check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k) -> int:
    from .formats import nvfp4_tiled

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
    from .formats import nvfp4_tiled

    w = nvfp4_tiled.dequantize(qweight, qscales, scale_2, n, k)
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
    if not 1 <= m <= 8:
        raise ValueError(f"nvfp4_gemv takes 1..8 rows, got {m}")
    return nvfp4_tiled_reference(x, qweight, qscales, scale_2, n, k)


@nvfp4_gemv.register_fake
def _(x, qweight, qscales, scale_2, n, k):
    m = check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    return x.new_empty((m, n))


def check_nvfp4_grouped_args(x, expert_offsets, qweight, qscales, scale_2, n, k) -> int:
    from .formats import nvfp4_tiled

    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    check_tensor("qweight", qweight, dtypes=(torch.int32,))
    check_tensor("qscales", qscales, dtypes=(torch.uint8,))
    check_tensor("scale_2", scale_2, dtypes=(torch.float32,), dim=1)
    check_tensor("expert_offsets", expert_offsets, dtypes=(torch.int64,), dim=1)
    if not (isinstance(n, int) and isinstance(k, int) and n >= 1 and k >= 32 and k % 32 == 0):
        raise ValueError(f"n >= 1 and k (a multiple of 32) must be ints, got n={n!r}, k={k!r}")
    e = qweight.shape[0] if qweight.dim() == 6 else -1
    t, g = nvfp4_tiled.tiled_shape(n, k)
    if e < 1 or tuple(qweight.shape) != (e, t, g, 4, 32, 4) or tuple(qscales.shape) != (e, t, g, nvfp4_tiled.SCALE_BYTES):
        raise ValueError(f"qweight / qscales must be [E, {t}, {g}, 4, 32, 4] / [E, {t}, {g}, {nvfp4_tiled.SCALE_BYTES}], "
                         f"got {tuple(qweight.shape)} / {tuple(qscales.shape)}")
    if tuple(scale_2.shape) != (e,) or expert_offsets.shape[0] != e + 1:
        raise ValueError(f"scale_2 [E={e}] and expert_offsets [E + 1] expected, got {tuple(scale_2.shape)} / "
                         f"{tuple(expert_offsets.shape)}")
    if x.shape[1] != k:
        raise ValueError(f"x must have shape [tokens, K={k}], got {tuple(x.shape)}")
    check_same_device(x=x, expert_offsets=expert_offsets, qweight=qweight, qscales=qscales, scale_2=scale_2)
    return e


@torch.library.custom_op("lowbit::nvfp4_grouped_gemv", mutates_args=())
def nvfp4_grouped_gemv(x: Tensor, expert_offsets: Tensor, qweight: Tensor, qscales: Tensor, scale_2: Tensor,
                       n: int, k: int, check_offsets: bool = True) -> Tensor:
    """MoE rows ``x [tokens, K]`` sorted by expert (``expert_offsets`` int64 [E + 1]) times their NVFP4 expert
    weights (tiled layout, :class:`lowbit.formats.nvfp4_tiled.NvFp4Experts`), one launch: the kbit grouped
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
    [N, K/16], fp32 scale_2), no repack: the decode GEMV of csrc/nvfp4_gemv.cu on CUDA fp16/bf16 (up to
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
    csrc/nvfp4_dequant.cu; otherwise the reference."""
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
    from .formats import nvfp4

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
    fp32 accumulation, fp16 out (stored [L, M]-major, as GPU MODE allocates c). CUDA: csrc/nvfp4_gemv.cu;
    CPU: the reference (lowbit.formats.nvfp4.w4a4_gemv_reference)."""
    from .formats import nvfp4

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
    (csrc/nvfp4_quantize.cu, fp16/bf16) checks neither x nor scale_2 (a device scalar; reading it back would
    sync): non-finite values, or a scale_2 <= 0, give unspecified codes."""
    from .formats import nvfp4

    check_quantize_act_args(x, scale_2)
    return nvfp4.quantize_blocks(x, scale_2)


@nvfp4_quantize_act.register_fake
def _(x, scale_2):
    rows, k = check_quantize_act_args(x, scale_2)
    return (x.new_empty((rows, k // 2), dtype=torch.uint8), x.new_empty((rows, k // 16), dtype=torch.float8_e4m3fn))


# ------------------------------------------------------------------ dense (fp16/bf16) GEMV
def check_dense_gemv_args(x, weight) -> tuple[int, int, int]:
    check_tensor("weight", weight, dtypes=(torch.float16, torch.bfloat16), dim=2)
    check_tensor("x", x, dtypes=(weight.dtype,), dim=2)
    n, k = weight.shape
    if x.shape[1] != k:
        raise ValueError(f"x must have shape [M, K={k}] to match weight [N, K], got {tuple(x.shape)}")
    if not 1 <= x.shape[0] <= 4:
        raise ValueError(f"dense_gemv takes M = 1..4 rows of x, got {x.shape[0]} (use torch.nn.functional.linear)")
    if n < 1 or k < 1:
        raise ValueError(f"weight must be non-empty, got shape {tuple(weight.shape)}")
    if n >= 2**31 or k >= 2**31:
        raise ValueError(f"weight dimensions must be < 2^31, got {tuple(weight.shape)}")
    check_same_device(x=x, weight=weight)
    return x.shape[0], n, k


def dense_gemv_reference(x: Tensor, weight: Tensor) -> Tensor:
    """The definition: fp32 products and sums, rounded once to x's dtype."""
    return (x.float() @ weight.float().t()).to(x.dtype)


@torch.library.custom_op("lowbit::dense_gemv", mutates_args=())
def dense_gemv(x: Tensor, weight: Tensor) -> Tensor:
    """Decode GEMV ``x[M<=4, K] @ weight[N, K]^T`` for fp16/bf16 weights, fp32 accumulation."""
    check_dense_gemv_args(x, weight)
    return dense_gemv_reference(x, weight)


@dense_gemv.register_fake
def _(x, weight):
    m, n, _ = check_dense_gemv_args(x, weight)
    return x.new_empty((m, n))

