"""SBVR's GPU layout (``csrc/sbvr/gemv.cu``): the checkpoint tensors regrouped so that one warp reads one
16-row x 128-input tile with one contiguous load per lane -- the A fragment of the binary tensor-core MMA
(``mma.m16n8k128.b1``: lane ``(g, t) = (lane // 4, lane % 4)`` holds rows g and g + 8, word t).

* ``qbits`` int32 ``[tiles, chunks, 32, 2 * num_sums]``: lane (g, t) of tile T, chunk c holds plane j of
  row 16T + g at ``[..., j]`` and of row 16T + g + 8 at ``[..., num_sums + j]``, word 4c + t of the row.
  Rows past N and words past K are zero (they add nothing to a product).
* ``qidx`` int32 ``[tiles, groups, 8]``: the cache lines of rows 16T + g (low 16 bits) and 16T + g + 8 (high).
* ``cache8`` fp16 ``[lines, 8]``: the cache, each line padded to 16 bytes (one load).
* ``qcodes`` int32 ``[tiles, chunks, 32, 8]`` (:func:`code_tile`): the same tiles as 4-bit codes, for the
  weight-only lookup GEMV (``csrc/sbvr/lookup_gemv.cu``; num_sums <= 4).

The activations of the popcount GEMV (:func:`encode_activations_tiled`): ``xq`` int32 ``[M, chunks, 8, 4]``,
bit-plane l of word t (bit i: element 128c + 32t + i; zero past K); ``xs`` fp32 ``[M, K / act_group, 2]``:
(s, m) of each activation group (x ~ m + s q, q of ``ACT_BITS`` bits).
"""

from __future__ import annotations

import torch

from .definition import ACT_GROUP as CHUNK, WORD, act_group, encode_activations, unpack_bits

# CHUNK (= ACT_GROUP, 128): inputs per binary MMA
TILE_ROWS = 16
ACT_BITS = 8     # activation bit-planes = the binary MMA's 8 columns (the authors: 7 + a column of ones)
CACHE_PAD = 8


def check_act_bits(act_bits: object) -> int | None:
    """``ACT_BITS`` (the popcount product) or None (weight-only)."""
    if act_bits is not None and (isinstance(act_bits, bool) or act_bits != ACT_BITS):
        raise ValueError(f"act_bits must be {ACT_BITS} (the popcount GEMV's activations) or None (weight-only), got {act_bits!r}")
    return act_bits


def tiled_shape(n: int, k: int) -> tuple[int, int]:
    """(tiles, chunks) of an ``[n, k]`` weight."""
    return -(-n // TILE_ROWS), -(-k // CHUNK)


def _as_int32(v: torch.Tensor) -> torch.Tensor:
    v = v.to(torch.int64) & 0xFFFFFFFF
    return torch.where(v >= 1 << 31, v - (1 << 32), v).to(torch.int32)


def tile(bitvectors: torch.Tensor, coeff_idx: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Checkpoint tensors (:class:`~lowbit.formats.sbvr.SbvrWeight`) -> ``(qbits, qidx, cache8)``."""
    return tile_bits(bitvectors), tile_lines(coeff_idx), pad_cache(cache)


def tile_bits(bitvectors: torch.Tensor) -> torch.Tensor:
    """bitvectors ``[N, K/32, num_sums]`` -> ``qbits``."""
    n, words, ns = bitvectors.shape
    tiles, chunks = tiled_shape(n, words * WORD)
    bv = torch.zeros((tiles * TILE_ROWS, chunks * 4, ns), dtype=torch.int32, device=bitvectors.device)
    bv[:n, :words] = bitvectors
    # [tiles, half, g, chunks, t, ns] -> [tiles, chunks, g, t, half, ns]
    return bv.reshape(tiles, 2, 8, chunks, 4, ns).permute(0, 3, 2, 4, 1, 5).reshape(tiles, chunks, 32, 2 * ns).contiguous()


def tile_lines(coeff_idx: torch.Tensor) -> torch.Tensor:
    """coeff_idx ``[N, groups]`` -> ``qidx``."""
    n = coeff_idx.shape[0]
    tiles = -(-n // TILE_ROWS)
    idx = torch.zeros((tiles * TILE_ROWS, coeff_idx.shape[1]), dtype=torch.int64, device=coeff_idx.device)
    idx[:n] = coeff_idx.to(torch.int64) & 0xFFFF
    idx = idx.reshape(tiles, 2, 8, -1)
    return _as_int32(idx[:, 0] | (idx[:, 1] << 16)).permute(0, 2, 1).contiguous()


def pad_cache(cache: torch.Tensor) -> torch.Tensor:
    """cache ``[lines, num_sums]`` -> ``cache8`` (16 bytes a line)."""
    cache8 = torch.zeros((cache.shape[0], CACHE_PAD), dtype=torch.float16, device=cache.device)
    cache8[:, :cache.shape[1]] = cache
    return cache8


def untile(qbits: torch.Tensor, qidx: torch.Tensor, cache8: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`tile`: ``(bitvectors, coeff_idx int16, cache)``."""
    tiles, chunks, _, two_ns = qbits.shape
    ns = two_ns // 2
    bv = qbits.reshape(tiles, chunks, 8, 4, 2, ns).permute(0, 4, 2, 1, 3, 5).reshape(tiles * TILE_ROWS, chunks * 4, ns)
    idx = untile_lines(qidx, n)
    idx16 = torch.where(idx >= 1 << 15, idx - (1 << 16), idx).to(torch.int16)
    return bv[:n, :k // WORD].contiguous(), idx16.contiguous(), cache8[:, :ns].contiguous()


def untile_lines(qidx: torch.Tensor, n: int) -> torch.Tensor:
    """The cache line of each (row, group) from ``qidx``: int64 ``[n, groups]``."""
    tiles = qidx.shape[0]
    v = qidx.to(torch.int64) & 0xFFFFFFFF                       # [tiles, groups, 8]
    idx = torch.stack([v & 0xFFFF, v >> 16], 1).permute(0, 1, 3, 2).reshape(tiles * TILE_ROWS, -1)
    return idx[:n]


#: num_sums the lookup GEMV's 4-bit codes hold
CODE_MAX_NUM_SUMS = 4


def codes_fit(num_sums: int, group: int) -> bool:
    """Whether the lookup GEMV takes a weight: 4-bit codes, one group per row and chunk."""
    return num_sums <= CODE_MAX_NUM_SUMS and group % CHUNK == 0


def code_tile(bitvectors: torch.Tensor) -> torch.Tensor:
    """The lookup GEMV's codes (``csrc/sbvr/lookup_gemv.cu``): ``qcodes`` int32 ``[tiles, chunks, 32, 8]``, lane
    (g, t) of tile T, chunk c: words 0..3 = row 16T + g, words 4..7 = row 16T + g + 8; word w holds the 4-bit
    codes of inputs 128c + 32t + 8w .. + 7 (nibble e: input + e). num_sums <= 4; zero past N and K."""
    n, words, ns = bitvectors.shape
    if ns > CODE_MAX_NUM_SUMS:
        raise ValueError(f"the lookup GEMV's 4-bit codes hold num_sums <= {CODE_MAX_NUM_SUMS}, got {ns}")
    tiles, chunks = tiled_shape(n, words * WORD)
    codes = torch.zeros((tiles * TILE_ROWS, chunks * CHUNK), dtype=torch.int64, device=bitvectors.device)
    codes[:n, :words * WORD] = unpack_bits(bitvectors).to(torch.int64)
    nib = codes.reshape(tiles, 2, 8, chunks, 4, 4, 8) << (4 * torch.arange(8, device=codes.device))
    qcodes = _as_int32(nib.sum(-1)).permute(0, 3, 2, 4, 1, 5)      # [tiles, chunks, g, t, half, word]
    return qcodes.reshape(tiles, chunks, 32, 8).contiguous()


def code_untile(qcodes: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Inverse of :func:`code_tile`: codes uint8 ``[n, k]``."""
    tiles, chunks = qcodes.shape[:2]
    v = qcodes.to(torch.int64).reshape(tiles, chunks, 8, 4, 2, 4) & 0xFFFFFFFF
    nib = (v[..., None] >> (4 * torch.arange(8, device=v.device))) & 15   # [tiles, chunks, g, t, half, word, e]
    codes = nib.permute(0, 4, 2, 1, 3, 5, 6).reshape(tiles * TILE_ROWS, chunks * CHUNK)
    return codes[:n, :k].to(torch.uint8)


def encode_activations_tiled(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(xq, xs)`` as the GEMV reads them (what ``lowbit::sbvr_encode_x`` computes)."""
    m, k = x.shape
    ag = act_group(group)
    q, s, lo = encode_activations(x, ACT_BITS, ag)               # q [M, K], s / lo [M, K / ag]
    chunks = -(-k // CHUNK)
    qp = torch.zeros((m, chunks * CHUNK), dtype=torch.int64, device=x.device)
    qp[:, :k] = q
    planes = [(qp >> lvl) & 1 for lvl in range(ACT_BITS)]
    bits = torch.stack(planes, 1).reshape(m, 8, chunks, 4, WORD)          # [M, plane, chunk, t, i]
    words = (bits << torch.arange(WORD, device=x.device)).sum(-1)          # < 2^32
    xq = _as_int32(words).permute(0, 2, 1, 3).contiguous()                 # [M, chunks, 8, 4]
    xs = torch.stack([s, lo], -1).contiguous()                              # [M, K / ag, 2]
    return xq, xs


__all__ = ["ACT_BITS", "CHUNK", "TILE_ROWS", "CODE_MAX_NUM_SUMS", "check_act_bits", "code_tile", "code_untile", "codes_fit", "pad_cache", "tile_bits", "tile_lines", "untile_lines", "encode_activations_tiled", "tile", "tiled_shape", "untile"]
