"""Fused projections: linears that read the same input (q/k/v, gate/up) as one quantized weight.

A decode step calls ``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)`` one after the other; each is a GEMV
with its own launch and fixed cost, and k/v are small shapes where that cost dominates. Here the
weights are concatenated row-wise and quantized as one :class:`FusedKbitLinear` (or
:class:`~lowbit.nn.nvfp4.FusedNvFp4Linear`; :class:`FusedParts` is what any format's fused module adds
to its linear module): one launch, the output split into views. The model keeps calling its own
modules: each projection becomes a :class:`LinearPart` that asks the fused module for its slice. The first part called with an
input computes every projection and keeps the result until each part of the group has taken its
slice (a "round"); a part called with another input, a second time in a round, or (eager) after
the input was modified in place, computes anew, so nothing stale is returned. The fused module lives in the parent under
``lowbit_fused_<names>``; the parts own no tensors.

One difference from quantizing the projections apart: the group shares one fp32 tensor scale (it
only positions the block scales), so codes and block scales can differ in the last bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..formats.kbit import rotation as rotation_mod
from ..formats.kbit import tiled as kbit_tiled
from .base import describe
from .linear import KbitLinear, quantized_codes

#: sibling names fused by ``quantize_model(..., fuse=True)``, each group read from one input in
#: transformers' code: Llama/Qwen/Mistral-style attention, MLPs and shared experts (gate/up),
#: Mixtral's w1/w3, MLA's (DeepSeek-V3, GLM-4.7-Flash) q_a/kv_a, Qwen3-Next's DeltaNet input projections.
DEFAULT_FUSE_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"),
                       ("q_a_proj", "kv_a_proj_with_mqa"), ("in_proj_qkvz", "in_proj_ba"))


def fused_name(parts: Sequence[str]) -> str:
    return "lowbit_fused_" + "_".join(parts)


def check_fusable(linears: Sequence[nn.Linear]) -> bool:
    """Check that ``linears`` can be one weight (>= 2 ``nn.Linear``, same input size, dtype and device, all
    with or all without bias); returns whether they have a bias."""
    linears = list(linears)
    if len(linears) < 2 or not all(isinstance(lin, nn.Linear) for lin in linears):
        raise TypeError("from_linears needs a list of >= 2 torch.nn.Linear modules")
    first = linears[0].weight
    for lin in linears[1:]:
        w = lin.weight
        if w.shape[1] != first.shape[1] or w.dtype != first.dtype or w.device != first.device:
            raise ValueError(f"fused linears must share in_features, dtype and device; got {tuple(first.shape)} "
                             f"{first.dtype} {first.device} and {tuple(w.shape)} {w.dtype} {w.device}")
    has_bias = {lin.bias is not None for lin in linears}
    if len(has_bias) != 1:
        raise ValueError("fused linears must all have a bias or all have none")
    return has_bias.pop()


class FusedParts:
    """What a format's fused module adds to its linear module (``class FusedX(FusedParts, XLinear)``): the
    output sizes of its parts, the round its :class:`LinearPart` s read their slices from, and checkpoint
    entries that name the parts. A subclass sets ``linear_cls`` and implements ``_skeleton``."""

    linear_cls: type = nn.Module

    def _init_parts(self, out_sizes: Sequence[int]) -> None:
        self.out_sizes = tuple(int(n) for n in out_sizes)
        self.offsets = tuple(sum(self.out_sizes[:i]) for i in range(len(self.out_sizes)))
        self.part_names: tuple[str, ...] = ()  # the parent's children it serves, set where it is installed
        self._reset_round()

    @staticmethod
    def check_out_sizes(out_sizes: Sequence[int]) -> tuple[int, ...]:
        out_sizes = tuple(int(n) for n in out_sizes)
        if len(out_sizes) < 2 or min(out_sizes) < 1:
            raise ValueError(f"out_sizes must list >= 2 positive sizes, got {out_sizes}")
        return out_sizes

    @classmethod
    def _skeleton(cls, in_features: int, out_sizes: list[int], bias: bool, cfg: dict):
        """An empty module on the meta device for a checkpoint entry's config."""
        raise NotImplementedError

    # -- checkpoints: a fused entry is new to a skeleton; its parent holds the linears it replaces
    def checkpoint_config(self) -> dict:
        if not self.part_names:
            raise ValueError(f"a {type(self).__name__} not installed in a model (no part names) cannot be saved")
        cfg = super().checkpoint_config()
        cfg.pop("out_features")
        return {**cfg, "out_sizes": list(self.out_sizes), "parts": list(self.part_names)}

    @staticmethod
    def replaced_module(name: str, cfg: dict) -> str:
        return name.rpartition(".")[0]

    @classmethod
    def from_checkpoint_config(cls, name: str, cfg: dict, old: nn.Module):
        k, sizes, bias, parts = cfg["in_features"], [int(n) for n in cfg["out_sizes"]], cfg["bias"], cfg["parts"]
        if name.rpartition(".")[2] != fused_name(parts) or len(parts) != len(sizes):
            raise ValueError(f"malformed fused entry {cfg!r}")
        for part, n in zip(parts, sizes):
            have = getattr(old, part, None)
            if not (isinstance(have, (nn.Linear, cls.linear_cls, LinearPart)) and have.in_features == k
                    and have.out_features == n and (isinstance(have, LinearPart) or (have.bias is not None) == bias)):
                raise ValueError(f"saved part {part!r} ({k} -> {n}, bias={bias}) does not fit this model's {describe(have)}")
        new = cls._skeleton(k, sizes, bias, cfg)
        new.part_names = tuple(parts)
        return new

    def replaced_names(self, name: str) -> list[str]:
        parent = name.rpartition(".")[0]
        return [name] + [f"{parent}.{p}" if parent else p for p in self.part_names]

    def install(self, model: nn.Module, name: str, device: torch.device | None = None) -> None:
        parent_name = name.rpartition(".")[0]
        install(model.get_submodule(parent_name) if parent_name else model, self.part_names, self)

    # -- one computation per round ---------------------------------------------------------------
    def _reset_round(self) -> None:
        self._round_input = None
        self._round_output = None
        self._round_pending = 0  # bit i: part i has not taken its slice of the current output yet
        self._round_version = -1

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Projection ``index`` of ``x`` (a view into the fused output)."""
        bit = 1 << index
        eager = not torch.compiler.is_compiling()
        if (self._round_input is x and self._round_pending & bit
                and (not eager or x._version == self._round_version)):  # eager: x not modified in place since
            y = self._round_output
            self._round_pending &= ~bit
        else:
            y = self.forward(x)
            self._round_input, self._round_output = x, y
            self._round_version = x._version if eager else -1
            self._round_pending = ((1 << len(self.out_sizes)) - 1) & ~bit
        if not self._round_pending:
            self._round_input = self._round_output = None  # no reference kept past the round
        start = self.offsets[index]
        return y[..., start:start + self.out_sizes[index]]

    def parts(self) -> list["LinearPart"]:
        return [LinearPart(self, i) for i in range(len(self.out_sizes))]

    def _apply(self, fn, recurse=True):
        self._reset_round()
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", out_sizes={self.out_sizes}"


class FusedKbitLinear(FusedParts, KbitLinear):
    """``len(out_sizes)`` projections of one input in one kbit weight (rows concatenated in order)."""

    linear_cls = KbitLinear

    def __init__(self, in_features: int, out_sizes: Sequence[int], bias: bool = True, bits: int = 4, *,
                 device=None, dtype: torch.dtype | None = None, rotation: int = 0):
        out_sizes = self.check_out_sizes(out_sizes)
        super().__init__(in_features, sum(out_sizes), bias, bits, device=device, dtype=dtype, rotation=rotation)
        self._init_parts(out_sizes)

    @classmethod
    def _skeleton(cls, in_features, out_sizes, bias, cfg):
        return cls(in_features, out_sizes, bias=bias, bits=cfg["bits"], device="meta", rotation=cfg.get("rotation", 0))

    @classmethod
    def from_linears(cls, linears: Sequence[nn.Linear], bits: int = 4, codebook=None,
                     quantized: tuple | None = None, rotation: int = 0) -> "FusedKbitLinear":
        """Quantize ``linears`` (same input size, all with or all without bias, same dtype and device) as one
        weight; ``quantized``: the concatenated weight's (codes, absmax, codebook, scale), as from_linear."""
        linears = list(linears)
        has_bias = check_fusable(linears)
        first = linears[0].weight
        weight = torch.cat([lin.weight.detach() for lin in linears])
        if rotation and quantized is None:  # store W H (formats/kbit/rotation.py)
            weight = rotation_mod.rotate(weight.to(torch.float32))
        codes, absmax, codebook, scale = quantized_codes(weight, bits, codebook, quantized)
        del weight
        qweight, qabsmax = kbit_tiled.pack_codes(codes, absmax, bits)
        del codes
        mod = cls(first.shape[1], [lin.out_features for lin in linears], bias=has_bias, bits=bits, device="meta",
                  rotation=rotation_mod.check_rotation(rotation))
        mod.set_quantized(qweight, qabsmax, codebook, scale)
        if mod.bias is not None:
            mod.bias = nn.Parameter(torch.cat([lin.bias.detach() for lin in linears]), requires_grad=False)
        return mod


class LinearPart(nn.Module):
    """One projection of a fused module (:class:`FusedParts`), in the place of the linear it replaced."""

    def __init__(self, fused: FusedParts, index: int):
        super().__init__()
        if not 0 <= index < len(fused.out_sizes):
            raise IndexError(f"part {index} of a fused linear with {len(fused.out_sizes)} parts")
        self.__dict__["fused"] = fused  # not a child module: the parent holds the fused module once
        self.index = index
        self.in_features = fused.in_features
        self.out_features = fused.out_sizes[index]
        if hasattr(fused, "bits"):
            self.bits = fused.bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(self.index, x)

    def extra_repr(self) -> str:
        return f"part {self.index} of {self.fused.out_sizes}: in_features={self.in_features}, out_features={self.out_features}"


def fuse_linears(parent: nn.Module, names: Sequence[str], bits: int = 4, codebook=None) -> FusedKbitLinear:
    """Replace ``parent.<name>`` for each name (``nn.Linear`` modules reading the same input) by parts of
    one :class:`FusedKbitLinear`, registered as ``parent.lowbit_fused_<names>``; returns it.

    The caller vouches that the parent feeds the same tensor to all of them (as attention's q/k/v
    and an MLP's gate/up do); a part called with another input still gets the right result, at the
    cost of computing every projection for it.
    """
    names = list(names)
    if len(set(names)) != len(names):
        raise ValueError(f"names must be distinct, got {names}")
    linears = [getattr(parent, n, None) for n in names]
    bad = [n for n, lin in zip(names, linears) if not isinstance(lin, nn.Linear)]
    if bad:
        raise TypeError(f"fuse_linears: {bad} are not torch.nn.Linear children of {type(parent).__name__}")
    fused = FusedKbitLinear.from_linears(linears, bits, codebook)
    fused.train(linears[0].training)
    install(parent, names, fused)
    return fused


#: the name earlier versions gave it (kbit was the only format with fused modules)
KbitLinearPart = LinearPart


def install(parent: nn.Module, names: Sequence[str], fused: FusedParts) -> None:
    """Register ``fused`` in ``parent`` and put its parts in the places of ``names``."""
    if len(names) != len(fused.out_sizes):
        raise ValueError(f"{len(names)} names for a fused linear of {len(fused.out_sizes)} parts")
    fused.part_names = tuple(names)
    parent.add_module(fused_name(names), fused)
    for name, part in zip(names, fused.parts()):
        setattr(parent, name, part)


KbitLinear.fused_class = FusedKbitLinear
