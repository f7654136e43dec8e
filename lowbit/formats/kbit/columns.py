"""kbit quantized one column at a time: what error-compensating calibration (GPTQ) asks of the format.

GPTQ walks a weight ``W[N, K]`` column by column and, after each column, moves its rounding error
onto the columns not yet quantized. The format's part is :class:`ColumnQuantizer`: the tensor-level
choices made once (fp32 tensor scale, codebook), a block's absmax taken when the walk reaches the
block (:meth:`~ColumnQuantizer.set_block`, from the error-updated weights), and one column rounded
to the nearest codebook entry of its block's scale (:meth:`~ColumnQuantizer.quantize`). The values
it returns are exactly what the kbit dequantizer computes from the codes it records, so the error
GPTQ propagates is the error the kernels will see.
"""

from __future__ import annotations

import torch

from .. import e4m4
from .definition import BLOCK, bf16_codebook, check_bits, normal_float_codebook, weighted_codebook


class ColumnQuantizer:
    """kbit quantization of one weight ``[N, K]`` (or a stack ``[E, N, K]``, e.g. MoE experts, one tensor
    scale each) column by column (see the module doc).

    ``codebook``: a tensor of ``2**bits`` values, None (normal-float), or ``"fit"`` with ``importance``
    (``[K]`` or ``[E, K]``, the Hessian diagonal): fitted by :func:`weighted_codebook` on the blocks
    normalized by their round-to-nearest scales (one codebook for a whole stack).
    The fp32 tensor scale comes from the weight as given (``max |W| / E4M4 max``, as
    :func:`~lowbit.formats.kbit.quantize_codes` sets it); a block absmax that error feedback pushes
    past it saturates at the largest E4M4 code and its largest values clip to the codebook's ends.
    """

    group = BLOCK

    def __init__(self, weight: torch.Tensor, bits: int, codebook: torch.Tensor | str | None = None,
                 importance: torch.Tensor | None = None, search: int = 0):
        check_bits(bits)
        w = weight.detach().to(torch.float32)
        if w.dim() not in (2, 3):
            raise ValueError(f"weight must be [N, K] or [E, N, K], got {tuple(w.shape)}")
        *lead, n, k = w.shape
        if k % BLOCK:
            raise ValueError(f"kbit needs K_in % {BLOCK} == 0, got {k}")
        self.bits, self.lead, self.n, self.k = bits, tuple(lead), n, k
        gmax = w.abs().amax(dim=(-2, -1))
        self.scale = torch.where(gmax > 0, gmax / torch.full_like(gmax, e4m4.MAX_VALUE), torch.ones_like(gmax)).float()
        self.importance = None if importance is None else importance.detach().float().clamp_min(0).to(w.device)
        if isinstance(codebook, str):
            if codebook != "fit":
                raise ValueError(f"codebook must be a tensor, None or 'fit', got {codebook!r}")
            blocks = w.reshape(*lead, n, k // BLOCK, BLOCK)
            bs = e4m4.decode(e4m4.encode(blocks.abs().amax(-1) / self.scale[..., None, None])) * self.scale[..., None, None]
            normalized = torch.where(bs[..., None] > 0, blocks / bs[..., None].clamp_min(1e-38), 0.0)
            imp = torch.ones(k, device=w.device) if self.importance is None else self.importance
            imp = imp.reshape(*imp.shape[:-1], 1, k // BLOCK, BLOCK).expand_as(normalized)
            codebook = weighted_codebook(normalized, imp, bits)
        elif codebook is None:
            codebook = normal_float_codebook(bits)
        self.codebook = codebook.to(device=w.device, dtype=torch.float32).contiguous()
        self._sorted, self._order = self.codebook.sort()
        self._mids = (self._sorted[1:] + self._sorted[:-1]) / 2
        # search > 1: each block's scale is the best of `search` candidates from its absmax down to 60% of
        # it (importance-weighted squared error of the block rounded alone); else the absmax, as RTN
        self.search = search
        self._ratios = torch.linspace(1.0, 0.6, max(search, 1), device=w.device)
        self.absmax = torch.zeros((*lead, n, k // BLOCK), dtype=torch.uint8, device=w.device)
        self.block_scale = torch.zeros((*lead, n, k // BLOCK), dtype=torch.float32, device=w.device)
        self.codes = torch.zeros((*lead, n, k), dtype=torch.uint8, device=w.device)
        self.targets = None  # record_targets(): what each column was rounded from, normalized (for refit_codebook)

    def record_targets(self) -> "ColumnQuantizer":
        self.targets = torch.zeros(self.codes.shape, dtype=torch.float32, device=self.codes.device)
        return self

    def set_block(self, b: int, columns: torch.Tensor) -> None:
        """Block ``b``'s absmax from its current (error-updated) columns ``[..., N, 32]``."""
        scale = self.scale[..., None]  # [..., 1]
        amax = columns.abs().amax(dim=-1)  # [..., N]
        a = e4m4.encode(amax / scale)
        if self.search > 1:
            ratios = self._ratios.reshape(-1, *([1] * amax.dim()))
            cand = e4m4.encode(amax[None] * ratios / scale)  # [S, ..., N]
            bs = e4m4.decode(cand) * scale
            norm = torch.where(bs[..., None] > 0, columns[None] / bs[..., None].clamp_min(1e-38), 0.0)
            q = self._sorted[torch.bucketize(norm, self._mids)] * bs[..., None]
            imp = (torch.ones(BLOCK, device=columns.device) if self.importance is None
                   else self.importance[..., None, b * BLOCK:(b + 1) * BLOCK])
            err = ((q - columns[None]).square() * imp).sum(-1)  # [S, ..., N]
            a = cand.gather(0, err.argmin(0, keepdim=True))[0]
        self.absmax[..., b] = a
        self.block_scale[..., b] = e4m4.decode(a) * scale  # the dequantizer's fp32 ops

    def quantize(self, col, w: torch.Tensor) -> torch.Tensor:
        """Round column ``col`` (values ``w [..., N]``) in its block's scale; returns the dequantized column.
        ``col``: an int, or for a stack a LongTensor ``[E]`` (each weight its own column: act-order)."""
        if isinstance(col, int):
            bs = self.block_scale[..., col // BLOCK]
        else:
            bs = self.block_scale.gather(-1, (col // BLOCK).reshape(-1, 1, 1).expand(-1, self.n, 1))[..., 0]
        normalized = torch.where(bs > 0, w / bs.clamp_min(1e-38), 0.0)
        code = self._order[torch.bucketize(normalized, self._mids)]
        if isinstance(col, int):
            self.codes[..., col] = code.to(torch.uint8)
            if self.targets is not None:
                self.targets[..., col] = normalized
        else:
            where = col.reshape(-1, 1, 1).expand(-1, self.n, 1)
            self.codes.scatter_(-1, where, code.to(torch.uint8)[..., None])
            if self.targets is not None:
                self.targets.scatter_(-1, where, normalized[..., None])
        return self.codebook[code] * bs

    def refit_codebook(self) -> torch.Tensor:
        """The codebook that best fits what the walk rounded (the error-updated, normalized values, weighted
        by importance) with the codes it chose: one k-means step on GPTQ's own targets. Needs
        :meth:`record_targets` before the walk."""
        if self.targets is None:
            raise RuntimeError("refit_codebook needs record_targets() before the walk")
        imp = torch.ones(self.k, device=self.codes.device) if self.importance is None else self.importance
        wts = imp[..., None, :].expand(self.codes.shape).reshape(-1)
        idx = self.codes.reshape(-1).long()
        sums = torch.zeros_like(self.codebook).index_add_(0, idx, self.targets.reshape(-1) * wts)
        mass = torch.zeros_like(self.codebook).index_add_(0, idx, wts)
        c = torch.where(mass > 0, sums / mass.clamp_min(1e-30), self.codebook).clamp(-1, 1).sort().values
        return bf16_codebook(c, self.bits)

    def result(self):
        """``(codes [..., N, K/32, 32], absmax [..., N, K/32], codebook, scale [...])``: :func:`quantize_codes`'s
        outputs."""
        return self.codes.reshape(*self.lead, self.n, self.k // BLOCK, BLOCK), self.absmax, self.codebook, self.scale
