"""``NvFp4Linear``: a drop-in for ``nn.Linear`` with an NVFP4 weight. Models of them come from
``lowbit.quantize_model(model, format="nvfp4")`` or ``lowbit.load_nvfp4_checkpoint`` (the NVFP4 tensors of
a ModelOpt or compressed-tensors checkpoint). ``NvFp4MoeExperts``: transformers' fused MoE expert blocks in
NVFP4 (the tiled layout, the grouped kernels).

The module keeps the checkpoint layout itself (ModelOpt's names: ``weight`` packed uint8 [N, K/2],
``weight_scale`` float8_e4m3fn [N, K/16], ``weight_scale_2`` fp32), so ``state_dict`` / ``load_state_dict``
speak that convention. Its forward is :func:`lowbit.dispatch.nvfp4_linear_op` (the checkpoint-layout
GEMV at M = 1 on mid-size K, the tiled kernels elsewhere -- their layout is built on first use and kept --
and the reference on CPU). Inference only.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import dispatch, ops
from ..formats import nvfp4
from ..formats.nvfp4 import columns as nvfp4_columns
from ..formats.nvfp4 import tiled as nvfp4_tiled
from .base import QuantizedModule, check_input, describe
from .experts import (expert_tp_range, fused_experts_layout, moe_forward, moe_routed_forward, saved_experts_shape,
                      tiled_expert_slices)
from .fused import FusedParts, check_fusable
from .linear import apply_keeping_dtypes


class NvFp4Linear(QuantizedModule):
    """``y = x @ W^T + b`` with W in NVFP4 (E2M1 + E4M3 per 16 + fp32 tensor scale). Build one with
    :meth:`from_linear` or :meth:`from_weight`; ``NvFp4Linear(in, out, bias)`` is an empty skeleton
    for ``load_state_dict``. Output dtype = x's dtype; fp32 accumulation."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, device=None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if not (isinstance(in_features, int) and isinstance(out_features, int) and in_features > 0 and out_features > 0):
            raise ValueError(f"in_features and out_features must be positive ints, got {in_features}, {out_features}")
        if in_features % nvfp4.BLOCK:
            raise ValueError(f"NVFP4 needs in_features % {nvfp4.BLOCK} == 0, got {in_features}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros((out_features, in_features // 2), dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.zeros((out_features, in_features // nvfp4.BLOCK),
                                                         dtype=torch.float8_e4m3fn, device=device))
        self.register_buffer("weight_scale_2", torch.ones((), dtype=torch.float32, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._w = None  # NvFp4Weight over the buffers (and its tiled copy), rebuilt when they change
        self._w_src = None  # the buffers it was built from

    @classmethod
    def from_weight(cls, w: nvfp4.NvFp4Weight, bias: torch.Tensor | None = None) -> "NvFp4Linear":
        if not isinstance(w, nvfp4.NvFp4Weight):
            raise TypeError(f"w must be an NvFp4Weight, got {type(w).__name__}")
        n, k = w.shape
        mod = cls(k, n, bias=bias is not None, device="meta")
        mod._buffers.update(weight=w.packed, weight_scale=w.scales, weight_scale_2=w.scale_2)
        mod._w, mod._w_src = w, (w.packed, w.scales, w.scale_2)
        if bias is not None:
            if tuple(bias.shape) != (n,):
                raise ValueError(f"bias must be [{n}], got {tuple(bias.shape)}")
            mod.bias = nn.Parameter(bias.detach().clone().to(w.device), requires_grad=False)
        return mod

    format_name = "nvfp4"
    k_multiple = nvfp4.BLOCK

    @classmethod
    def label(cls, bits: int) -> str:
        return "NVFP4"

    @classmethod
    def check_options(cls, bits: int = 4, codebook=None) -> None:
        given = [k for k, v in (("bits", bits != 4), ("codebook", codebook is not None)) if v]
        if given:
            raise ValueError(f"format='nvfp4' is 4-bit E2M1 with E4M3 block scales; {', '.join(given)} are kbit options")

    column_quantizer = nvfp4_columns.ColumnQuantizer

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, codebook=None,
                    quantized: nvfp4.NvFp4Weight | None = None) -> "NvFp4Linear":
        """Quantize an ``nn.Linear`` (on its device) with :func:`lowbit.quantize_nvfp4` (``bits`` must be 4);
        ``quantized``: an ``NvFp4Weight`` already chosen (a calibration's result) instead."""
        cls.check_options(bits, codebook)
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        if quantized is not None and tuple(quantized.shape) != tuple(linear.weight.shape):
            raise ValueError(f"quantized weight {tuple(quantized.shape)} does not fit {tuple(linear.weight.shape)}")
        return cls.from_weight(quantized if quantized is not None else nvfp4.quantize(linear.weight.detach()), linear.bias)

    def nvfp4_weight(self) -> nvfp4.NvFp4Weight:
        """The weight as an :class:`~lowbit.formats.nvfp4.NvFp4Weight` (validated when the buffers change)."""
        b = self._buffers
        src = (b["weight"], b["weight_scale"], b["weight_scale_2"])
        if self._w is None or self._w_src is None or any(a is not c for a, c in zip(self._w_src, src)):
            self._w, self._w_src = nvfp4.NvFp4Weight(*src), src
        return self._w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.in_features
        check_input(x, k)
        y = dispatch.nvfp4_linear_op(x.reshape(-1, k).contiguous(), self.nvfp4_weight())
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.nvfp4_weight().dequantize(dtype)

    def format_bytes(self) -> int:
        """Bytes of the format: 4.5 bits per weight + the fp32 tensor scale."""
        return self.out_features * self.in_features * 9 // 16 + 4

    def _apply(self, fn, recurse=True):
        # Device moves apply to everything; dtype casts (model.half()) must not touch the format's
        # fp8 scales and fp32 tensor scale.
        apply_keeping_dtypes(self, super()._apply, fn, recurse, ("weight_scale", "weight_scale_2"))
        self._w = self._w_src = None
        return self

    # -- checkpoints (lowbit.model.checkpoint): the module holds the compact checkpoint layout itself
    def checkpoint_config(self) -> dict:
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None}

    @classmethod
    def from_checkpoint_config(cls, name: str, cfg: dict, old: nn.Module) -> "NvFp4Linear":
        n, k, bias = cfg["out_features"], cfg["in_features"], cfg["bias"]
        if isinstance(old, (nn.Linear, NvFp4Linear)) and (old.out_features, old.in_features, old.bias is not None) == (n, k, bias):
            return cls(k, n, bias=bias, device="meta")
        raise ValueError(f"saved NvFp4Linear({k} -> {n}, bias={bias}) does not fit this model's {describe(old)}")

    def check_checkpoint_values(self, name: str, staged: dict) -> None:
        scales, s2 = staged[f"{name}.weight_scale"].to(torch.float32), staged[f"{name}.weight_scale_2"]
        if not bool(torch.isfinite(scales).all()) or bool((scales < 0).any()):
            raise ValueError(f"tensor {name + '.weight_scale'!r}: NVFP4 block scales must be finite and >= 0")
        if not bool(torch.isfinite(s2).all()) or bool((s2 <= 0).any()):
            raise ValueError(f"tensor {name + '.weight_scale_2'!r}: the NVFP4 tensor scale must be finite and > 0")

    def tensors_changed(self) -> None:
        self._w = self._w_src = None

    def tp_read_slices(self, style: str, rank: int, world: int) -> dict[str, list[tuple]]:
        """The index ranges of the saved codes and block scales that rank ``rank``'s part (:meth:`tp_shard`) is
        cut from: each projection's rows of the rank (colwise), or its columns (rowwise; 2 codes a byte, one
        scale per 16 columns). The tensor scale is read whole by every rank."""
        if style == "colwise":
            idx, o = [], 0
            for n in list(getattr(self, "out_sizes", None) or [self.out_features]):
                idx.append((slice(o + rank * (n // world), o + (rank + 1) * (n // world)),))
                o += n
            return {"weight": idx, "weight_scale": idx}
        if style == "rowwise":
            part = self.in_features // world
            c0, c1 = rank * part, (rank + 1) * part
            return {"weight": [(slice(None), slice(c0 // 2, c1 // 2))],
                    "weight_scale": [(slice(None), slice(c0 // nvfp4.BLOCK, c1 // nvfp4.BLOCK))]}
        raise ValueError(f"style must be 'colwise' or 'rowwise', got {style!r}")

    def _tp_part(self, rows, cols, out_sizes):
        b = self._buffers
        codes, scales = b["weight"], b["weight_scale"]
        if rows is not None:
            rows = rows.to(codes.device)
            codes, scales = codes[rows], scales[rows]
        c0, c1 = cols if cols else (0, self.in_features)
        codes = codes[:, c0 // 2:c1 // 2].contiguous()
        scales = scales[:, c0 // nvfp4.BLOCK:c1 // nvfp4.BLOCK].contiguous()
        bias = self.bias is not None
        if len(out_sizes) > 1:
            new = FusedNvFp4Linear(c1 - c0, out_sizes, bias=bias, device="meta")
            new.part_names = self.part_names
        else:
            new = NvFp4Linear(c1 - c0, out_sizes[0], bias=bias, device="meta")
        new._buffers.update(weight=codes, weight_scale=scales, weight_scale_2=b["weight_scale_2"])
        new.tensors_changed()
        if bias:
            bb = self.bias.detach()
            new.bias = nn.Parameter((bb[rows.to(bb.device)] if rows is not None else bb).clone(), requires_grad=False)
        new.train(self.training)
        return new

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, format=nvfp4"


class FusedNvFp4Linear(FusedParts, NvFp4Linear):
    """``len(out_sizes)`` projections of one input in one NVFP4 weight (rows concatenated in order, one
    tensor scale for all: quantized from the dense weights; a checkpoint's separately scaled projections
    stay apart). Its parts are :class:`~lowbit.nn.fused.LinearPart` s."""

    linear_cls = NvFp4Linear

    def __init__(self, in_features: int, out_sizes, bias: bool = True, *, device=None, dtype: torch.dtype | None = None):
        out_sizes = self.check_out_sizes(out_sizes)
        super().__init__(in_features, sum(out_sizes), bias, device=device, dtype=dtype)
        self._init_parts(out_sizes)

    @classmethod
    def _skeleton(cls, in_features, out_sizes, bias, cfg):
        return cls(in_features, out_sizes, bias=bias, device="meta")

    @classmethod
    def from_linears(cls, linears, bits: int = 4, codebook=None,
                     quantized: nvfp4.NvFp4Weight | None = None) -> "FusedNvFp4Linear":
        """Quantize ``linears`` (same input size, all with or all without bias, same dtype and device) as one
        NVFP4 weight; ``quantized``: the concatenated weight's NvFp4Weight (a calibration's result)."""
        cls.check_options(bits, codebook)
        linears = list(linears)
        has_bias = check_fusable(linears)
        sizes = [lin.out_features for lin in linears]
        if quantized is not None and tuple(quantized.shape) != (sum(sizes), linears[0].in_features):
            raise ValueError(f"quantized weight {tuple(quantized.shape)} does not fit the fused "
                             f"{(sum(sizes), linears[0].in_features)}")
        w = quantized if quantized is not None else nvfp4.quantize(torch.cat([lin.weight.detach() for lin in linears]))
        mod = cls(linears[0].in_features, sizes, bias=has_bias, device="meta")
        mod._buffers.update(weight=w.packed, weight_scale=w.scales, weight_scale_2=w.scale_2)
        mod._w, mod._w_src = w, (w.packed, w.scales, w.scale_2)
        if has_bias:
            mod.bias = nn.Parameter(torch.cat([lin.bias.detach() for lin in linears]).to(w.device), requires_grad=False)
        return mod


NvFp4Linear.fused_class = FusedNvFp4Linear
# fused by default, as kbit: Llama-3-8B decode on an H100 312 -> 345 tok/s, the same KL
# (benchmarks/journal/2026-11-26_nvfp4_fused_by_default.md)
NvFp4Linear.fuse_by_default = True


class NvFp4MoeExperts(QuantizedModule):
    """A transformers fused MoE expert block (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``; see
    :func:`lowbit.nn.experts.fused_experts_layout`) in NVFP4, every expert quantized alone (its own tensor scale).
    It holds, stores and computes on the tiled GPU layout (:class:`lowbit.formats.nvfp4.NvFp4Experts`; per
    projection ``{p}_qweight``, ``{p}_qscales``, ``{p}_scale_2``). Its two products are
    :func:`lowbit.dispatch.nvfp4_grouped_op` on rows sorted by expert: the grouped GEMV, the grouped tensor-core GEMM
    from the rows-per-expert crossover, the reference on CPU; at decode sizes (:func:`lowbit.dispatch.moe_routed`) the
    routed GEMV on the router's ids, with down's SiLU-mul inside it (as :class:`KbitMoeExperts`). Round to nearest
    only (``method="gptq"`` calibrates the linears and rounds these). Build with :meth:`from_experts`."""

    PROJECTIONS = ("gate_up", "down")
    calibrated = False
    k_multiple = 32  # the tiled layout's lookup block: both projections' inputs (H and I)
    tp_experts = True

    def __init__(self, num_experts: int, hidden_dim: int, intermediate_dim: int, act_fn: nn.Module | None = None, *,
                 device=None):
        super().__init__()
        for name, v in (("num_experts", num_experts), ("hidden_dim", hidden_dim), ("intermediate_dim", intermediate_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name, v in (("hidden_dim", hidden_dim), ("intermediate_dim", intermediate_dim)):
            if v % self.k_multiple:
                raise ValueError(f"NVFP4 expert blocks need {name} % {self.k_multiple} == 0, got {v}")
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden_dim, intermediate_dim
        self.act_fn = act_fn if act_fn is not None else nn.SiLU()
        for p in self.PROJECTIONS:
            t, g = nvfp4_tiled.tiled_shape(*self._shape(p))
            self.register_buffer(f"{p}_qweight", torch.zeros((num_experts, t, g, 4, 32, 4), dtype=torch.int32, device=device))
            self.register_buffer(f"{p}_qscales", torch.zeros((num_experts, t, g, nvfp4_tiled.SCALE_BYTES), dtype=torch.uint8,
                                                             device=device))
            self.register_buffer(f"{p}_scale_2", torch.ones((num_experts,), dtype=torch.float32, device=device))
        self.register_buffer("expert_range", torch.arange(num_experts + 1, device=device), persistent=False)
        self.tensors_changed()

    def _shape(self, p: str) -> tuple[int, int]:
        return (2 * self.intermediate_dim, self.hidden_dim) if p == "gate_up" else (self.hidden_dim, self.intermediate_dim)

    def experts(self, p: str) -> nvfp4.NvFp4Experts:
        """The projection's :class:`~lowbit.formats.nvfp4.NvFp4Experts` over the buffers (rebuilt when they change;
        made when they are set, so that a traced forward only reads it)."""
        have = self._experts.get(p)
        if torch.compiler.is_compiling() and have is not None:
            return have[1]
        b = self._buffers
        src = (b[f"{p}_qweight"], b[f"{p}_qscales"], b[f"{p}_scale_2"])
        if have is None or any(a is not c for a, c in zip(have[0], src)):
            have = self._experts[p] = (src, nvfp4.NvFp4Experts(*src, *self._shape(p)))
        return have[1]

    @classmethod
    def from_experts(cls, module: nn.Module, bits: int = 4, codebook=None, quantized=None) -> "NvFp4MoeExperts":
        """Quantize a transformers fused expert block on its device: each expert's gate|up and down weights with
        :func:`lowbit.quantize_nvfp4`, then stacked in the tiled layout."""
        NvFp4Linear.check_options(bits, codebook)
        if quantized is not None:
            raise ValueError("NVFP4 expert blocks are quantized round-to-nearest only (no GPTQ for them)")
        layout = fused_experts_layout(module)
        if layout is None:
            raise TypeError(f"{type(module).__name__} is not a fused expert block lowbit knows "
                            "(gate_up_proj [E, 2I, H], down_proj [E, H, I], act(gate) * up)")
        e, h, i = layout
        mod = cls(e, h, i, module.act_fn, device="meta")
        for p in cls.PROJECTIONS:
            stack = getattr(module, f"{p}_proj").detach()
            ex = nvfp4.NvFp4Experts.from_weights(nvfp4.quantize(w) for w in stack)
            mod._buffers.update({f"{p}_qweight": ex.qweight, f"{p}_qscales": ex.qscales, f"{p}_scale_2": ex.scale_2})
        mod._buffers["expert_range"] = torch.arange(e + 1, device=module.gate_up_proj.device)
        mod.tensors_changed()
        return mod

    def _routed(self, p: str, x: torch.Tensor, ids: torch.Tensor, rows_per_x: int, swiglu: bool = False) -> torch.Tensor:
        """The routed GEMV's NVFP4 instance on the router's ids (eager: a launcher kept per projection; traced: the op)."""
        ex = self.experts(p)
        if not torch.compiler.is_compiling():
            launch = self._launchers.get(p)
            if launch is None or launch.tensors[0] is not ex.qweight:
                launch = self._launchers[p] = dispatch.nvfp4_routed_launcher(ex, x)
            if launch is not None:
                return launch(x, ids, rows_per_x, swiglu)
        return ops.nvfp4_routed_gemv(x, ids, ex.qweight, ex.qscales, ex.scale_2, ex.n, ex.k, rows_per_x, swiglu)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if dispatch.moe_routed(hidden_states, top_k_index.numel(), self.num_experts):  # decode: no sort
            return moe_routed_forward(self, hidden_states, top_k_index, top_k_weights,
                                      lambda x, ids, d: self._routed("gate_up", x, ids, d),
                                      lambda x, ids, d: self._routed("down", x, ids, d),
                                      lambda gu, ids: self._routed("down", gu, ids, 1, swiglu=True))
        # the offsets are built by moe_forward (valid by construction): no device-side check
        return moe_forward(self, hidden_states, top_k_index, top_k_weights,
                           lambda x, off: dispatch.nvfp4_grouped_op(x, off, self.experts("gate_up"), False),
                           lambda x, off: dispatch.nvfp4_grouped_op(x, off, self.experts("down"), False))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [E, 2I, H], down [E, H, I]) as the reference decodes them."""
        out = []
        for p in self.PROJECTIONS:
            ex = self.experts(p)
            out.append(torch.stack([ex.weight(e).dequantize(dtype) for e in range(self.num_experts)]))
        return out[0], out[1]

    def format_bytes(self) -> int:
        """4.5 bits per weight + one fp32 tensor scale per expert and projection."""
        return self.num_experts * (3 * self.hidden_dim * self.intermediate_dim * 9 // 16 + 8)

    def tensors_changed(self) -> None:
        self._experts, self._launchers = {}, {}
        if self.gate_up_qweight.device.type != "meta":
            for p in self.PROJECTIONS:
                self.experts(p)

    def _apply(self, fn, recurse=True):
        apply_keeping_dtypes(self, super()._apply, fn, recurse, ("gate_up_scale_2", "down_scale_2"))
        self.tensors_changed()
        return self

    def install(self, model: nn.Module, name: str, device: torch.device | None = None) -> None:
        super().install(model, name, device)
        self._buffers["expert_range"] = torch.arange(self.num_experts + 1, device=device or self.gate_up_scale_2.device)

    # -- checkpoints (lowbit.model.checkpoint): the tiled layout is what is stored
    def checkpoint_config(self) -> dict:
        return {"num_experts": self.num_experts, "hidden_dim": self.hidden_dim, "intermediate_dim": self.intermediate_dim}

    @classmethod
    def from_checkpoint_config(cls, name: str, cfg: dict, old: nn.Module) -> "NvFp4MoeExperts":
        return cls(*saved_experts_shape(cls, cfg, old), act_fn=old.act_fn, device="meta")

    def check_checkpoint_values(self, name: str, staged: dict) -> None:
        for p in self.PROJECTIONS:
            scales = staged[f"{name}.{p}_qscales"].view(torch.float8_e4m3fn).to(torch.float32)
            s2 = staged[f"{name}.{p}_scale_2"]
            if not bool(torch.isfinite(scales).all()) or bool((scales < 0).any()):
                raise ValueError(f"tensor {name + '.' + p + '_qscales'!r}: NVFP4 block scales must be finite and >= 0")
            if not bool(torch.isfinite(s2).all()) or bool((s2 <= 0).any()):
                raise ValueError(f"tensor {name + '.' + p + '_scale_2'!r}: NVFP4 tensor scales must be finite and > 0")

    # -- tensor parallelism (transformers' "moe_tp_experts": every rank runs every expert on its slice of I)
    def tp_shard(self, style: str, rank: int, world: int) -> "NvFp4MoeExperts":
        """Rank ``rank`` of ``world``'s part (``style="experts"``): every expert's intermediate features split in
        ``world`` equal parts of whole 32-column blocks -- gate and up rows ``[r I/world, (r+1) I/world)`` of each
        half, down's columns the same; the tensor scales are shared, so the parts are exact slices and their outputs
        sum to the block's (the caller all-reduces them)."""
        lo, hi = expert_tp_range(self, style, rank, world, self.k_multiple)
        i, part = self.intermediate_dim, hi - lo
        new = type(self)(self.num_experts, self.hidden_dim, part, self.act_fn, device="meta")
        for p in self.PROJECTIONS:
            ex, parts = self.experts(p), []
            for e in range(self.num_experts):
                w = ex.weight(e)
                if p == "gate_up":
                    rows = torch.cat([torch.arange(lo, hi), torch.arange(i + lo, i + hi)]).to(w.device)
                    packed, scales = w.packed[rows], w.scales[rows]
                else:
                    packed, scales = w.packed[:, lo // 2:hi // 2], w.scales[:, lo // nvfp4.BLOCK:hi // nvfp4.BLOCK]
                parts.append(nvfp4.NvFp4Weight(packed.contiguous(), scales.contiguous(), w.scale_2))
            stacked = nvfp4.NvFp4Experts.from_weights(parts)
            new._buffers.update({f"{p}_qweight": stacked.qweight, f"{p}_qscales": stacked.qscales,
                                 f"{p}_scale_2": ex.scale_2})
        new._buffers["expert_range"] = self.expert_range
        new.tensors_changed()
        new.train(self.training)
        new.tp_part = ("experts", rank, world)
        return new

    def tp_read_slices(self, style: str, rank: int, world: int) -> dict[str, list[tuple]]:
        """The index ranges of the tiled stacks that rank ``rank``'s part (:meth:`tp_shard`) is cut from (as
        :class:`KbitMoeExperts`: whole tiles of gate and up rows, whole column groups of down); the tensor scales are
        read whole."""
        gate_up, down = tiled_expert_slices(style, self.intermediate_dim, rank, world)
        return {"gate_up_qweight": gate_up, "gate_up_qscales": gate_up, "down_qweight": down, "down_qscales": down}

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, intermediate_dim={self.intermediate_dim}, "
                f"format=nvfp4")


NvFp4Linear.experts_class = NvFp4MoeExperts
