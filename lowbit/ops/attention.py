"""Decode attention: one query token per sequence against a KV cache (grouped-query heads read each
K/V row once). The reference is the fp32 softmax; CUDA: ``csrc/attention/decode.cu``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import FLOAT_DTYPES, check_same_device, check_tensor

#: (head dim, query heads per KV head) the CUDA kernel is compiled for
DECODE_ATTENTION_SHAPES = frozenset({(64, 1), (64, 2), (64, 4), (64, 8), (128, 1), (128, 2), (128, 4), (128, 8),
                                     (256, 1), (256, 2), (256, 4)})


def check_decode_attention_args(q, k, v, mask, scale) -> tuple[int, int, int, int, int]:
    """(batch, query heads, KV heads, cache length, head dim) of valid arguments; raises otherwise."""
    check_tensor("q", q, dtypes=FLOAT_DTYPES, dim=3)
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, dtypes=(q.dtype,), dim=4, contiguous=False)
        if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1]:
            raise ValueError(f"{name} must hold each position's head_dim elements contiguously (a KV cache "
                             f"[batch, kv_heads, length, head_dim] with rows of head_dim), got strides {t.stride()}")
    b, hq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[-1] != d or k.shape[2] < 1:
        raise ValueError(f"k and v must be [batch={b}, kv_heads, length >= 1, head_dim={d}] alike, "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")
    hkv, length = k.shape[1], k.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if mask is not None:
        check_tensor("mask", mask, dtypes=(torch.bool,), dim=2, contiguous=False)
        if tuple(mask.shape) != (b, length) or mask.stride(-1) != 1:
            raise ValueError(f"mask must be bool [batch={b}, length={length}] (True = attend) with unit stride "
                             f"along length, got {tuple(mask.shape)} strides {mask.stride()}")
    if not (isinstance(scale, float) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite float, got {scale!r}")
    check_same_device(q=q, k=k, v=v, **({} if mask is None else {"mask": mask}))
    return b, hq, hkv, length, d


@torch.library.custom_op("lowbit::decode_attention", mutates_args=())
def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """``softmax(scale * q K^T, masked) V`` for one query token per sequence: ``q [B, Hq, D]``, ``k, v
    [B, Hkv, L, D]`` (a KV cache; query head h reads KV head ``h // (Hq / Hkv)``), ``mask`` bool ``[B, L]``
    (True = attend; None = every position). Returns ``[B, Hq, D]`` in q's dtype: scores, softmax and
    the weighted sum in fp32, rounded once. A sequence with no visible position gets NaN (as torch's
    math attention)."""
    check_decode_attention_args(q, k, v, mask, scale)
    return decode_attention_reference(q, k, v, mask, scale)


@decode_attention.register_fake
def _(q, k, v, mask, scale):
    check_decode_attention_args(q, k, v, mask, scale)
    return torch.empty_like(q)


def decode_attention_reference(q, k, v, mask, scale):
    b, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qf = q.to(torch.float32).view(b, hkv, g, d)
    s = torch.einsum("bhgd,bhld->bhgl", qf, k.to(torch.float32)) * scale
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhgl,bhld->bhgd", p, v.to(torch.float32)).reshape(b, hq, d).to(q.dtype)
