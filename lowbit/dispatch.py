"""Dispatch: which kbit kernel runs a call, decided in one place from the call's shape and device.

Everything that computes a kbit matmul (the functional API, the ``lowbit.nn`` modules) goes
through here, so a new kernel (the tensor-core GEMM, measured crossovers) changes this file only.

Paths today:

* ``"gemv"``: CUDA, fp16/bf16 activations, 1 <= M <= :data:`GEMV_MAX_M` rows -- the decode GEMV.
* ``"dequant_matmul"``: everything else -- the weight decoded from the tiled layout, then a
  matmul (cuBLAS on CUDA; on CPU the fp32 reference, which *is* the definition).
* grouped (MoE): CUDA fp16/bf16 -> the grouped GEMV, which takes any number of rows per expert
  (8 at a time); CPU and fp32 -> the reference, expert by expert.

Two ways to call a path: ``*_op`` goes through the ``torch.ops.lowbit`` custom ops (what
``torch.compile`` traces), the launchers in ``kernels.cuda_kbit`` skip the dispatcher (the modules'
eager fast path). Both run the same kernels with the same decisions.
"""

from __future__ import annotations

import torch

from . import ops

#: largest batch the decode GEMV kernels take; larger M dequantizes and calls cuBLAS.
GEMV_MAX_M = 4
GEMV_DTYPES = (torch.float16, torch.bfloat16)


def use_gemv(is_cuda: bool, dtype: torch.dtype, m: int) -> bool:
    """True where the decode GEMV runs: CUDA, fp16/bf16, 1 <= M <= GEMV_MAX_M rows."""
    return is_cuda and 1 <= m <= GEMV_MAX_M and dtype in GEMV_DTYPES


def fusable_bias(bias: torch.Tensor, x: torch.Tensor) -> bool:
    """The GEMV kernels add a bias of x's dtype, contiguous, in fp32 before rounding; any other
    bias is added after them."""
    return bias.dtype == x.dtype and bias.is_contiguous()


def kbit_path(x2: torch.Tensor) -> str:
    """The path for a 2-D activation ``x2 [M, K_in]``: ``"gemv"`` or ``"dequant_matmul"``."""
    return "gemv" if use_gemv(x2.is_cuda, x2.dtype, x2.shape[0]) else "dequant_matmul"


def grouped_path(x2: torch.Tensor) -> str:
    """The path for sorted MoE rows ``x2 [rows, K_in]``: ``"grouped_gemv"`` or ``"reference"``."""
    if x2.is_cuda and x2.dtype in GEMV_DTYPES:
        return "grouped_gemv"
    return "reference"


def kbit_tiled_linear_op(x2, qweight, qabsmax, codebook, scale, bits: int, n: int, k_in: int,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x2 [M, K_in] @ W^T (+ bias)`` for a weight held in the tiled layout, through the custom ops."""
    if kbit_path(x2) == "gemv":
        return ops.kbit_gemv(x2, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    return ops.kbit_tiled_linear(x2, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


def kbit_grouped_op(x2, offsets, qweight, qabsmax, codebook, scales, bits: int, n: int, k_in: int) -> torch.Tensor:
    """Grouped MoE matmul through the custom ops (the op's CPU default is the reference)."""
    return ops.kbit_grouped_gemv(x2, offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)


# ------------------------------------------------------------------ eager fast path
# Eager decode (plain ``model.generate``) calls every linear once per token; through the torch
# dispatcher and the ops' re-checks that costs several times the kernel. A module's tensors were
# checked when it was built, so it keeps a launcher that calls the kernel directly;
# ``torch.compile`` traces the custom ops instead (``*_op`` above).
def eager_launcher(kind: str, buffers: dict, bits: int, n: int, k_in: int, x: torch.Tensor):
    """A ``GemvLauncher`` (kind "gemv") or ``GroupedLauncher`` ("grouped") for the module's
    buffers, or None where the compiled library is unavailable (the op path then runs)."""
    from .kernels import cuda_kbit
    from .kernels.library import library_or_none

    if buffers["qweight"].device != x.device:
        raise ValueError(f"x is on {x.device} but the module's weights are on {buffers['qweight'].device}")
    lib = library_or_none(x.device)
    if lib is None:
        return None
    cls = cuda_kbit.GemvLauncher if kind == "gemv" else cuda_kbit.GroupedLauncher
    scale = buffers["scale"] if kind == "gemv" else buffers["scales"]
    return cls(lib, buffers["qweight"], buffers["qabsmax"], buffers["codebook"], scale, bits, n, k_in)
