"""An optional rotation of a kbit weight's input space: a 32-point Walsh-Hadamard transform per block.

A weight stored with ``rotation=32`` holds ``W H`` (``H``: block-diagonal, one orthonormal 32 x 32
Walsh-Hadamard matrix per 32-element block, kbit's own block) and computes ``y = (x H) (W H)^T``, which
is ``x W^T`` before quantization. The rotation spreads each block's outliers over its 32 elements, so
the block absmax wastes fewer levels; with GPTQ and a fitted codebook it took SmolLM2's KL from 0.293
to 0.211 at 3 bits and from 1.63 to 0.93 at 2 bits (benchmarks/journal/2026-11-24_gptq_calibration.md).
``H`` is symmetric and its own inverse, so the same transform rotates activations in and weights back out.

Where it runs: the decode GEMV (M <= 8) computes ``x H`` inside the kernel, on the tensor cores, from
the x registers it already holds (csrc/tiled/gemv.cuh, ``rotate_x``); larger batches rotate x with
:func:`rotate` before the GEMM. Cost (H100, cold L2): +15-30% per GEMV on Llama-3-8B shapes, ~8% of a
batch-1 decode step: a 16-row unit rotates its x again, so the work grows with N x K / 16, not K.
"""

from __future__ import annotations

import torch

BLOCK = 32
ROTATIONS = (0, 32)  # 0: none


def check_rotation(rotation: object) -> int:
    if isinstance(rotation, bool) or rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {ROTATIONS} (0: none, 32: block-32 Hadamard), got {rotation!r}")
    return int(rotation)


_CACHE: dict = {}


def hadamard(device=None) -> torch.Tensor:
    """The orthonormal 32 x 32 Walsh-Hadamard matrix (Sylvester order), fp32."""
    key = torch.device(device or "cpu")
    h = _CACHE.get(key)
    if h is None:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < BLOCK:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        h = _CACHE[key] = (h / BLOCK**0.5).to(torch.float32).to(key)
    return h


def rotate(x: torch.Tensor) -> torch.Tensor:
    """``x [..., K]`` times the block-diagonal Hadamard (K a multiple of 32), in fp32, returned in x's dtype.
    Applied to a weight's rows it rotates them in or (being its own inverse) back out."""
    k = x.shape[-1]
    if k % BLOCK:
        raise ValueError(f"rotation needs a last dimension that is a multiple of {BLOCK}, got {k}")
    h = hadamard(x.device)
    return (x.to(torch.float32).reshape(*x.shape[:-1], k // BLOCK, BLOCK) @ h).reshape(x.shape).to(x.dtype)
