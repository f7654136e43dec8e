"""``SbvrWeight``: one SBVR-quantized weight (see :mod:`.definition`), and ``quantize``."""

from __future__ import annotations

import torch

from . import definition, tiled
from .definition import GROUP, WORD, check_sbvr_tensors


class SbvrWeight:
    """An SBVR weight ``[N, K]``: ``bitvectors`` int32 [N, K/32, num_sums], ``coeff_idx`` int16 [N, K/group]
    (unsigned cache rows), ``cache`` fp16 [lines, num_sums], ``group`` (elements per coefficient vector)."""

    __slots__ = ("bitvectors", "coeff_idx", "cache", "group", "_tiled", "_codes")

    def __init__(self, bitvectors: torch.Tensor, coeff_idx: torch.Tensor, cache: torch.Tensor, group: int = GROUP,
                 *, check: bool = True):
        # check=False: tensors already checked (a module's buffers; its checks read values back, which
        # torch.compile and CUDA-graph capture cannot do)
        if check:
            check_sbvr_tensors(bitvectors, coeff_idx, cache, group)
            devices = {t.device for t in (bitvectors, coeff_idx, cache)}
            if len(devices) != 1:
                raise ValueError(f"bitvectors, coeff_idx and cache must be on one device, got {sorted(map(str, devices))}")
        self.bitvectors, self.coeff_idx, self.cache, self.group = bitvectors, coeff_idx, cache, group
        self._tiled = self._codes = None

    def tiled(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(qbits, qidx, cache8)``: the kernels' layout (:mod:`.tiled`), built once and kept (a second copy)."""
        if self._tiled is None:
            self._tiled = tiled.tile(*self.tensors())
        return self._tiled

    def codes(self) -> torch.Tensor | None:
        """The lookup GEMV's ``qcodes`` (:func:`.tiled.code_tile`), built once and kept; None where that kernel
        cannot take the weight (num_sums > 4, group not a multiple of 128)."""
        if self._codes is None and tiled.codes_fit(self.num_sums, self.group):
            self._codes = tiled.code_tile(self.bitvectors)
        return self._codes

    def layouts(self) -> tuple:
        """``(qbits, qcodes or None, qidx, cache8)``: what :func:`lowbit.dispatch.sbvr_linear_op` takes."""
        qbits, qidx, cache8 = self.tiled()
        return qbits, self.codes(), qidx, cache8

    @property
    def shape(self) -> tuple[int, int]:
        return self.bitvectors.shape[0], self.bitvectors.shape[1] * WORD

    @property
    def num_sums(self) -> int:
        return self.bitvectors.shape[2]

    @property
    def device(self) -> torch.device:
        return self.bitvectors.device

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.bitvectors, self.coeff_idx, self.cache

    def to(self, device) -> "SbvrWeight":
        return SbvrWeight(*(t.to(device) for t in self.tensors()), group=self.group)

    def nbytes(self) -> int:
        """Stored bytes: bitvectors + 16-bit indices + the fp16 cache."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def bits_per_weight(self) -> float:
        n, k = self.shape
        return 8 * self.nbytes() / (n * k)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return definition.decode(*self.tensors(), self.group, dtype)

    def __repr__(self) -> str:
        n, k = self.shape
        return (f"SbvrWeight({n}x{k}, num_sums={self.num_sums}, group={self.group}, cache={self.cache.shape[0]} lines, "
                f"{self.bits_per_weight():.3f} bits/weight, device={self.device})")


def quantize(weight: torch.Tensor, num_sums: int = 4, group: int = GROUP, *, progress: bool = False) -> SbvrWeight:
    """Encode a float weight ``[N, K]`` (K a multiple of ``group``) on its device; ``progress``: a bar over rows."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=weight.shape[0], desc=f"SBVR encode {tuple(weight.shape)}", unit="row", leave=False)
    done = [0]

    def tick(rows: int) -> None:
        if bar is not None:
            bar.update(rows - done[0])
            done[0] = rows

    try:
        codes, idx, cache = definition.encode(weight, num_sums, group, progress=tick)
    finally:
        if bar is not None:
            bar.close()
    idx16 = torch.where(idx >= 1 << 15, idx - (1 << 16), idx).to(torch.int16)
    return SbvrWeight(definition.pack_bits(codes, num_sums), idx16, cache, group)


class SbvrExperts:
    """E stacked SBVR weights ``[E, N, K]`` (MoE experts): ``bitvectors`` int32 [E, N, K/32, num_sums],
    ``coeff_idx`` int16 [E, N, K/group] (rows of the expert's own cache), ``cache`` fp16 [lines, num_sums] (the
    experts' caches one after another), ``cache_offsets`` int64 [E + 1] (expert e's lines:
    ``cache[cache_offsets[e]:cache_offsets[e + 1]]``)."""

    __slots__ = ("bitvectors", "coeff_idx", "cache", "cache_offsets", "group", "_layouts")

    def __init__(self, bitvectors: torch.Tensor, coeff_idx: torch.Tensor, cache: torch.Tensor,
                 cache_offsets: torch.Tensor, group: int = GROUP, *, check: bool = True):
        if check:
            if not isinstance(bitvectors, torch.Tensor) or bitvectors.dim() != 4:
                raise ValueError("bitvectors must be [E, N, K/32, num_sums]")
            e = bitvectors.shape[0]
            if not isinstance(cache_offsets, torch.Tensor) or cache_offsets.dtype != torch.int64 or \
                    tuple(cache_offsets.shape) != (e + 1,):
                raise ValueError(f"cache_offsets must be int64 [{e + 1}]")
            off = cache_offsets.tolist()
            if off[0] != 0 or off[-1] != cache.shape[0] or any(b <= a for a, b in zip(off, off[1:])):
                raise ValueError(f"cache_offsets must rise from 0 to the cache's {cache.shape[0]} lines, got {off}")
            for i in range(e):
                check_sbvr_tensors(bitvectors[i], coeff_idx[i], cache[off[i]:off[i + 1]], group)
        self.bitvectors, self.coeff_idx, self.cache, self.cache_offsets = bitvectors, coeff_idx, cache, cache_offsets
        self.group, self._layouts = group, None

    @property
    def shape(self) -> tuple[int, int, int]:
        e, n, words, _ = self.bitvectors.shape
        return e, n, words * WORD

    @property
    def num_sums(self) -> int:
        return self.bitvectors.shape[3]

    @property
    def device(self) -> torch.device:
        return self.bitvectors.device

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.bitvectors, self.coeff_idx, self.cache, self.cache_offsets

    def expert(self, e: int) -> SbvrWeight:
        lo, hi = self.cache_offsets[e].item(), self.cache_offsets[e + 1].item()
        return SbvrWeight(self.bitvectors[e], self.coeff_idx[e], self.cache[lo:hi], self.group, check=False)

    def layouts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(qbits [E, tiles, chunks, 32, 2 num_sums], qidx [E, tiles, groups, 8], cache8 [lines, 8], cache_offsets
        int32 [E + 1])``: the grouped popcount GEMV's layout, built once and kept."""
        if self._layouts is None:
            n_exp = self.bitvectors.shape[0]
            self._layouts = (torch.stack([tiled.tile_bits(self.bitvectors[i]) for i in range(n_exp)]),
                             torch.stack([tiled.tile_lines(self.coeff_idx[i]) for i in range(n_exp)]),
                             tiled.pad_cache(self.cache), self.cache_offsets.to(torch.int32))
        return self._layouts

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors()[:3])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.stack([self.expert(i).dequantize(dtype) for i in range(self.bitvectors.shape[0])])

    def __repr__(self) -> str:
        e, n, k = self.shape
        return f"SbvrExperts({e} x {n}x{k}, num_sums={self.num_sums}, group={self.group}, cache={self.cache.shape[0]} lines)"


def quantize_experts(weights: torch.Tensor, num_sums: int = 4, group: int = GROUP, *, progress: bool = False) -> SbvrExperts:
    """Encode stacked expert weights ``[E, N, K]`` one expert at a time (each with its own cache)."""
    if weights.dim() != 3:
        raise ValueError(f"weights must be [E, N, K], got {tuple(weights.shape)}")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=weights.shape[0], desc=f"SBVR encode experts {tuple(weights.shape)}", unit="expert", leave=False)
    parts = []
    try:
        for i in range(weights.shape[0]):
            parts.append(quantize(weights[i], num_sums, group))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    lines = torch.tensor([0] + [p.cache.shape[0] for p in parts], device=weights.device).cumsum(0)
    return SbvrExperts(torch.stack([p.bitvectors for p in parts]), torch.stack([p.coeff_idx for p in parts]),
                       torch.cat([p.cache for p in parts]), lines.to(torch.int64), group)


def linear_reference(x: torch.Tensor, w: SbvrWeight, bias=None) -> torch.Tensor:
    return definition.linear_reference(x, *w.tensors(), w.group, bias)
