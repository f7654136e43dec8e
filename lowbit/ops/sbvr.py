"""SBVR's ops on the GPU layout (:mod:`lowbit.formats.sbvr.tiled`): the popcount GEMV (activations as 8
bit-planes per group, the authors' product), its activation encoder, and the dequantize of the weight-only path.
The ops trust the values of ``qidx`` (cache rows): they come from a checked ``SbvrWeight``."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import FLOAT_DTYPES, check_same_device, check_tensor
from ..formats import sbvr
from ..formats.sbvr import tiled as sbvr_tiled
from .common import GEMV_MAX_M, _check_out_dtype, check_bias, per_expert


def _check_lines(qidx, cache8, n, k, group) -> tuple[int, int]:
    """n, k, group and the line tensors every SBVR kernel reads; returns (tiles, chunks)."""
    check_tensor("qidx", qidx, dtypes=(torch.int32,), dim=3)
    check_tensor("cache8", cache8, dtypes=(torch.float16,), dim=2)
    if not (isinstance(n, int) and isinstance(k, int) and n >= 1 and k >= sbvr.WORD):
        raise ValueError(f"n >= 1 and k >= {sbvr.WORD} must be ints, got n={n!r}, k={k!r}")
    sbvr.check_group(group)
    if k % group:
        raise ValueError(f"k = {k} is not a multiple of group={group}")
    tiles, chunks = sbvr_tiled.tiled_shape(n, k)
    if tuple(qidx.shape) != (tiles, k // group, 8):
        raise ValueError(f"qidx must be {(tiles, k // group, 8)}, got {tuple(qidx.shape)}")
    if cache8.shape[1] != sbvr_tiled.CACHE_PAD or not 1 <= cache8.shape[0] <= sbvr.MAX_LINES:
        raise ValueError(f"cache8 must be [1..{sbvr.MAX_LINES}, {sbvr_tiled.CACHE_PAD}], got {tuple(cache8.shape)}")
    check_same_device(qidx=qidx, cache8=cache8)
    return tiles, chunks


def _check_x(op, x, weight, n, k, bias) -> int:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    if x.shape[1] != k:
        raise ValueError(f"x must have shape [M, K={k}], got {tuple(x.shape)}")
    if not 1 <= x.shape[0] <= GEMV_MAX_M:
        raise ValueError(f"{op} takes M = 1..{GEMV_MAX_M} rows of x, got {x.shape[0]}")
    check_same_device(x=x, weight=weight)
    check_bias(bias, n, x)
    return x.shape[0]


def check_sbvr_tiled_args(qbits, qidx, cache8, n, k, group) -> int:
    """Shapes and dtypes of an SBVR weight in the tiled layout; returns num_sums."""
    check_tensor("qbits", qbits, dtypes=(torch.int32,), dim=4)
    tiles, chunks = _check_lines(qidx, cache8, n, k, group)
    ns = qbits.shape[-1] // 2
    if qbits.shape[-1] % 2 or ns not in sbvr.SUPPORTED_NUM_SUMS or tuple(qbits.shape) != (tiles, chunks, 32, 2 * ns):
        raise ValueError(f"qbits must be [{tiles}, {chunks}, 32, 2 * num_sums] for [{n}, {k}], got {tuple(qbits.shape)}")
    check_same_device(qbits=qbits, qidx=qidx)
    return ns


def check_sbvr_gemv_args(x, qbits, qidx, cache8, n, k, group, bias=None) -> int:
    check_sbvr_tiled_args(qbits, qidx, cache8, n, k, group)
    return _check_x("sbvr_gemv", x, qbits, n, k, bias)


def check_sbvr_lookup_args(x, qcodes, qidx, cache8, n, k, group, bias=None) -> int:
    check_tensor("qcodes", qcodes, dtypes=(torch.int32,), dim=4)
    tiles, chunks = _check_lines(qidx, cache8, n, k, group)
    if tuple(qcodes.shape) != (tiles, chunks, 32, 8):
        raise ValueError(f"qcodes must be [{tiles}, {chunks}, 32, 8] for [{n}, {k}], got {tuple(qcodes.shape)}")
    if group % sbvr_tiled.CHUNK:
        raise ValueError(f"the lookup GEMV takes groups that are multiples of {sbvr_tiled.CHUNK}, got {group}")
    check_same_device(qcodes=qcodes, qidx=qidx)
    return _check_x("sbvr_lookup_gemv", x, qcodes, n, k, bias)


def sbvr_gemv_reference(x, qbits, qidx, cache8, n, k, group, bias=None) -> Tensor:
    """The popcount product in fp32: the 8-bit RTN activations times the decoded weight (equal to
    :func:`lowbit.formats.sbvr.linear_bitplane_reference` up to fp32 summation order), rounded once."""
    bitvectors, coeff_idx, cache = sbvr_tiled.untile(qbits, qidx, cache8, n, k)
    x_hat = sbvr.rtn_activations(x, sbvr_tiled.ACT_BITS, sbvr.act_group(group))
    y = x_hat @ sbvr.decode(bitvectors, coeff_idx, cache, group).t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


@torch.library.custom_op("lowbit::sbvr_gemv", mutates_args=())
def sbvr_gemv(x: Tensor, qbits: Tensor, qidx: Tensor, cache8: Tensor, n: int, k: int, group: int,
              bias: Tensor | None = None) -> Tensor:
    """``x [M <= 8, K] @ W^T (+ bias)`` the authors' way: x rounded to 8 bits per activation group
    (:func:`lowbit.formats.sbvr.act_group`), the product from popcounts of weight and activation bit-planes
    on the binary tensor cores, fp32 accumulation, one rounding. CPU and fp32: the reference
    (:func:`lowbit.formats.sbvr.linear_bitplane_reference`)."""
    check_sbvr_gemv_args(x, qbits, qidx, cache8, n, k, group, bias)
    return sbvr_gemv_reference(x, qbits, qidx, cache8, n, k, group, bias)


@sbvr_gemv.register_fake
def _(x, qbits, qidx, cache8, n, k, group, bias=None):
    m = check_sbvr_gemv_args(x, qbits, qidx, cache8, n, k, group, bias)
    return x.new_empty((m, n))


def sbvr_lookup_reference(x, qcodes, qidx, cache8, n, k, group, bias=None) -> Tensor:
    """The weight-only product in fp32 from the lookup GEMV's layout, rounded once to x's dtype."""
    codes = sbvr_tiled.code_untile(qcodes, n, k)
    lines = sbvr_tiled.untile_lines(qidx, n)
    w = torch.gather(sbvr.points(cache8.to(torch.float32))[lines], -1, codes.to(torch.int64).reshape(n, k // group, group))
    y = x.to(torch.float32) @ w.reshape(n, k).t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


@torch.library.custom_op("lowbit::sbvr_lookup_gemv", mutates_args=())
def sbvr_lookup_gemv(x: Tensor, qcodes: Tensor, qidx: Tensor, cache8: Tensor, n: int, k: int, group: int,
                     bias: Tensor | None = None) -> Tensor:
    """Weight-only ``x [M <= 8, K] @ W^T (+ bias)``: each group's subset sums as a table, weights looked up from
    4-bit codes (:func:`lowbit.formats.sbvr.tiled.code_tile`), fp16/bf16 tensor cores, fp32 accumulation, one
    rounding. CPU and fp32: the reference."""
    check_sbvr_lookup_args(x, qcodes, qidx, cache8, n, k, group, bias)
    return sbvr_lookup_reference(x, qcodes, qidx, cache8, n, k, group, bias)


@sbvr_lookup_gemv.register_fake
def _(x, qcodes, qidx, cache8, n, k, group, bias=None):
    m = check_sbvr_lookup_args(x, qcodes, qidx, cache8, n, k, group, bias)
    return x.new_empty((m, n))


def check_sbvr_grouped_args(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group) -> int:
    """The grouped popcount GEMV's arguments (experts stacked on dim 0); returns the expert count."""
    check_tensor("qbits", qbits, dtypes=(torch.int32,), dim=5)
    check_tensor("qidx", qidx, dtypes=(torch.int32,), dim=4)
    experts = qbits.shape[0]
    if qidx.shape[0] != experts:
        raise ValueError(f"qbits and qidx must stack the same experts, got {qbits.shape[0]} and {qidx.shape[0]}")
    check_sbvr_tiled_args(qbits[0], qidx[0], cache8, n, k, group)
    check_tensor("cache_offsets", cache_offsets, dtypes=(torch.int32,), dim=1)
    if cache_offsets.shape[0] != experts + 1:
        raise ValueError(f"cache_offsets must have E + 1 = {experts + 1} entries, got {cache_offsets.shape[0]}")
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    if x.shape[1] != k:
        raise ValueError(f"x must have shape [tokens, K={k}], got {tuple(x.shape)}")
    check_tensor("expert_offsets", expert_offsets, dtypes=(torch.int64,), dim=1)
    if expert_offsets.shape[0] != experts + 1:
        raise ValueError(f"expert_offsets must have E + 1 = {experts + 1} entries, got {expert_offsets.shape[0]}")
    check_same_device(x=x, expert_offsets=expert_offsets, qbits=qbits, cache_offsets=cache_offsets)
    return experts


def sbvr_grouped_reference(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group) -> Tensor:
    """Expert by expert: each expert's rows through the popcount product's reference."""
    lines = cache_offsets.tolist()
    return per_expert(x, expert_offsets, n, qbits.shape[0], lambda e, rows: sbvr_gemv_reference(
        rows, qbits[e], qidx[e], cache8[lines[e]:lines[e + 1]], n, k, group))


@torch.library.custom_op("lowbit::sbvr_grouped_gemv", mutates_args=())
def sbvr_grouped_gemv(x: Tensor, expert_offsets: Tensor, qbits: Tensor, qidx: Tensor, cache8: Tensor,
                      cache_offsets: Tensor, n: int, k: int, group: int, check_offsets: bool = True) -> Tensor:
    """MoE rows sorted by expert (expert e owns rows ``expert_offsets[e]:expert_offsets[e + 1]``) times the stacked
    SBVR experts: the popcount product of every row (x rounded to 8 bits per group), one launch, each expert's
    rows in blocks of 4 per pass over its weight. ``check_offsets=False``: offsets built by lowbit. CPU and
    fp32: the reference, expert by expert."""
    check_sbvr_grouped_args(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group)
    return sbvr_grouped_reference(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group)


@sbvr_grouped_gemv.register_fake
def _(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group, check_offsets=True):
    check_sbvr_grouped_args(x, expert_offsets, qbits, qidx, cache8, cache_offsets, n, k, group)
    return x.new_empty((x.shape[0], n))


@torch.library.custom_op("lowbit::sbvr_encode_x", mutates_args=())
def sbvr_encode_x(x: Tensor, group: int) -> tuple[Tensor, Tensor]:
    """The popcount GEMV's activations: ``(xq int32 [M, chunks, 8, 4], xs fp32 [M, K / act_group, 2])``
    (:func:`lowbit.formats.sbvr.tiled.encode_activations_tiled`)."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
    if x.shape[1] % sbvr.act_group(group):
        raise ValueError(f"x's K = {x.shape[1]} is not a multiple of the activation group {sbvr.act_group(group)}")
    return sbvr_tiled.encode_activations_tiled(x, group)


@sbvr_encode_x.register_fake
def _(x, group):
    m, k = x.shape
    return (x.new_empty((m, -(-k // sbvr_tiled.CHUNK), 8, 4), dtype=torch.int32),
            x.new_empty((m, k // sbvr.act_group(group), 2), dtype=torch.float32))


@torch.library.custom_op("lowbit::sbvr_tiled_dequantize", mutates_args=())
def sbvr_tiled_dequantize(qbits: Tensor, qidx: Tensor, cache8: Tensor, n: int, k: int, group: int,
                          dtype: torch.dtype) -> Tensor:
    """The weight ``[n, k]`` in ``dtype`` from the tiled layout: each element's subset sum in fp32,
    rounded once (:func:`lowbit.formats.sbvr.decode`, bit for bit)."""
    check_sbvr_tiled_args(qbits, qidx, cache8, n, k, group)
    _check_out_dtype(dtype)
    return sbvr.decode(*sbvr_tiled.untile(qbits, qidx, cache8, n, k), group, dtype)


@sbvr_tiled_dequantize.register_fake
def _(qbits, qidx, cache8, n, k, group, dtype):
    check_sbvr_tiled_args(qbits, qidx, cache8, n, k, group)
    return qbits.new_empty((n, k), dtype=dtype)
