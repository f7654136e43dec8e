"""The GPU layout of NVFP4 weights ("tiled"): kbit's K=4 tiled code layout plus E4M3 block scales
arranged per lane -- what the NVFP4 tensor-core kernels read (see ``kbit_tiled`` for the tiles).

Codes: E2M1 codes in exactly the K=4 ``qweight`` layout of :mod:`kbit_tiled` (16-row tiles x 256-column
groups, byte fields of two codes per A-fragment register), so the kbit lookup decode runs unchanged
with the 16 E2M1 values as its codebook.

Scales: in block j (32 columns) of a group, lane (g, t) owns columns 32 j + 8 t .. + 8 of rows g and
g + 8 -- all inside one 16-column NVFP4 block, ``2 j + t // 2``. So each lane needs one scale per row
and block, 16 bytes per group, and can scale its A fragments before the MMAs (exact: an E2M1 value
times an E4M3 scale has at most 6 significant bits and lies in [2^-10, 2688], exact in fp16 and bf16)::

    qscales : uint8 [T, G, 256]   byte 32 g + 16 s + 8 h + j = E4M3 scale of row 8 h + g, 16-column
                                  block 2 j + s   (s = t // 2: lanes t = 0, 1 read bytes 32 g .. + 16,
                                  lanes t = 2, 3 the next 16; one 16-byte load per lane and group)

Padding (rows to 16, columns to 256) has code 0 and scale 0. The tensor scale (``scale_2``) stays one
fp32 applied to the fp32 accumulators.
"""

from __future__ import annotations

import torch

from ..kbit import tiled as kbit_tiled
from . import definition as nvfp4

SCALE_BYTES = 256


def tiled_shape(n: int, k: int) -> tuple[int, int]:
    return kbit_tiled.tiled_shape(n, k)


def pack(w) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight int32 [T, G, 4, 32, 4], qscales uint8 [T, G, 256]) of an NVFP4 weight (``w.packed``, ``w.scales``,
    ``w.shape``: an :class:`~lowbit.formats.nvfp4.NvFp4Weight`)."""
    n, k = w.shape
    if k % 32:
        raise ValueError(f"the tiled NVFP4 layout needs K % 32 == 0 (two 16-blocks per lookup block), got K={k}")
    codes = nvfp4.unpack(w.packed).reshape(n, k // 32, 32)
    dummy = torch.zeros((n, k // 32), dtype=torch.uint8, device=codes.device)
    qweight, _ = kbit_tiled.pack_codes(codes, dummy, 4)
    t_count, g_count = tiled_shape(n, k)
    sc = torch.nn.functional.pad(w.scales.view(torch.uint8), (0, g_count * 16 - k // 16, 0, t_count * 16 - n))
    # [T, h, g, G, j, s] -> [T, G, g, s, h, j]
    sc = sc.reshape(t_count, 2, 8, g_count, 8, 2).permute(0, 3, 2, 5, 1, 4)
    return qweight, sc.reshape(t_count, g_count, SCALE_BYTES).contiguous()


def unpack_scales(qscales: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """qscales -> float8_e4m3fn block scales ``[n, k/16]`` (the inverse of :func:`pack`'s scale part)."""
    t_count, g_count = tiled_shape(n, k)
    if tuple(qscales.shape) != (t_count, g_count, SCALE_BYTES) or qscales.dtype != torch.uint8:
        raise ValueError(f"qscales must be uint8 {(t_count, g_count, SCALE_BYTES)}, got {qscales.dtype} {tuple(qscales.shape)}")
    sc = qscales.reshape(t_count, g_count, 8, 2, 2, 8).permute(0, 4, 2, 1, 5, 3)  # [T, h, g, G, j, s]
    sc = sc.reshape(t_count * 16, g_count * 16)[:n, : k // 16].contiguous()
    return sc.view(torch.float8_e4m3fn)


def unpack_codes(qweight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """qweight -> the packed E2M1 codes ``uint8 [n, k/2]`` of the checkpoint layout."""
    return nvfp4.pack(kbit_tiled.unpack_codes(qweight, 4, n, k).reshape(n, k))
