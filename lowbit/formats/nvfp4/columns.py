"""NVFP4 quantized one column at a time: what error-compensating calibration (GPTQ) asks of the format.

The tensor scale ``scale_2`` is fixed from the weight as given (ModelOpt's ``amax / (6 * 448)``);
each 16-element block's E4M3 scale is taken when the walk reaches the block, from the error-updated
weights (what ModelOpt's and llm-compressor's GPTQ do); each column is rounded to the E2M1 grid of its
block. The returned values are the reference dequantizer's, bit for bit.
"""

from __future__ import annotations

import torch

from .definition import BLOCK, E2M1_MAX, E4M3_MAX, decode_e2m1, encode_e2m1, encode_e4m3, pack
from .weight import NvFp4Weight


class ColumnQuantizer:
    """NVFP4 quantization of one weight ``[N, K]`` column by column (see the module doc)."""

    group = BLOCK

    def __init__(self, weight: torch.Tensor, bits: int = 4, codebook=None, importance=None, search: int = 0):
        if bits != 4 or codebook is not None:
            raise ValueError("NVFP4 is 4-bit E2M1 with E4M3 block scales: bits and codebook are kbit options")
        w = weight.detach().to(torch.float32)
        n, k = w.shape
        if k % BLOCK:
            raise ValueError(f"NVFP4 needs K % {BLOCK} == 0, got {k}")
        self.n, self.k = n, k
        # search > 1: each block's E4M3 scale the best of `search` candidates from its absmax down to 60% of
        # it (importance-weighted squared error of the block rounded alone); else the absmax (ModelOpt's rule)
        self.search = search
        self.importance = None if importance is None else importance.detach().float().clamp_min(0).to(w.device)
        self._ratios = torch.linspace(1.0, 0.6, max(search, 1), device=w.device)
        amax = w.abs().amax()
        self.scale_2 = (amax / (E2M1_MAX * E4M3_MAX) if bool(amax > 0) else torch.ones_like(amax)).to(torch.float32)
        self.scales = torch.zeros((n, k // BLOCK), dtype=torch.float8_e4m3fn, device=w.device)
        self._sf = torch.zeros((n, k // BLOCK), dtype=torch.float32, device=w.device)
        self.codes = torch.zeros((n, k), dtype=torch.uint8, device=w.device)

    def set_block(self, b: int, columns: torch.Tensor) -> None:
        amax = columns.abs().amax(dim=1)
        s = encode_e4m3((amax / E2M1_MAX) / self.scale_2)
        if self.search > 1:
            cand = encode_e4m3((amax[None, :] * self._ratios[:, None] / E2M1_MAX) / self.scale_2)  # [S, N]
            step = cand.to(torch.float32) * self.scale_2
            safe = torch.where(step > 0, step, torch.ones_like(step))[..., None]
            q = decode_e2m1(encode_e2m1(torch.where(step[..., None] > 0, columns[None] / safe, 0.0))) * step[..., None]
            imp = (torch.ones(BLOCK, device=columns.device) if self.importance is None
                   else self.importance[b * BLOCK:(b + 1) * BLOCK])
            err = ((q - columns[None]).square() * imp).sum(-1)
            s = cand.view(torch.uint8).gather(0, err.argmin(0, keepdim=True))[0].view(torch.float8_e4m3fn)
        self.scales[:, b] = s
        self._sf[:, b] = s.to(torch.float32)

    def quantize(self, col: int, w: torch.Tensor) -> torch.Tensor:
        sf = self._sf[:, col // BLOCK]
        step = sf * self.scale_2
        scaled = torch.where(step > 0, w / torch.where(step > 0, step, torch.ones_like(step)), torch.zeros_like(w))
        code = encode_e2m1(scaled)
        self.codes[:, col] = code
        return decode_e2m1(code) * step  # e2m1 * (float(scale) * scale_2): dequantize_reference's fp32 ops

    def result(self) -> NvFp4Weight:
        return NvFp4Weight(pack(self.codes), self.scales, self.scale_2)
