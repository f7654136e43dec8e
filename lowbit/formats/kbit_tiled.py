"""The GPU layout of kbit weights ("tiled"), produced by :func:`repack`, read by every kbit GEMV kernel.

The bit-plane format (``kbit.py``) stays the storage format; this layout exists so a warp can
feed tensor-core MMAs (``mma.m16n8k16``, weights as the A operand, tokens as B: "swap AB") with
one 16-byte load per K bits of codes and decode **two codes per shared-memory lookup**.

Tiles and groups::

    rows n   : tiles of 16 rows        (N padded to a multiple of 16 with zero codes/absmax)
    cols k   : groups of 8 blocks = 256 (K_in padded to a multiple of 256, likewise)
    tile row r = 8*h + g   (h = row half 0/1, g = 0..7);   lane = 4*g + t  (t = 0..3)

    In block j of a group, lane (g, t) owns rows g and g+8 and the 8 consecutive columns
    k = 32*j + 8*t + 4*m + 2*q + e   (m = which of the block's 2 MMAs, q = k-slot pair, e = 0/1)
    i.e. 16 codes = 8 pairs; pair p = 4*m + 2*q + h is exactly A-fragment register R = 2*q + h
    of MMA m, holding (element e=0, element e=1). Token x[k..k+7] for the same lane is one
    16-byte load that is exactly the B fragments of both MMAs.

Per lane and group, 4*K 32-bit words (K 16-byte chunks):

    K_lo = 4 for K in (4, 5), 2 for K in (2, 3); odd K keeps its top bit apart.
    lo words : block j, pair p -> field (lo(e0) | lo(e1) << K_lo), 2*K_lo bits,
               K_lo=4: byte p%4 of word 2*j + p//4;  K_lo=2: nibble p of word j
    hi words : (odd K) word 4*K_lo + j//2, bits 16*(j%2) + 2*p + e = top bit of element e

    qweight : int32 [..., T, G, K, 32, 4]   word i of lane l at [..., c = i // 4, l, i % 4]
              (a warp's load of chunk c covers 512 contiguous bytes)
    qabsmax : uint8 [..., T, G, 128]        byte 16*g + 8*h + j = absmax of row 8*h+g, block j
              (lane (g, t) loads its 16 bytes in one load; the 4 lanes of a row group share it)

The kernels' lookup table has an entry per pair field ``lo0 | lo1 << K_lo | hi0 << 2K_lo |
hi1 << 2K_lo+1`` holding (codebook[code0], codebook[code1]) as two fp16/bf16 values.
"""

from __future__ import annotations

import torch

from . import kbit

TILE_N = 16
GROUP_BLOCKS = 8
GROUP_K = GROUP_BLOCKS * kbit.BLOCK


def lo_bits(bits: int) -> int:
    return 4 if bits >= 4 else 2


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def tiled_shape(n: int, k_in: int) -> tuple[int, int]:
    """(tiles, groups) for a weight [n, k_in]."""
    return -(-n // TILE_N), -(-k_in // GROUP_K)


def repack(planes: torch.Tensor, absmax: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bit planes ``[..., N, K_in/32, bits]`` + absmax ``[..., N, K_in/32]`` -> (qweight, qabsmax)."""
    kbit.check_bits(bits)
    lead = planes.shape[:-3]
    n, nblk = planes.shape[-3], planes.shape[-2]
    if tuple(absmax.shape) != (*lead, n, nblk):
        raise ValueError(f"absmax must have shape {(*lead, n, nblk)}, got {tuple(absmax.shape)}")
    t_count, g_count = tiled_shape(n, nblk * kbit.BLOCK)
    n_pad, b_pad = t_count * TILE_N, g_count * GROUP_BLOCKS
    codes = kbit.unpack_planes(planes, bits).to(torch.int64)  # [..., N, B, 32]
    codes = torch.nn.functional.pad(codes, (0, 0, 0, b_pad - nblk, 0, n_pad - n))
    amax = torch.nn.functional.pad(absmax, (0, b_pad - nblk, 0, n_pad - n))
    # [..., T, h, g, G, j, t, m, q, e] -> [..., T, G, j, g, t, m, q, h, e] -> [..., T, G, j, lane, p, e]
    c = codes.reshape(*lead, t_count, 2, 8, g_count, 8, 4, 2, 2, 2)
    nl = len(lead)
    perm = [*range(nl), nl + 0, nl + 3, nl + 4, nl + 2, nl + 5, nl + 6, nl + 7, nl + 1, nl + 8]
    c = c.permute(perm).reshape(*lead, t_count, g_count, 8, 32, 8, 2)
    klo = lo_bits(bits)
    lo = c & ((1 << klo) - 1)
    field = lo[..., 0] | (lo[..., 1] << klo)  # [..., T, G, j, lane, p]
    if klo == 4:
        f = field.reshape(*field.shape[:-1], 2, 4)
        words = (f << (8 * torch.arange(4, device=f.device))).sum(-1)  # [..., j, lane, 2]
        lo_words = words.permute(*range(nl + 2), nl + 3, nl + 2, nl + 4).reshape(*lead, t_count, g_count, 32, 16)
    else:
        words = (field << (4 * torch.arange(8, device=field.device))).sum(-1)  # [..., j, lane]
        lo_words = words.transpose(-1, -2)  # [..., lane, j]
    parts = [lo_words]
    if bits % 2:
        hi = c >> klo
        hf = hi[..., 0] | (hi[..., 1] << 1)  # [..., j, lane, p]
        half = (hf << (2 * torch.arange(8, device=hf.device))).sum(-1)  # 16 bits per block
        half = half.transpose(-1, -2).reshape(*lead, t_count, g_count, 32, 4, 2)
        parts.append(half[..., 0] | (half[..., 1] << 16))
    lane_words = torch.cat(parts, dim=-1)  # [..., T, G, lane, 4*bits]
    q = lane_words.reshape(*lead, t_count, g_count, 32, bits, 4).transpose(-3, -2)
    qweight = _to_int32(q).contiguous()
    qabsmax = amax.reshape(*lead, t_count, 2, 8, g_count, 8).permute(
        *range(nl), nl, nl + 3, nl + 2, nl + 1, nl + 4).reshape(*lead, t_count, g_count, 128).contiguous()
    return qweight, qabsmax


def unpack(qweight: torch.Tensor, qabsmax: torch.Tensor, bits: int, n: int, k_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`repack`: (qweight, qabsmax) -> (planes ``[..., n, k_in/32, bits]``, absmax)."""
    kbit.check_bits(bits)
    t_count, g_count = tiled_shape(n, k_in)
    lead = qweight.shape[:-5]
    if tuple(qweight.shape[-5:]) != (t_count, g_count, bits, 32, 4):
        raise ValueError(f"qweight must end in {(t_count, g_count, bits, 32, 4)}, got {tuple(qweight.shape)}")
    nl = len(lead)
    w = qweight.to(torch.int64) & 0xFFFFFFFF
    lane_words = w.transpose(-3, -2).reshape(*lead, t_count, g_count, 32, 4 * bits)
    klo = lo_bits(bits)
    if klo == 4:
        lw = lane_words[..., :16].reshape(*lead, t_count, g_count, 32, 8, 2)  # [lane, j, word]
        bytes_ = (lw[..., None] >> (8 * torch.arange(4, device=w.device))) & 0xFF  # [lane, j, 2, 4]
        field = bytes_.reshape(*lead, t_count, g_count, 32, 8, 8)  # [lane, j, p]
    else:
        lw = lane_words[..., :8]  # [lane, j]
        field = (lw[..., None] >> (4 * torch.arange(8, device=w.device))) & 0xF
    lo = torch.stack([field & ((1 << klo) - 1), field >> klo], dim=-1)  # [..., lane, j, p, e]
    codes = lo
    if bits % 2:
        hw = lane_words[..., 4 * klo:]  # [lane, 4]
        half = torch.stack([hw & 0xFFFF, hw >> 16], dim=-1).reshape(*lead, t_count, g_count, 32, 8)  # [lane, j]
        hf = (half[..., None] >> (2 * torch.arange(8, device=w.device))) & 3  # [lane, j, p]
        codes = codes | (torch.stack([hf & 1, hf >> 1], dim=-1) << klo)
    # [..., T, G, lane(g,t), j, p(m,q,h), e] -> [..., T, h, g, G, j, t, m, q, e]
    c = codes.reshape(*lead, t_count, g_count, 8, 4, 8, 2, 2, 2, 2)  # T G g t j m q h e
    perm = [*range(nl), nl, nl + 7, nl + 2, nl + 1, nl + 4, nl + 3, nl + 5, nl + 6, nl + 8]
    c = c.permute(perm).reshape(*lead, t_count * TILE_N, g_count * GROUP_BLOCKS, 32)
    nblk = k_in // kbit.BLOCK
    codes_out = c[..., :n, :nblk, :].to(torch.uint8).contiguous()
    amax = qabsmax.reshape(*lead, t_count, g_count, 8, 2, 8).permute(
        *range(nl), nl, nl + 3, nl + 2, nl + 1, nl + 4).reshape(*lead, t_count * TILE_N, g_count * GROUP_BLOCKS)
    return kbit.pack_planes(codes_out, bits), amax[..., :n, :nblk].contiguous()
