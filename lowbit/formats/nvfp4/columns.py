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

    def __init__(self, weight: torch.Tensor, bits: int = 4, codebook=None, importance=None):
        if bits != 4 or codebook is not None:
            raise ValueError("NVFP4 is 4-bit E2M1 with E4M3 block scales: bits and codebook are kbit options")
        w = weight.detach().to(torch.float32)
        n, k = w.shape
        if k % BLOCK:
            raise ValueError(f"NVFP4 needs K % {BLOCK} == 0, got {k}")
        self.n, self.k = n, k
        amax = w.abs().amax()
        self.scale_2 = (amax / (E2M1_MAX * E4M3_MAX) if bool(amax > 0) else torch.ones_like(amax)).to(torch.float32)
        self.scales = torch.zeros((n, k // BLOCK), dtype=torch.float8_e4m3fn, device=w.device)
        self._sf = torch.zeros((n, k // BLOCK), dtype=torch.float32, device=w.device)
        self.codes = torch.zeros((n, k), dtype=torch.uint8, device=w.device)

    def set_block(self, b: int, columns: torch.Tensor) -> None:
        s = encode_e4m3((columns.abs().amax(dim=1) / E2M1_MAX) / self.scale_2)
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
