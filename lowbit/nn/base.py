"""What every quantized module tells the model layer, so ``quantize_model`` and the checkpoints need no
per-format code: its format name, how it is built from an ``nn.Linear``, and how it is written to and
read back from a lowbit checkpoint. A subclass registers itself by being defined (:data:`REGISTRY`)."""

from __future__ import annotations

import torch
from torch import nn

#: module type name (as a checkpoint records it) -> class
REGISTRY: dict[str, type["QuantizedModule"]] = {}


def describe(mod: nn.Module | None) -> str:
    """``Linear(4096 -> 1024, bias=False)``: a module as load errors name it."""
    if mod is None:
        return "nothing"
    return (f"{type(mod).__name__}({getattr(mod, 'in_features', '?')} -> {getattr(mod, 'out_features', '?')}, "
            f"bias={getattr(mod, 'bias', None) is not None})")


def hooked(*mods: nn.Module) -> bool:
    """Whether any of ``mods`` has forward hooks or a forward of its own instance (transformers' tensor parallelism
    replaces a sharded module's ``forward`` to all-reduce or gather around it; accelerate's offloading does the same;
    profilers add hooks): a fused kernel that stands in for calling such a module would skip them."""
    return any(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__ for m in mods)


def is_plain_silu(act) -> bool:
    """Whether ``act`` is torch's ``nn.SiLU`` or transformers' SiLU activation module (by class name: dynamo traces that)
    and not :func:`hooked`: a kernel that computes ``silu(gate) * up`` itself (the SwiGLU epilogue, the routed down
    GEMV) may then stand in for calling it."""
    return type(act).__name__ in ("SiLU", "SiLUActivation") and isinstance(act, nn.Module) and not hooked(act)


def check_input(x: torch.Tensor, in_features: int) -> None:
    """What a quantized module's forward takes: ``x [..., in_features]`` of fp16 / bf16 / fp32."""
    if x.shape[-1] != in_features:
        raise ValueError(f"x must have shape [..., in_features={in_features}], got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must have dtype in (float16, bfloat16, float32), got {str(x.dtype).removeprefix('torch.')}")


def tp_split_problem(style: str, out_sizes, in_features: int, world: int, k_multiple: int) -> str | None:
    """Why a weight of these sizes cannot be split ``world`` ways for tensor parallelism, or None:
    colwise needs every output size (each projection of a fused weight) divisible by ``world``, rowwise
    equal parts of whole ``k_multiple``-element blocks; ``"experts"`` (an expert block's intermediate size
    as ``in_features``: down's input) the same as rowwise."""
    if style == "colwise":
        bad = [n for n in out_sizes if n % world]
        return f"output size {bad[0]} does not split into {world} equal tensor-parallel parts" if bad else None
    k = in_features
    if k % world or (k // world) % k_multiple:
        return (f"input size {k} does not split into {world} tensor-parallel parts of whole {k_multiple}-element "
                f"blocks (each part would be {k / world:g} columns); use a tensor-parallel size that divides {k} "
                f"into multiples of {k_multiple}")
    return None


class QuantizedModule(nn.Module):
    #: the ``quantize_model(format=...)`` name; set on the class that quantizes a format's ``nn.Linear`` layers
    format_name: str | None = None
    #: the format's module for transformers' fused MoE expert blocks, and for sibling linears fused into one
    #: weight (None: the format has none; quantize_model leaves such blocks / fuses nothing)
    experts_class: type | None = None
    fused_class: type | None = None
    #: whether ``quantize_model(fuse=None)`` fuses sibling linears (where ``fused_class`` exists)
    fuse_by_default: bool = True
    #: an expert-block class: whether GPTQ calibrates it (else ``method="gptq"`` rounds it to nearest)
    calibrated: bool = True
    #: the input size of a layer must be a multiple of this (the format's block)
    k_multiple: int = 1
    #: an expert-block class: whether it splits for tensor parallelism (``tp_shard(style="experts")``)
    tp_experts: bool = False
    #: ``(style, rank, world)`` on a module that :meth:`tp_shard` made (one rank's part), else None
    tp_part: tuple | None = None
    #: the format quantized column by column (``lowbit/formats/<name>/columns.py``) for calibrated
    #: quantization (``quantize_model(method="gptq")``); its ``result()`` is what ``from_linear`` (and the
    #: fused / experts constructors) take as ``quantized=``. None: the format has no calibrated path.
    column_quantizer: type | None = None
    #: input-space rotations its modules can store (``quantize_model(rotation=...)``; 0: none)
    rotations: tuple[int, ...] = (0,)

    @classmethod
    def label(cls, bits: int) -> str:
        """How reports name the format at ``bits`` (``kbit4``)."""
        return f"{cls.format_name}{bits}"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        REGISTRY[cls.__name__] = cls

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_linear(cls, linear: nn.Linear, **options) -> "QuantizedModule":
        """Quantize ``linear`` (options: ``bits``, ``codebook``; ``quantized``: a column quantizer's
        result to use instead of rounding to nearest)."""
        raise NotImplementedError

    @classmethod
    def check_options(cls, **options) -> None:
        """Refuse options this format does not take (ValueError naming them) before anything is quantized."""

    def format_bytes(self) -> int:
        raise NotImplementedError

    # -- checkpoints ------------------------------------------------------------------------
    def checkpoint_config(self) -> dict:
        """What the checkpoint index records to rebuild this module's skeleton (``type`` is added)."""
        raise NotImplementedError

    @staticmethod
    def replaced_module(name: str, cfg: dict) -> str:
        """The skeleton module a saved entry ``name`` replaces (default: the module of that name)."""
        return name

    @classmethod
    def from_checkpoint_config(cls, name: str, cfg: dict, old: nn.Module) -> "QuantizedModule":
        """An empty module on the meta device for entry ``name`` of a checkpoint, checked against the
        skeleton's ``old`` module (ValueError / KeyError / TypeError on a mismatch)."""
        raise NotImplementedError

    def replaced_names(self, name: str) -> list[str]:
        """Module names whose tensors this module takes over when installed as ``name``."""
        return [name]

    def compact_pairs(self) -> list[tuple[str, str, str, str, int, int]]:
        """Tensors stored in another layout than the module holds: (held codes, held scales, stored
        codes, stored scales, N, K_in) per weight; empty where the module holds its stored layout."""
        return []

    def compact_shapes(self, n: int, k_in: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of the stored (codes, scales) of one ``compact_pairs`` entry (dtypes: the held tensors')."""
        raise NotImplementedError

    def to_compact(self, codes: torch.Tensor, scales: torch.Tensor, n: int, k_in: int):
        raise NotImplementedError

    def from_compact(self, codes: torch.Tensor, scales: torch.Tensor):
        raise NotImplementedError

    def check_checkpoint_values(self, name: str, staged: dict[str, torch.Tensor]) -> None:
        """Values the kernels trust (finite scales, ...), checked before a load changes anything:
        ValueError naming the tensor."""

    def install(self, model: nn.Module, name: str, device: torch.device | None = None) -> None:
        """Put this module into ``model`` as ``name``; ``device``: where its tensors will be (a load
        installs the module before it fills the module's tensors)."""
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, self)

    def tensors_changed(self) -> None:
        """Forget what was derived from the tensors (launchers, decoded copies) after a load replaced them."""

    # -- tensor parallelism -------------------------------------------------------------------
    def tp_shard(self, style: str, rank: int, world: int) -> "QuantizedModule":
        """Rank ``rank`` of ``world``'s part of this module for tensor parallelism, as a new module.

        ``style="colwise"``: output rows split in ``world`` equal parts (a fused module splits each of its
        projections, so every rank keeps its part of each); ``"rowwise"``: input columns split, each part a
        whole number of the format's blocks (``k_multiple``), the bias kept whole (the rowwise layer adds it
        once, after summing the partial outputs). Codebooks and tensor scales are shared, so the parts are
        exactly slices of this module's weight."""
        if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
            raise ValueError(f"rank must be in [0, world) and world >= 1, got rank={rank}, world={world}")
        sizes = list(getattr(self, "out_sizes", None) or [self.out_features])
        if style not in ("colwise", "rowwise"):
            raise ValueError(f"style must be 'colwise' or 'rowwise', got {style!r}")
        problem = tp_split_problem(style, sizes, self.in_features, world, self.k_multiple)
        if problem:
            raise ValueError(f"{type(self).__name__}: {problem}")
        if style == "colwise":
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            rows = torch.cat([torch.arange(o + rank * (n // world), o + (rank + 1) * (n // world))
                              for o, n in zip(offsets, sizes)])
            new = self._tp_part(rows, None, [n // world for n in sizes])
        else:
            part = self.in_features // world
            new = self._tp_part(None, (rank * part, (rank + 1) * part), sizes)
        new.tp_part = (style, rank, world)
        return new

    def _tp_part(self, rows: torch.Tensor | None, cols: tuple[int, int] | None, out_sizes: list[int]):
        """The module of output rows ``rows`` (None: all) and input columns ``cols`` (None: all)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be split for tensor parallelism")


def linear_class(format_name: str) -> type[QuantizedModule]:
    """The module that quantizes ``nn.Linear`` layers to ``format_name`` (ValueError naming the known ones)."""
    for cls in REGISTRY.values():
        if cls.__dict__.get("format_name") == format_name:
            return cls
    known = sorted({c.__dict__["format_name"] for c in REGISTRY.values() if c.__dict__.get("format_name")})
    raise ValueError(f"format must be one of {', '.join(known)}, got {format_name!r}")


def formats() -> tuple[str, ...]:
    """Every format quantize_model can write, in registration order."""
    return tuple(c.__dict__["format_name"] for c in REGISTRY.values() if c.__dict__.get("format_name"))
