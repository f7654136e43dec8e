"""SBVR quantized one column at a time, for error-compensating calibration (GPTQ).

The candidate lines (shapes x the scale ladder, :class:`.definition.Lines`) are fixed from the weight as
given; each row's coefficient line of a group is chosen when the walk reaches the group, from the
error-updated weights (as kbit takes its block absmax), weighted by the Hessian diagonal; each column is
rounded to the nearest subset sum of its row's line. The returned values are the decoder's, bit for bit.
"""

from __future__ import annotations

import torch

from .definition import Lines, pack_bits, points
from .weight import SbvrWeight


class ColumnQuantizer:
    """SBVR (``bits`` = num_sums) of one weight ``[N, K]`` column by column; group: 128, 64 or 32, the
    largest dividing K (as :class:`lowbit.nn.SbvrLinear` picks)."""

    def __init__(self, weight: torch.Tensor, bits: int = 4, codebook=None, importance=None, search: int = 0):
        if codebook is not None:
            raise ValueError("codebook is a kbit option; SBVR's coefficients come from its own search")
        w = weight.detach().to(torch.float32)
        n, k = w.shape
        self.group = next((g for g in (128, 64, 32) if k % g == 0), None)
        if self.group is None:
            raise ValueError(f"SBVR needs K % 32 == 0, got {k}")
        self.lines = Lines(w, bits, self.group)
        self.num_sums = bits
        self.importance = None if importance is None else importance.detach().float().clamp_min(0).to(w.device)
        self.line_of = torch.zeros((n, k // self.group), dtype=torch.int64, device=w.device)
        self.codes = torch.zeros((n, k), dtype=torch.uint8, device=w.device)

    def set_block(self, b: int, columns: torch.Tensor) -> None:
        imp = None if self.importance is None else self.importance[b * self.group:(b + 1) * self.group]
        self.line_of[:, b] = self.lines.choose(columns.to(torch.float32), imp)

    def quantize(self, col: int, w: torch.Tensor) -> torch.Tensor:
        # the row's line of this column's group (with act-order every group's line is set up front)
        pts = points(self.lines.values[self.line_of[:, col // self.group]])
        d = (w.to(torch.float32)[:, None] - pts).abs()
        code = d.argmin(-1)
        self.codes[:, col] = code.to(torch.uint8)
        return pts.gather(1, code[:, None])[:, 0]

    def result(self) -> SbvrWeight:
        idx, cache = self.lines.cache(self.line_of)
        idx16 = torch.where(idx >= 1 << 15, idx - (1 << 16), idx).to(torch.int16)
        return SbvrWeight(pack_bits(self.codes, self.num_sums), idx16, cache, self.group)
