"""CUDA implementation of ``lowbit::moe_router`` (csrc/moe/router.cu)."""

from __future__ import annotations

import ctypes

import torch

from .. import ops
from .device import pdl_supported
from .library import library_or_none, ptr, register_signatures, stream_of
from .tiled import _pdl_arg, counters

_P, _I = ctypes.c_void_p, ctypes.c_int
register_signatures({
    # x, weight, logits, scores, indices, counter, tokens, experts, hidden, top_k, rows, flags, stream
    "moe_router": [_P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _P],
})

_NORMALIZE, _FP32_SCORES = 2, 4


def supported(x: torch.Tensor, weight: torch.Tensor, top_k: int) -> bool:
    """Whether the CUDA kernel takes this call (shapes and dtypes only, so it traces)."""
    tokens, hidden = x.shape
    return (x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and 1 <= tokens <= ops.ROUTER_MAX_TOKENS
            and weight.shape[0] <= ops.ROUTER_MAX_EXPERTS and top_k <= ops.ROUTER_MAX_TOP_K and hidden % 8 == 0)


def rows_per_cta(experts: int, sms: int) -> int:
    """Expert rows per CTA: the fewest (1, 2, 4, 8) that keep the grid within one CTA per SM (each CTA
    spreads its rows' hidden dimension over 256 threads, so fewer rows per CTA means more loads in flight)."""
    for rows in (1, 2, 4):
        if -(-experts // rows) <= sms:
            return rows
    return 8


@ops.moe_router.register_kernel("cuda")
def _(x, weight, top_k, normalize, fp32_scores):
    tokens, experts, hidden = ops.check_moe_router_args(x, weight, top_k)
    lib = library_or_none(x.device)
    if lib is None or not supported(x, weight, top_k) or x.data_ptr() % 16 or weight.data_ptr() % 16:
        return ops.moe_router_reference(x, weight, top_k, normalize, fp32_scores)
    logits = x.new_empty((tokens, experts))
    scores = x.new_empty((tokens, top_k), dtype=torch.float32 if fp32_scores else x.dtype)
    indices = x.new_empty((tokens, top_k), dtype=torch.int64)
    # the tiled GEMVs' counters (one): every user resets what it takes, and under PDL touches them only
    # after waiting for its predecessor
    cnt = counters(x.device, 1)
    flags = (_NORMALIZE if normalize else 0) | (_FP32_SCORES if fp32_scores else 0)
    rows = rows_per_cta(experts, torch.cuda.get_device_properties(x.device).multi_processor_count)
    lib.call("moe_router", [ptr(x), ptr(weight), ptr(logits), ptr(scores), ptr(indices), ptr(cnt), tokens, experts,
                            hidden, top_k, rows, _pdl_arg(pdl_supported(x.device), flags), stream_of(x.device)],
             dtype=x.dtype)
    return logits, scores, indices
