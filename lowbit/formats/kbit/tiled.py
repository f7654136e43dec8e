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

Per lane and group, 4*K 32-bit words (K 16-byte chunks) hold a little-endian bit stream of the
lane's 64 pair fields, 2K bits each, in order f = 8*j + p (block j, pair p):

    field(j, p) = code(e=0) | code(e=1) << K        at stream bits [2K*f, 2K*f + 2K)
    K=2: nibbles, K=4: bytes (no field crosses a word); K=5: 10-bit fields, a few of which
    straddle two words (the kernel joins those with one funnel shift)

K=3 is not a plain stream: its 6-bit fields sit in bytes, so that one byte permute addresses the
kernels' table, as K=4's bytes do (a mask and a shift-add per field otherwise). Words 3r, 3r+1,
3r+2 hold the 16 fields f = 16r + i of blocks 2r and 2r+1:

    i < 12 : bits 0..5 of byte i % 4 of word 3r + i // 4
    i >= 12: field bits 2c, 2c+1 at bits 6, 7 of byte i - 12 of word 3r + c (c = 0, 1, 2)

The kernels gather the last four with three shifts and two bitwise selects into one word of four
such bytes (csrc/tiled/decode.cuh, k3_spare).

    qweight : int32 [..., T, G, K, 32, 4]   word i of lane l at [..., c = i // 4, l, i % 4]
              (a warp's load of chunk c covers 512 contiguous bytes)
    qabsmax : uint8 [..., T, G, 128]        byte 16*g + 8*h + j = absmax of row 8*h+g, block j
              (lane (g, t) loads its 16 bytes in one load; the 4 lanes of a row group share it)

The kernels' lookup table has one entry per field value (2^2K entries; K=3: 256, each value 4 times) holding
(codebook[code0], codebook[code1]) as two fp16/bf16 values: one shared-memory load decodes a pair.
"""

from __future__ import annotations

import torch

from .. import e4m4
from . import definition as kbit

TILE_N = 16
GROUP_BLOCKS = 8
GROUP_K = GROUP_BLOCKS * kbit.BLOCK


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _field_pieces(bits: int) -> tuple[tuple[int, ...], ...]:
    """Where the bits of a lane's 64 fields sit in its 4*bits words: one row per contiguous piece,
    (field, word, bit offset in the word, width, bit offset in the field)."""
    rows = []
    for f in range(64):
        if bits == 3:
            r, i = divmod(f, 16)
            if i < 12:
                rows.append((f, 3 * r + i // 4, 8 * (i % 4), 6, 0))
            else:
                rows += [(f, 3 * r + c, 8 * (i - 12) + 6, 2, 2 * c) for c in range(3)]
        else:
            word, shift = divmod(2 * bits * f, 32)
            width = min(2 * bits, 32 - shift)
            rows.append((f, word, shift, width, 0))
            if width < 2 * bits:  # the rest spills into the next word
                rows.append((f, word + 1, 0, 2 * bits - width, width))
    return tuple(zip(*rows))


# Built once at import, not behind functools.lru_cache: torch.compile traces through the packers (a model's first
# NVFP4 call may build its tiled layout inside a compiled step), and dynamo warns about, and ignores, a cache wrapper.
_FIELD_PIECES = {bits: _field_pieces(bits) for bits in kbit.SUPPORTED_BITS}


def _pieces(bits: int, device) -> list[torch.Tensor]:
    return [torch.tensor(col, dtype=torch.int64, device=device) for col in _FIELD_PIECES[bits]]


def tiled_shape(n: int, k_in: int) -> tuple[int, int]:
    """(tiles, groups) for a weight [n, k_in]."""
    return -(-n // TILE_N), -(-k_in // GROUP_K)


def repack(planes: torch.Tensor, absmax: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bit planes ``[..., N, K_in/32, bits]`` + absmax ``[..., N, K_in/32]`` -> (qweight, qabsmax)."""
    kbit.check_bits(bits)
    return pack_codes(kbit.unpack_planes(planes, bits), absmax, bits)


_REPACK_CHUNK_WEIGHTS = 1 << 26  # bounds the int64 temporaries of a repack (~1 GB) for stacked experts


def repack_in_chunks(planes: torch.Tensor, absmax: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`repack` of a stack ``[E, N, K_in/32, bits]`` a few experts at a time (bounded memory)."""
    if planes.dim() == 3:
        return repack(planes, absmax, bits)
    per = max(1, _REPACK_CHUNK_WEIGHTS // (planes.shape[1] * planes.shape[2] * kbit.BLOCK))
    parts = [repack(planes[i:i + per], absmax[i:i + per], bits) for i in range(0, planes.shape[0], per)]
    return torch.cat([q for q, _ in parts]), torch.cat([a for _, a in parts])


def pack_codes(codes: torch.Tensor, absmax: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes ``[..., N, K_in/32, 32]`` (uint8, each < 2**bits) + absmax ``[..., N, K_in/32]`` -> (qweight, qabsmax).

    The quantizer's direct route to the GPU layout (no bit planes in between)."""
    kbit.check_bits(bits)
    lead = codes.shape[:-3]
    n, nblk = codes.shape[-3], codes.shape[-2]
    if codes.shape[-1] != kbit.BLOCK or tuple(absmax.shape) != (*lead, n, nblk):
        raise ValueError(f"codes [..., N, B, 32] and absmax [..., N, B] disagree: {tuple(codes.shape)}, {tuple(absmax.shape)}")
    t_count, g_count = tiled_shape(n, nblk * kbit.BLOCK)
    n_pad, b_pad = t_count * TILE_N, g_count * GROUP_BLOCKS
    codes = torch.nn.functional.pad(codes.to(torch.int64), (0, 0, 0, b_pad - nblk, 0, n_pad - n))
    amax = torch.nn.functional.pad(absmax, (0, b_pad - nblk, 0, n_pad - n))
    # [..., T, h, g, G, j, t, m, q, e] -> [..., T, G, j, g, t, m, q, h, e] -> [..., T, G, j, lane, p, e]
    c = codes.reshape(*lead, t_count, 2, 8, g_count, 8, 4, 2, 2, 2)
    nl = len(lead)
    perm = [*range(nl), nl + 0, nl + 3, nl + 4, nl + 2, nl + 5, nl + 6, nl + 7, nl + 1, nl + 8]
    c = c.permute(perm).reshape(*lead, t_count, g_count, 8, 32, 8, 2)
    field = c[..., 0] | (c[..., 1] << bits)  # [..., T, G, j, lane, p]
    field = field.movedim(-3, -2).reshape(*lead, t_count, g_count, 32, 64)  # f = 8j + p
    f, word, shift, width, f_shift = _pieces(bits, field.device)
    lane_words = torch.zeros((*field.shape[:-1], 4 * bits), dtype=torch.int64, device=field.device)
    pieces = ((field[..., f] >> f_shift) & ((1 << width) - 1)) << shift
    lane_words.index_add_(-1, word, pieces)  # pieces never overlap: add = or
    q = lane_words.reshape(*lead, t_count, g_count, 32, bits, 4).transpose(-3, -2)
    qweight = _to_int32(q).contiguous()
    qabsmax = amax.reshape(*lead, t_count, 2, 8, g_count, 8).permute(
        *range(nl), nl, nl + 3, nl + 2, nl + 1, nl + 4).reshape(*lead, t_count, g_count, 128).contiguous()
    return qweight, qabsmax


def unpack_codes(qweight: torch.Tensor, bits: int, n: int, k_in: int) -> torch.Tensor:
    """qweight -> uint8 codes ``[..., n, k_in/32, 32]`` (the inverse of :func:`pack_codes`)."""
    kbit.check_bits(bits)
    t_count, g_count = tiled_shape(n, k_in)
    lead = qweight.shape[:-5]
    if tuple(qweight.shape[-5:]) != (t_count, g_count, bits, 32, 4):
        raise ValueError(f"qweight must end in {(t_count, g_count, bits, 32, 4)}, got {tuple(qweight.shape)}")
    nl = len(lead)
    w = qweight.to(torch.int64) & 0xFFFFFFFF
    lane_words = w.transpose(-3, -2).reshape(*lead, t_count, g_count, 32, 4 * bits)
    f, word, shift, width, f_shift = _pieces(bits, w.device)
    pieces = ((lane_words[..., word] >> shift) & ((1 << width) - 1)) << f_shift
    # index_add_, not boolean indexing: no host sync (CUDA-graph capture forbids one)
    field = torch.zeros((*lane_words.shape[:-1], 64), dtype=torch.int64, device=w.device)
    field.index_add_(-1, f, pieces)  # [..., lane, f = 8j + p]
    mask = (1 << bits) - 1
    codes = torch.stack([field & mask, field >> bits], dim=-1).to(torch.uint8)
    # [..., T, G, lane(g,t), j, p(m,q,h), e] -> [..., T, h, g, G, j, t, m, q, e]
    c = codes.reshape(*lead, t_count, g_count, 8, 4, 8, 2, 2, 2, 2)  # T G g t j m q h e
    perm = [*range(nl), nl, nl + 7, nl + 2, nl + 1, nl + 4, nl + 3, nl + 5, nl + 6, nl + 8]
    c = c.permute(perm).reshape(*lead, t_count * TILE_N, g_count * GROUP_BLOCKS, 32)
    return c[..., :n, :k_in // kbit.BLOCK, :]


def unpack_absmax(qabsmax: torch.Tensor, n: int, k_in: int) -> torch.Tensor:
    """qabsmax -> absmax ``[..., n, k_in/32]`` (uint8 E4M4 codes)."""
    t_count, g_count = tiled_shape(n, k_in)
    lead = qabsmax.shape[:-3]
    if tuple(qabsmax.shape[-3:]) != (t_count, g_count, 128):
        raise ValueError(f"qabsmax must end in {(t_count, g_count, 128)}, got {tuple(qabsmax.shape)}")
    nl = len(lead)
    amax = qabsmax.reshape(*lead, t_count, g_count, 8, 2, 8).permute(
        *range(nl), nl, nl + 3, nl + 2, nl + 1, nl + 4).reshape(*lead, t_count * TILE_N, g_count * GROUP_BLOCKS)
    return amax[..., :n, :k_in // kbit.BLOCK]


def unpack(qweight: torch.Tensor, qabsmax: torch.Tensor, bits: int, n: int, k_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`repack`: (qweight, qabsmax) -> (planes ``[..., n, k_in/32, bits]``, absmax)."""
    codes = unpack_codes(qweight, bits, n, k_in).contiguous()
    return kbit.pack_planes(codes, bits), unpack_absmax(qabsmax, n, k_in).contiguous()


def dequantize(qweight: torch.Tensor, qabsmax: torch.Tensor, codebook: torch.Tensor, scale: torch.Tensor, bits: int,
               n: int, k_in: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dense ``[..., n, k_in]`` weight straight from the tiled layout (``scale``: one fp32 per leading index).

    Same fp32 arithmetic as :func:`kbit.dequantize_reference` (the definition), so the results are identical.
    """
    codes = unpack_codes(qweight, bits, n, k_in)
    block_scale = e4m4.decode(unpack_absmax(qabsmax, n, k_in).contiguous()) * scale[..., None, None]
    w = codebook[codes.long()] * block_scale[..., None]
    return w.reshape(*w.shape[:-3], n, k_in).to(dtype)
