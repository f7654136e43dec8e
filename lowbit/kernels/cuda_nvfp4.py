"""CUDA implementations of the NVFP4 ops: the kbit tensor-core GEMV and GEMM instantiated for NVFP4
weights (``csrc/kbit_gemv.cu`` / ``kbit_gemm.cu``, FP4 = true: E2M1 lookup table, E4M3 fragment
scales; layout ``lowbit/formats/nvfp4_tiled.py``)."""

from __future__ import annotations

import torch

from .. import ops
from ..formats import nvfp4
from .cuda_kbit import GemmLauncher, GemvLauncher, _with_bias
from .library import library_or_none

_e2m1: dict[torch.device, torch.Tensor] = {}


def e2m1_codebook(device: torch.device) -> torch.Tensor:
    """The 16 E2M1 values as the GEMM's codebook (one fp32 tensor per device, kept)."""
    if device not in _e2m1:
        _e2m1[device] = nvfp4.e2m1_values(device)
    return _e2m1[device]


def gemm_launcher(lib, qweight, qscales, scale_2, n: int, k: int) -> GemmLauncher:
    return GemmLauncher(lib, qweight, qscales, e2m1_codebook(qweight.device), scale_2, 4, n, k, op="nvfp4_gemm")


def gemv_launcher(lib, qweight, qscales, scale_2, n: int, k: int) -> GemvLauncher:
    return GemvLauncher(lib, qweight, qscales, e2m1_codebook(qweight.device), scale_2, "nvfp4", n, k)


@ops.nvfp4_gemv.register_kernel("cuda")
def _(x, qweight, qscales, scale_2, n, k):
    m = ops.check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    if not 1 <= m <= 8:
        raise ValueError(f"nvfp4_gemv takes 1..8 rows, got {m}")
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:
        return ops.nvfp4_tiled_reference(x, qweight, qscales, scale_2, n, k)
    launch = gemv_launcher(lib, qweight, qscales, scale_2.reshape(()).contiguous(), n, k)
    return launch(x.contiguous(), m, (m, n))


@ops.nvfp4_gemm.register_kernel("cuda")
def _(x, qweight, qscales, scale_2, n, k):
    m = ops.check_nvfp4_gemm_args(x, qweight, qscales, scale_2, n, k)
    lib = library_or_none(x.device)
    if lib is None or x.dtype == torch.float32:
        return ops.nvfp4_tiled_reference(x, qweight, qscales, scale_2, n, k)
    if m == 0:
        return x.new_empty((0, n))
    launch = gemm_launcher(lib, qweight, qscales, scale_2.reshape(()).contiguous(), n, k)
    return _with_bias(lambda b: launch(x.contiguous(), b), x, None)
