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
    """(batch, query heads, KV heads, cache length, head dim) of valid arguments; raises otherwise.
    q may have any strides (the CUDA path reads a contiguous copy of an uncommon one)."""
    check_tensor("q", q, dtypes=FLOAT_DTYPES, dim=3, contiguous=False)
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
        check_tensor("mask", mask, dtypes=(torch.bool,), contiguous=False)
        rows = tuple(mask.shape[1:-1]) == (1,) * (mask.dim() - 2) and mask.dim() in (2, 4)
        if not rows or mask.shape[0] not in (1, b) or mask.shape[-1] != length or mask.stride(-1) != 1:
            raise ValueError(f"mask must be bool [batch={b} or 1, length={length}] or [batch or 1, 1, 1, length] "
                             f"(True = attend) with unit stride along length, got {tuple(mask.shape)} strides "
                             f"{mask.stride()}")
    if not (isinstance(scale, float) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite float, got {scale!r}")
    check_same_device(q=q, k=k, v=v, **({} if mask is None else {"mask": mask}))
    return b, hq, hkv, length, d


@torch.library.custom_op("lowbit::decode_attention", mutates_args=(), tags=(torch.Tag.flexible_layout,))
def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """``softmax(scale * q K^T, masked) V`` for one query token per sequence: ``q [B, Hq, D]``, ``k, v
    [B, Hkv, L, D]`` (a KV cache; query head h reads KV head ``h // (Hq / Hkv)``), ``mask`` bool ``[B, L]`` (or transformers'
    ``[B, 1, 1, L]``; a batch of 1 broadcasts)
    (True = attend; None = every position). Returns ``[B, Hq, D]`` in q's dtype: scores, softmax and
    the weighted sum in fp32, rounded once. A sequence with no visible position gets NaN (as torch's
    math attention)."""
    check_decode_attention_args(q, k, v, mask, scale)
    return decode_attention_reference(q, k, v, mask, scale)


@decode_attention.register_fake
def _(q, k, v, mask, scale):
    check_decode_attention_args(q, k, v, mask, scale)
    return torch.empty_like(q)


def mask_rows(mask: Tensor, batch: int) -> Tensor:
    """A mask of either accepted shape as ``[batch, length]`` (a view)."""
    return mask.reshape(mask.shape[0], mask.shape[-1]).expand(batch, mask.shape[-1])


def decode_attention_reference(q, k, v, mask, scale):
    b, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qf = q.to(torch.float32).view(b, hkv, g, d)
    s = torch.einsum("bhgd,bhld->bhgl", qf, k.to(torch.float32)) * scale
    if mask is not None:
        s = s.masked_fill(~mask_rows(mask, b)[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhgl,bhld->bhgd", p, v.to(torch.float32)).reshape(b, hq, d).to(q.dtype)


# ---- the decode step's rotary embedding + KV-cache append + attention, one op

def _check_rows(name: str, t, dtype, dim: int) -> None:
    check_tensor(name, t, dtypes=(dtype,), dim=dim, contiguous=False)
    if t.stride(-1) != 1 or (dim >= 3 and t.shape[-2] > 1 and t.stride(-2) != t.shape[-1]):
        raise ValueError(f"{name} must hold each head's elements contiguously, got strides {t.stride()}")


def check_decode_append_args(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale, q_norm=None,
                             k_norm=None, norm_eps=0.0):
    """(batch, query heads, KV heads, cache length, head dim) of valid arguments; raises otherwise."""
    check_tensor("q", q, dtypes=FLOAT_DTYPES, dim=3, contiguous=False)
    for name, t, dim in (("q", q, 3), ("k_new", k_new, 3), ("v_new", v_new, 3), ("cos", cos, cos.dim()),
                         ("sin", sin, sin.dim())):
        _check_rows(name, t, q.dtype, dim)
    b, hq, d = q.shape
    if d % 2:
        raise ValueError(f"head_dim must be even for the rotary embedding, got {d}")
    if k_new.shape != v_new.shape or k_new.shape[0] != b or k_new.shape[2] != d:
        raise ValueError(f"k_new and v_new must be [batch={b}, kv_heads, head_dim={d}] alike, got "
                         f"{tuple(k_new.shape)} and {tuple(v_new.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) not in ((b, d), (b, 1, d)):
            raise ValueError(f"{name} must be [batch={b}, head_dim={d}] or [batch, 1, head_dim], got {tuple(t.shape)}")
    b_, hq_, hkv, length, d_ = check_decode_attention_args(q, k_cache, v_cache, mask, scale)
    if k_new.shape[1] != hkv:
        raise ValueError(f"k_new has {k_new.shape[1]} KV heads, the cache {hkv}")
    check_tensor("position", position, dtypes=(torch.int64,), contiguous=False)
    if position.numel() != 1:
        raise ValueError(f"position must hold one cache index (the step's), got shape {tuple(position.shape)}")
    check_same_device(q=q, k_new=k_new, v_new=v_new, cos=cos, sin=sin, k_cache=k_cache, position=position)
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        if w is not None:
            check_tensor(name, w, dtypes=(q.dtype,), dim=1)
            if w.shape[0] != d:
                raise ValueError(f"{name} must be [head_dim={d}] RMSNorm weights, got {tuple(w.shape)}")
            check_same_device(q=q, **{name: w})
    if not (isinstance(norm_eps, float) and norm_eps >= 0):
        raise ValueError(f"norm_eps must be a float >= 0, got {norm_eps!r}")
    return b, hq, hkv, length, d


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' RMSNorm over the last dimension (Llama / Qwen3): fp32 statistics, the normalized value rounded
    to x's dtype, times the weight."""
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normed


def rope_reference(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half rotary embedding of ``x [B, H, D]`` with ``cos, sin [B, D]`` or ``[B, 1, D]`` (transformers'
    ``apply_rotary_pos_emb``), in fp32, rounded to x's dtype."""
    xf, c, s = x.float(), cos.float().reshape(x.shape[0], 1, -1), sin.float().reshape(x.shape[0], 1, -1)
    half = x.shape[-1] // 2
    return (xf * c + torch.cat((-xf[..., half:], xf[..., :half]), dim=-1) * s).to(x.dtype)


# flexible_layout: torch.compile passes cos, sin and the mask as it made them, one buffer for every layer; by
# default it would copy each into the exact strides of eager mode, per layer (two small kernels per layer)
@torch.library.custom_op("lowbit::decode_attention_append", mutates_args=("k_cache", "v_cache", "position"),
                         tags=(torch.Tag.flexible_layout,))
def decode_attention_append(q: Tensor, k_new: Tensor, v_new: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor,
                            v_cache: Tensor, position: Tensor, mask: Tensor | None, scale: float,
                            early_kv: bool = False, q_norm: Tensor | None = None, k_norm: Tensor | None = None,
                            norm_eps: float = 0.0) -> Tensor:
    """One decode step of a rotary-embedding attention layer: rotate ``q [B, Hq, D]`` and the new token's
    ``k_new [B, Hkv, D]`` with ``cos, sin [B, D]`` (or transformers' ``[B, 1, D]``) (:func:`rope_reference`),
    write ``k_new`` (rotated) and ``v_new`` into row ``position`` (int64, one element, on the device) of the
    caches ``k_cache, v_cache [B, Hkv, L, D]`` (in place), then :func:`decode_attention` of the rotated q against
    the caches, and advances ``position`` by one (in place, as transformers' static cache layer advances its
    length). ``q_norm`` / ``k_norm`` (``[D]`` weights, optional): each q head / k head RMS-normalized first
    (:func:`rms_norm_reference` with ``norm_eps``; Qwen3's per-head norms). A position outside the cache raises
    here; the CUDA kernel (which cannot raise without a synchronization) writes nothing, leaves the position and
    returns NaN. ``early_kv`` (CUDA, under programmatic launch): read the first cache rows and the position before
    waiting for the kernel launched just before -- only when that kernel writes neither the caches nor the
    position (in a decode step: the q|k|v projection)."""
    check_decode_append_args(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale, q_norm, k_norm,
                             norm_eps)
    return decode_attention_append_reference(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale,
                                             q_norm, k_norm, norm_eps)


def decode_attention_append_reference(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale, q_norm=None,
                                      k_norm=None, norm_eps=0.0):
    if q_norm is not None:
        q = rms_norm_reference(q, q_norm, norm_eps)
    if k_norm is not None:
        k_new = rms_norm_reference(k_new, k_norm, norm_eps)
    idx = position.reshape(1)
    k_cache.index_copy_(2, idx, rope_reference(k_new, cos, sin)[:, :, None])
    v_cache.index_copy_(2, idx, v_new[:, :, None])
    out = decode_attention_reference(rope_reference(q, cos, sin), k_cache, v_cache, mask, scale)
    position.add_(1)
    return out


@decode_attention_append.register_fake
def _(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale, early_kv=False, q_norm=None, k_norm=None,
      norm_eps=0.0):
    check_decode_append_args(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale, q_norm, k_norm,
                             norm_eps)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)
