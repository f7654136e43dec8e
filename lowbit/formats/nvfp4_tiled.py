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

from . import kbit_tiled, nvfp4

SCALE_BYTES = 256


def tiled_shape(n: int, k: int) -> tuple[int, int]:
    return kbit_tiled.tiled_shape(n, k)


def pack(w: nvfp4.NvFp4Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight int32 [T, G, 4, 32, 4], qscales uint8 [T, G, 256]) of an :class:`nvfp4.NvFp4Weight`."""
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


def unpack(qweight: torch.Tensor, qscales: torch.Tensor, scale_2: torch.Tensor, n: int, k: int) -> nvfp4.NvFp4Weight:
    """The :class:`nvfp4.NvFp4Weight` a tiled pair holds."""
    codes = kbit_tiled.unpack_codes(qweight, 4, n, k).reshape(n, k)
    return nvfp4.NvFp4Weight(nvfp4.pack(codes), unpack_scales(qscales, n, k), scale_2)


def dequantize(qweight, qscales, scale_2, n: int, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dense ``[n, k]`` straight from the tiled layout (the reference's arithmetic)."""
    return unpack(qweight, qscales, scale_2, n, k).dequantize(dtype)


class NvFp4Experts:
    """A stack of E NVFP4 expert weights ``[E, N, K]`` in the tiled layout, for the grouped (MoE) GEMV:
    ``qweight`` int32 [E, T, G, 4, 32, 4], ``qscales`` uint8 [E, T, G, 256], ``scale_2`` fp32 [E]."""

    def __init__(self, qweight: torch.Tensor, qscales: torch.Tensor, scale_2: torch.Tensor, n: int, k: int):
        t_count, g_count = tiled_shape(n, k)
        e = qweight.shape[0]
        if tuple(qweight.shape) != (e, t_count, g_count, 4, 32, 4) or tuple(qscales.shape) != (e, t_count, g_count, SCALE_BYTES):
            raise ValueError(f"qweight / qscales must be {(e, t_count, g_count, 4, 32, 4)} / {(e, t_count, g_count, SCALE_BYTES)}, "
                             f"got {tuple(qweight.shape)} / {tuple(qscales.shape)}")
        if scale_2.dtype != torch.float32 or tuple(scale_2.shape) != (e,):
            raise ValueError(f"scale_2 must be fp32 [{e}], got {scale_2.dtype} {tuple(scale_2.shape)}")
        self.qweight, self.qscales, self.scale_2, self.n, self.k = qweight, qscales, scale_2, n, k

    @classmethod
    def from_weights(cls, weights) -> "NvFp4Experts":
        """Stack :class:`nvfp4.NvFp4Weight` experts of one shape (repacked to the tiled layout)."""
        weights = list(weights)
        if not weights or any(not isinstance(w, nvfp4.NvFp4Weight) for w in weights):
            raise TypeError("weights must be a non-empty sequence of NvFp4Weight")
        shapes = {w.shape for w in weights}
        if len(shapes) != 1:
            raise ValueError(f"experts must share one shape, got {sorted(shapes)}")
        n, k = weights[0].shape
        packed = [pack(w) for w in weights]
        return cls(torch.stack([q for q, _ in packed]), torch.stack([s for _, s in packed]),
                   torch.stack([w.scale_2.reshape(()) for w in weights]).to(torch.float32), n, k)

    @property
    def experts(self) -> int:
        return self.qweight.shape[0]

    def weight(self, e: int) -> nvfp4.NvFp4Weight:
        return unpack(self.qweight[e], self.qscales[e], self.scale_2[e], self.n, self.k)

    def to(self, device) -> "NvFp4Experts":
        return NvFp4Experts(self.qweight.to(device), self.qscales.to(device), self.scale_2.to(device), self.n, self.k)
