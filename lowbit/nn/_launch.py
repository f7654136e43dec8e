"""The modules' eager fast path: a launcher per module, built once from its buffers.

Eager decode (plain ``model.generate``) calls every linear once per token; through the torch
dispatcher and the ops' re-checks that costs several times the kernel. A module's buffers were
checked when it was built, so its launcher calls the kernel directly; ``torch.compile`` traces
the custom ops instead (``dispatch.*_op``).
"""

from __future__ import annotations

import torch


def fast_launcher(kind: str, buffers: dict, bits: int, n: int, k_in: int, x: torch.Tensor):
    """A ``GemvLauncher`` (kind "gemv") or ``GroupedLauncher`` ("grouped") for the module's
    buffers, or None where the compiled library is unavailable (the op path then runs)."""
    from ..kernels import cuda_kbit
    from ..kernels.library import library_or_none

    if buffers["qweight"].device != x.device:
        raise ValueError(f"x is on {x.device} but the module's weights are on {buffers['qweight'].device}")
    lib = library_or_none(x.device)
    if lib is None:
        return None
    cls = cuda_kbit.GemvLauncher if kind == "gemv" else cuda_kbit.GroupedLauncher
    scale = buffers["scale"] if kind == "gemv" else buffers["scales"]
    return cls(lib, buffers["qweight"], buffers["qabsmax"], buffers["codebook"], scale, bits, n, k_in)
