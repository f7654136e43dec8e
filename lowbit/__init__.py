"""lowbit: low-bit weight kernels for LLM decoding on NVIDIA GPUs.

Public API (every function works on CPU through the PyTorch reference, and on CUDA through
the compiled kernels where one exists):

    w = lowbit.quantize_kbit(weight, bits=4)      # KbitWeight
    W = lowbit.dequantize_kbit(w, torch.float16)  # [N, K_in]
    y = lowbit.kbit_linear(x, w)                  # x[..., K_in] -> y[..., N]
    experts = lowbit.quantize_kbit_experts(W, bits=4)           # W: [E, N, K_in]
    y = lowbit.kbit_grouped_linear(x_sorted, offsets, experts)  # MoE, one launch
    y = lowbit.dense_linear(x, weight)            # fp16/bf16 weight, tuned decode GEMV for M <= 4
    q = lowbit.quantize_nvfp4(weight)             # NvFp4Weight (E2M1 + E4M3 per 16 + fp32 scale)
    W = lowbit.dequantize_nvfp4(q, torch.bfloat16)
    y = lowbit.nvfp4_linear(x, q)                 # dispatched: checkpoint-layout GEMV (M <= 8), GEMM, dequantize + cuBLAS
    c = lowbit.ops.nvfp4_w4a4_gemv(a, b, sfa, sfb)  # GPU MODE nvfp4_gemv (W4A4); ops.nvfp4_quantize_act: x -> NVFP4
    e = lowbit.quantize_nvfp4_experts(W)          # W: [E, N, K]
    y = lowbit.nvfp4_grouped_linear(x_sorted, offsets, e)       # MoE, one launch
    s = lowbit.quantize_sbvr(weight, num_sums=4)  # SbvrWeight (sums of coefficient x bitvector per 128)
    W = lowbit.dequantize_sbvr(s, torch.bfloat16)
    y = lowbit.sbvr_linear(x, s)

Models:

    report = lowbit.quantize_model(model, bits=4)  # nn.Linear -> lowbit.nn.KbitLinear, MoE experts too
    lowbit.quantize_model(model, format="nvfp4")   # nn.Linear -> lowbit.nn.NvFp4Linear
    lowbit.save_quantized(model, "out/")           # safetensors, sharded, checksummed
    lowbit.load_quantized(skeleton, "out/")        # e.g. a transformers model built from its config
"""

from __future__ import annotations

import torch

from . import dispatch, ops
from ._checks import check_tensor, check_x, offsets_for
from .dispatch import DENSE_GEMV_MAX_M, GEMV_MAX_M
from .formats import e4m4, kbit, nvfp4, sbvr
from .formats.sbvr import SbvrWeight
from .formats.nvfp4 import NvFp4Weight
from .formats.nvfp4 import quantize as quantize_nvfp4
from .formats.kbit import KbitExperts, KbitWeight, normal_float_codebook
from .formats.kbit import quantize as quantize_kbit
from .formats.kbit import quantize_experts as quantize_kbit_experts
from .kernels import register_all as _register_kernels
from .kernels.device import programmatic_launch

_register_kernels()  # every format's CUDA implementations, registered on the ops

from . import nn  # noqa: E402
from ._version import __version__  # noqa: E402
from .model import (GptqOptions, QuantizeReport, gptq_recipe, load_nvfp4_checkpoint, load_quantized,  # noqa: E402
                    quantize_model, save_quantized)




def _check_weight(w: object, cls: type = KbitWeight, made_by: str = "quantize_kbit"):
    """``w`` if it is a ``cls`` (the weight object ``lowbit.<made_by>`` returns), else TypeError."""
    if not isinstance(w, cls):
        raise TypeError(f"w must be a lowbit {cls.__name__} (from lowbit.{made_by}), got {type(w).__name__}")
    return w


def dequantize_kbit(w: KbitWeight, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Dense ``[N, K_in]`` weight of ``dtype`` from a :class:`KbitWeight`."""
    _check_weight(w)
    return ops.kbit_dequantize(*w.tensors(), w.bits, dtype)


def kbit_linear(x: torch.Tensor, w: KbitWeight) -> torch.Tensor:
    """``x[..., K_in] @ W^T -> [..., N]`` in x's dtype (fp16/bf16/fp32), fp32 accumulation.

    Leading dimensions of ``x`` are flattened; a batch of 0 rows gives an empty result.
    The kernel is chosen by :mod:`lowbit.dispatch`.
    """
    _check_weight(w)
    check_x(x, w.shape[1], w.device, contiguous=True)
    lead = x.shape[:-1]
    y = dispatch.kbit_weight_linear_op(x.reshape(-1, x.shape[-1]), w)
    return y.reshape(*lead, y.shape[-1])


def dense_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x[..., K] @ weight[N, K]^T -> [..., N]`` for fp16/bf16 weights (the unquantized layers).

    M = 1..4 rows on CUDA run lowbit's tuned GEMV (``lowbit tune`` re-tunes for a new GPU); larger
    M runs cuBLAS; CPU runs the fp32 reference. Leading dimensions of x are flattened.
    """
    check_tensor("weight", weight, dtypes=(torch.float16, torch.bfloat16), dim=2)
    check_x(x, weight.shape[1], weight.device, dtypes=(weight.dtype,), what="K")
    x = x.contiguous()
    lead = x.shape[:-1]
    y = dispatch.dense_linear_op(x.reshape(-1, x.shape[-1]), weight)
    return y.reshape(*lead, weight.shape[0])


def kbit_grouped_linear(x: torch.Tensor, expert_offsets: torch.Tensor, experts: KbitExperts) -> torch.Tensor:
    """MoE experts in one launch: ``y[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ W_e^T``.

    ``x``: ``[tokens, K_in]`` fp16/bf16, rows sorted by expert; ``expert_offsets``: int64 ``[E + 1]``.
    The dispatcher picks the grouped GEMV or the grouped GEMM from the mean rows per expert.
    """
    if not isinstance(experts, KbitExperts):
        raise TypeError(f"experts must be a lowbit KbitExperts (from lowbit.quantize_kbit_experts), got {type(experts).__name__}")
    e, n, k_in = experts.shape
    check_x(x, k_in, experts.device)
    offsets, check = offsets_for(expert_offsets, x, e)
    qweight, qabsmax = experts.tiled()
    return dispatch.kbit_grouped_op(x, offsets, qweight, qabsmax, experts.codebook, experts.scales,
                                    experts.bits, n, k_in, check)


def _check_nvfp4(w: object) -> NvFp4Weight:
    return _check_weight(w, NvFp4Weight, "quantize_nvfp4")


def dequantize_nvfp4(w: NvFp4Weight, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """The ``[N, K]`` weight in ``dtype`` (fp32 products, one rounding)."""
    return _check_nvfp4(w).dequantize(dtype)


def nvfp4_linear(x: torch.Tensor, w: NvFp4Weight) -> torch.Tensor:
    """``x[..., K] @ W^T`` -> ``[..., N]`` in x's dtype. CUDA fp16/bf16: the path the dispatcher picks
    (``lowbit.dispatch.nvfp4_path``: for M <= 8 a decode GEMV -- on the checkpoint layout or on the tiled
    one, ``lowbit.dispatch.nvfp4_plain_wins`` -- then the tensor-core GEMM on the tiled layout up to the
    crossover, dequantize + cuBLAS beyond; the tiled layout is built on first use and kept on ``w``); CPU: fp32 products rounded once to x's dtype (the reference)."""
    _check_nvfp4(w)
    n, k = w.shape
    check_x(x, k, w.device, what="K")
    lead = x.shape[:-1]
    y = dispatch.nvfp4_linear_op(x.reshape(-1, k).contiguous(), w)
    return y.reshape(*lead, n)


def quantize_sbvr(weight: torch.Tensor, num_sums: int = 4, group: int = sbvr.GROUP, *,
                  progress: bool = False) -> SbvrWeight:
    """SBVR of a float weight ``[N, K]`` (K a multiple of ``group``), encoded on its device
    (:mod:`lowbit.formats.sbvr`); ``progress``: a bar over rows."""
    check_tensor("weight", weight, dtypes=(torch.float32, torch.float16, torch.bfloat16), dim=2)
    return sbvr.quantize(weight, num_sums, group, progress=progress)


def _check_sbvr(w: object) -> SbvrWeight:
    return _check_weight(w, SbvrWeight, "quantize_sbvr")


def dequantize_sbvr(w: SbvrWeight, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """The ``[N, K]`` weight in ``dtype`` (each element's subset sum in fp32, one rounding)."""
    return _check_sbvr(w).dequantize(dtype)


def sbvr_linear(x: torch.Tensor, w: SbvrWeight, act_bits: int | None = None) -> torch.Tensor:
    """``x[..., K] @ W^T`` -> ``[..., N]`` in x's dtype (:func:`lowbit.dispatch.sbvr_linear_op`): weight-only by
    default; ``act_bits=8``: the authors' product for decode-sized M (x rounded to 8 bits per group, the
    popcount GEMV on CUDA; :func:`lowbit.dispatch.sbvr_path` says where)."""
    _check_sbvr(w)
    sbvr.tiled.check_act_bits(act_bits)
    n, k = w.shape
    check_x(x, k, w.device, what="K")
    y = dispatch.sbvr_linear_op(x.reshape(-1, k), *w.layouts(), n, k, w.group, None, act_bits)
    return y.reshape(*x.shape[:-1], n)


def quantize_sbvr_experts(weights: torch.Tensor, num_sums: int = 4, group: int = sbvr.GROUP, *,
                          progress: bool = False) -> "sbvr.SbvrExperts":
    """SBVR of stacked expert weights ``[E, N, K]``, each expert with its own coefficient cache."""
    check_tensor("weights", weights, dtypes=(torch.float32, torch.float16, torch.bfloat16), dim=3)
    return sbvr.quantize_experts(weights, num_sums, group, progress=progress)


def sbvr_grouped_linear(x: torch.Tensor, expert_offsets: torch.Tensor, experts: "sbvr.SbvrExperts",
                        act_bits: int | None = 8) -> torch.Tensor:
    """MoE experts: ``y[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ W_e^T`` (rows sorted by expert).
    ``act_bits=8``: the grouped popcount GEMV (x rounded to 8 bits per group; one launch) up to 4 rows per
    expert on average; otherwise, and with ``act_bits=None``, weight-only, expert by expert."""
    if not isinstance(experts, sbvr.SbvrExperts):
        raise TypeError(f"experts must be a lowbit SbvrExperts (from lowbit.quantize_sbvr_experts), got {type(experts).__name__}")
    sbvr.tiled.check_act_bits(act_bits)
    e, n, k = experts.shape
    check_x(x, k, experts.device)
    offsets, check = offsets_for(expert_offsets, x, e)
    return dispatch.sbvr_grouped_op(x, offsets, experts, act_bits, check)


def quantize_nvfp4_experts(weights: torch.Tensor) -> "nvfp4.NvFp4Experts":
    """NVFP4 of a stack of expert weights ``[E, N, K]`` (K % 32 == 0) in the tiled layout, for
    :func:`nvfp4_grouped_linear`."""
    check_tensor("weights", weights, dtypes=(torch.float32, torch.float16, torch.bfloat16), dim=3)
    return nvfp4.NvFp4Experts.from_weights(quantize_nvfp4(w) for w in weights)


def nvfp4_grouped_linear(x: torch.Tensor, expert_offsets: torch.Tensor, experts: "nvfp4.NvFp4Experts") -> torch.Tensor:
    """MoE rows ``x [tokens, K]`` sorted by expert (``expert_offsets`` int64 [E + 1]) times their NVFP4
    experts, one launch on CUDA fp16/bf16 (the grouped decode GEMV at a few rows per expert, the grouped
    tensor-core GEMM from the measured crossover on: prefill, large batches), the reference elsewhere."""
    if not isinstance(experts, nvfp4.NvFp4Experts):
        raise TypeError(f"experts must be an NvFp4Experts (lowbit.quantize_nvfp4_experts), got {type(experts).__name__}")
    check_x(x, experts.k, experts.qweight.device, what="K")
    offsets, check = offsets_for(expert_offsets, x, experts.qweight.shape[0])
    return dispatch.nvfp4_grouped_op(x, offsets, experts, check)


__all__ = [
    "NvFp4Weight",
    "nvfp4_grouped_linear",
    "quantize_nvfp4_experts",
    "dequantize_nvfp4",
    "nvfp4",
    "nvfp4_linear",
    "quantize_nvfp4",
    "quantize_sbvr",
    "dequantize_sbvr",
    "sbvr_linear",
    "quantize_sbvr_experts",
    "sbvr_grouped_linear",
    "SbvrWeight",
    "sbvr",
    "GEMV_MAX_M",
    "QuantizeReport",
    "load_nvfp4_checkpoint",
    "load_quantized",
    "nn",
    "quantize_model",
    "GptqOptions",
    "gptq_recipe",
    "save_quantized",
    "KbitExperts",
    "KbitWeight",
    "kbit_grouped_linear",
    "dense_linear",
    "quantize_kbit_experts",
    "dequantize_kbit",
    "e4m4",
    "kbit",
    "kbit_linear",
    "normal_float_codebook",
    "ops",
    "programmatic_launch",
    "quantize_kbit",
]
