"""``SbvrLinear``: a drop-in for ``nn.Linear`` with an SBVR weight (:mod:`lowbit.formats.sbvr`). Models of them
come from ``lowbit.quantize_model(model, format="sbvr", bits=num_sums)``. Its forward is
:func:`lowbit.dispatch.sbvr_linear_op`: for decode-sized inputs (up to ``dispatch.SBVR_POPCOUNT_MAX_M`` rows) the
authors' product -- the activations rounded to 8 bits per group, popcounts on the binary tensor cores -- unless
``act_bits=None``; larger inputs and ``act_bits=None`` are weight-only (the lookup GEMV up to 8 rows, dequantize +
cuBLAS above). ``SbvrMoeExperts``: transformers' fused MoE expert blocks in SBVR. Inference only."""

from __future__ import annotations

import torch
from torch import nn

from .. import dispatch
from ..formats import sbvr
from ..formats.kbit import rotation as block_rotation  # the block-32 Hadamard (any format's input space)
from .base import QuantizedModule, check_input, describe
from .experts import fused_experts_layout, moe_forward, saved_experts_shape


ACT_BITS = sbvr.tiled.ACT_BITS
check_act_bits = sbvr.tiled.check_act_bits


def group_for(in_features: int) -> int:
    """The largest of 128, 64, 32 that divides ``in_features`` (the format's group; 128 where it can)."""
    for g in (128, 64, 32):
        if in_features % g == 0:
            return g
    raise ValueError(f"SBVR needs in_features % 32 == 0, got {in_features}")


class SbvrLinear(QuantizedModule):
    """``y = x @ W^T + b`` with W in SBVR (``num_sums`` bitvectors per group + a coefficient-cache index).
    ``SbvrLinear(in, out, bias, num_sums=, group=, cache_lines=)`` is an empty skeleton for loading.
    ``act_bits``: 8 (decode through the popcount GEMV, activations rounded to 8 bits) or None (weight-only)."""

    format_name = "sbvr"
    k_multiple = sbvr.WORD
    column_quantizer = sbvr.columns.ColumnQuantizer
    #: rotation=32: the weight holds W H (block-32 Hadamard) and the forward rotates x in PyTorch
    rotations = block_rotation.ROTATIONS

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, num_sums: int = 4,
                 group: int | None = None, cache_lines: int = 1, rotation: int = 0, act_bits: int | None = ACT_BITS,
                 device=None, dtype: torch.dtype | None = None):
        super().__init__()
        if not (isinstance(in_features, int) and isinstance(out_features, int) and in_features > 0 and out_features > 0):
            raise ValueError(f"in_features and out_features must be positive ints, got {in_features}, {out_features}")
        group = group_for(in_features) if group is None else sbvr.check_group(group)
        if in_features % group:
            raise ValueError(f"in_features={in_features} is not a multiple of group={group}")
        self.in_features, self.out_features = in_features, out_features
        self.num_sums, self.group = sbvr.check_num_sums(num_sums), group
        self.rotation = block_rotation.check_rotation(rotation)
        self.act_bits = check_act_bits(act_bits)
        self.register_buffer("bitvectors", torch.zeros((out_features, in_features // sbvr.WORD, num_sums),
                                                       dtype=torch.int32, device=device))
        self.register_buffer("coeff_idx", torch.zeros((out_features, in_features // group), dtype=torch.int16, device=device))
        self.register_buffer("cache", torch.zeros((cache_lines, num_sums), dtype=torch.float16, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._w = self._w_src = None  # the SbvrWeight over the buffers, checked once per change (not per call:
        # its checks read values back, which a CUDA graph capture cannot do)
        self._tiled = self._tiled_of = self._cpu_weight = None  # the kernels' layout of it (a second copy); CPU: the decoded weight

    @classmethod
    def label(cls, bits: int) -> str:
        return f"sbvr{bits}"

    @classmethod
    def check_options(cls, bits: int = 4, codebook=None) -> None:
        if codebook is not None:
            raise ValueError("codebook is a kbit option; SBVR's coefficients come from its own search")
        try:
            sbvr.check_num_sums(bits)
        except ValueError:
            raise ValueError(f"format='sbvr' takes bits = num_sums in {sbvr.SUPPORTED_NUM_SUMS}, got {bits!r}") from None

    @classmethod
    def from_weight(cls, w: sbvr.SbvrWeight, bias: torch.Tensor | None = None, rotation: int = 0) -> "SbvrLinear":
        """The module of an encoded weight (``rotation=32``: ``w`` encodes ``W H``)."""
        if not isinstance(w, sbvr.SbvrWeight):
            raise TypeError(f"w must be an SbvrWeight, got {type(w).__name__}")
        n, k = w.shape
        mod = cls(k, n, bias=bias is not None, num_sums=w.num_sums, group=w.group, cache_lines=w.cache.shape[0],
                  rotation=rotation, device="meta")
        mod._buffers.update(bitvectors=w.bitvectors, coeff_idx=w.coeff_idx, cache=w.cache)
        mod.tensors_changed()
        if bias is not None:
            if tuple(bias.shape) != (n,):
                raise ValueError(f"bias must be [{n}], got {tuple(bias.shape)}")
            mod.bias = nn.Parameter(bias.detach().clone().to(w.device), requires_grad=False)
        return mod

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, codebook=None, quantized: sbvr.SbvrWeight | None = None,
                    group: int | None = None, rotation: int = 0) -> "SbvrLinear":
        """Encode an ``nn.Linear`` (on its device) with ``num_sums = bits``; ``quantized``: an ``SbvrWeight``
        already chosen instead (of the rotated weight when ``rotation``); ``rotation=32``: encode ``W H``."""
        cls.check_options(bits, codebook)
        block_rotation.check_rotation(rotation)
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        if quantized is None:
            w = linear.weight.detach()
            w = block_rotation.rotate(w.to(torch.float32)) if rotation else w
            quantized = sbvr.quantize(w, bits, group or group_for(linear.in_features))
        elif tuple(quantized.shape) != tuple(linear.weight.shape):
            raise ValueError(f"quantized weight {tuple(quantized.shape)} does not fit {tuple(linear.weight.shape)}")
        return cls.from_weight(quantized, linear.bias, rotation)

    def sbvr_weight(self) -> sbvr.SbvrWeight:
        b = self._buffers
        src = (b["bitvectors"], b["coeff_idx"], b["cache"])
        if torch.compiler.is_compiling():  # traced: the buffers were checked when built or loaded
            return sbvr.SbvrWeight(*src, self.group, check=False)
        if self._w is None or self._w_src is None or any(a is not c for a, c in zip(self._w_src, src)):
            self._w, self._w_src = sbvr.SbvrWeight(*src, self.group), src
        return self._w

    def layouts(self) -> tuple:
        """``(qbits, qcodes or None, qidx, cache8)``: the weight in the kernels' layouts
        (:mod:`lowbit.formats.sbvr.tiled`), built once per change of the buffers (on CUDA when they get there,
        so not inside a captured graph)."""
        if torch.compiler.is_compiling():
            if self._tiled is not None:
                return self._tiled
            b = self._buffers
            qbits, qidx, cache8 = sbvr.tiled.tile(b["bitvectors"], b["coeff_idx"], b["cache"])
            codes = sbvr.tiled.code_tile(b["bitvectors"]) if sbvr.tiled.codes_fit(self.num_sums, self.group) else None
            return qbits, codes, qidx, cache8
        w = self.sbvr_weight()
        if self._tiled is None or self._tiled_of is not w:
            self._tiled, self._tiled_of = w.layouts(), w
        return self._tiled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.in_features
        check_input(x, k)
        if self.rotation:
            x = block_rotation.rotate(x)  # the weight holds W H: give it x H
        x2 = x.reshape(-1, k)
        if x2.device.type == "cpu" and not torch.compiler.is_compiling():
            # the reference, with the weight decoded once (not per call): fp32 product, one rounding
            w = self.sbvr_weight()
            if self._cpu_weight is None or self._cpu_weight[0] is not w:
                self._cpu_weight = (w, w.dequantize(torch.float32))
            popcount = dispatch.sbvr_path(x2, self.num_sums, self.group, self.act_bits) == "popcount"
            xin = sbvr.rtn_activations(x2, self.act_bits, sbvr.act_group(self.group)) if popcount else x2.to(torch.float32)
            bias = None if self.bias is None else self.bias.to(torch.float32)
            y = torch.nn.functional.linear(xin, self._cpu_weight[1], bias).to(x.dtype)
        else:
            y = dispatch.sbvr_linear_op(x2, *self.layouts(), self.out_features, k, self.group, self.bias, self.act_bits)
        return y.view(*x.shape[:-1], self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight in x's space (rotated back when the module stores W H)."""
        if self.rotation:
            return block_rotation.rotate(self.sbvr_weight().dequantize(torch.float32)).to(dtype)
        return self.sbvr_weight().dequantize(dtype)

    def format_bytes(self) -> int:
        return self.sbvr_weight().nbytes()

    def _apply(self, fn, recurse=True):
        # dtype casts (model.half()) must not touch the bitvectors, indices or the fp16 cache
        from .linear import apply_keeping_dtypes

        apply_keeping_dtypes(self, super()._apply, fn, recurse, ("cache",))
        self.tensors_changed()
        return self

    def tensors_changed(self) -> None:
        self._w = self._w_src = self._tiled = self._cpu_weight = None
        if self.bitvectors.device.type == "cuda":
            self.layouts()

    def checkpoint_config(self) -> dict:
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None,
                "num_sums": self.num_sums, "group": self.group, "cache_lines": int(self.cache.shape[0]),
                "act_bits": self.act_bits, **({"rotation": self.rotation} if self.rotation else {})}

    @classmethod
    def from_checkpoint_config(cls, name: str, cfg: dict, old: nn.Module) -> "SbvrLinear":
        n, k, bias = cfg["out_features"], cfg["in_features"], cfg["bias"]
        if isinstance(old, (nn.Linear, SbvrLinear)) and (old.out_features, old.in_features, old.bias is not None) == (n, k, bias):
            return cls(k, n, bias=bias, num_sums=cfg["num_sums"], group=cfg["group"], cache_lines=cfg["cache_lines"],
                       rotation=cfg.get("rotation", 0), act_bits=cfg.get("act_bits", ACT_BITS), device="meta")
        raise ValueError(f"saved SbvrLinear({k} -> {n}, bias={bias}) does not fit this model's {describe(old)}")

    def check_checkpoint_values(self, name: str, staged: dict) -> None:
        try:
            sbvr.check_sbvr_tensors(staged[f"{name}.bitvectors"], staged[f"{name}.coeff_idx"], staged[f"{name}.cache"],
                                    self.group)
        except (ValueError, TypeError) as e:
            raise ValueError(f"module {name!r}: {e}") from None

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format=sbvr, num_sums={self.num_sums}, group={self.group}, cache={self.cache.shape[0]} lines, "
                f"act_bits={self.act_bits}" +
                (f", rotation={self.rotation}" if self.rotation else ""))


class SbvrMoeExperts(QuantizedModule):
    """A transformers fused MoE expert block (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``; see
    :func:`lowbit.nn.experts.fused_experts_layout`) in SBVR: per projection the stacked bitvectors, indices and
    the experts' concatenated coefficient caches (:class:`lowbit.formats.sbvr.SbvrExperts`). Its two products are
    :func:`lowbit.dispatch.sbvr_grouped_op`: the grouped popcount GEMV at decode (x rounded to 8 bits; ``act_bits=None``:
    weight-only), expert by expert above. RTN only (no GPTQ for expert blocks). Build with :meth:`from_experts`."""

    PROJECTIONS = ("gate_up", "down")
    calibrated = False  # method="gptq" rounds expert blocks to nearest (the linears are calibrated)

    def __init__(self, num_experts: int, hidden_dim: int, intermediate_dim: int, num_sums: int = 4,
                 act_fn: nn.Module | None = None, *, cache_lines: tuple[int, int] = (1, 1), act_bits: int | None = ACT_BITS,
                 device=None):
        super().__init__()
        for name, v in (("num_experts", num_experts), ("hidden_dim", hidden_dim), ("intermediate_dim", intermediate_dim)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden_dim, intermediate_dim
        self.num_sums, self.act_bits = sbvr.check_num_sums(num_sums), check_act_bits(act_bits)
        self.act_fn = act_fn if act_fn is not None else nn.SiLU()
        self.groups = {p: group_for(self._shape(p)[1]) for p in self.PROJECTIONS}
        for p, lines in zip(self.PROJECTIONS, cache_lines):
            n, k = self._shape(p)
            self.register_buffer(f"{p}_bitvectors", torch.zeros((num_experts, n, k // sbvr.WORD, num_sums), dtype=torch.int32,
                                                                device=device))
            self.register_buffer(f"{p}_coeff_idx", torch.zeros((num_experts, n, k // self.groups[p]), dtype=torch.int16,
                                                               device=device))
            self.register_buffer(f"{p}_cache", torch.zeros((lines, num_sums), dtype=torch.float16, device=device))
            self.register_buffer(f"{p}_cache_offsets", torch.zeros((num_experts + 1,), dtype=torch.int64, device=device))
        self.register_buffer("expert_range", torch.arange(num_experts + 1, device=device), persistent=False)
        self._experts: dict = {}

    def _shape(self, p: str) -> tuple[int, int]:
        return (2 * self.intermediate_dim, self.hidden_dim) if p == "gate_up" else (self.hidden_dim, self.intermediate_dim)

    def _tensors(self, p: str) -> tuple:
        b = self._buffers
        return b[f"{p}_bitvectors"], b[f"{p}_coeff_idx"], b[f"{p}_cache"], b[f"{p}_cache_offsets"]

    def experts(self, p: str) -> sbvr.SbvrExperts:
        """The projection's :class:`~lowbit.formats.sbvr.SbvrExperts`, checked once per change of the buffers (its
        kernel layouts built with it on CUDA, not inside a captured graph)."""
        have = self._experts.get(p)
        if torch.compiler.is_compiling() and have is not None:  # traced: the buffers were checked when built
            return have[1]
        src = self._tensors(p)
        if have is None or any(a is not c for a, c in zip(have[0], src)):
            ex = sbvr.SbvrExperts(*src, self.groups[p], check=not torch.compiler.is_compiling())
            if ex.device.type == "cuda":
                ex.layouts()
            have = self._experts[p] = (src, ex)
        return have[1]

    @classmethod
    def from_experts(cls, module: nn.Module, bits: int = 4, codebook=None, quantized=None) -> "SbvrMoeExperts":
        """Encode a transformers fused expert block on its device (``bits`` = num_sums), each expert with its own
        coefficient cache."""
        if codebook is not None:
            raise ValueError("codebook is a kbit option; SBVR's coefficients come from its own search")
        if quantized is not None:
            raise ValueError("SBVR expert blocks are quantized round-to-nearest only (no GPTQ for them yet)")
        layout = fused_experts_layout(module)
        if layout is None:
            raise TypeError(f"{type(module).__name__} is not a fused expert block lowbit knows "
                            "(gate_up_proj [E, 2I, H], down_proj [E, H, I], act(gate) * up)")
        e, h, i = layout
        mod = cls(e, h, i, bits, module.act_fn, device="meta")
        for p in cls.PROJECTIONS:
            ex = sbvr.quantize_experts(getattr(module, f"{p}_proj").detach(), bits, mod.groups[p])
            mod._buffers.update({f"{p}_bitvectors": ex.bitvectors, f"{p}_coeff_idx": ex.coeff_idx,
                                 f"{p}_cache": ex.cache, f"{p}_cache_offsets": ex.cache_offsets})
        mod._buffers["expert_range"] = torch.arange(e + 1, device=module.gate_up_proj.device)
        mod.tensors_changed()
        return mod

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        return moe_forward(self, hidden_states, top_k_index, top_k_weights,
                           lambda x, off: dispatch.sbvr_grouped_op(x, off, self.experts("gate_up"), self.act_bits, False),
                           lambda x, off: dispatch.sbvr_grouped_op(x, off, self.experts("down"), self.act_bits, False))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [E, 2I, H], down [E, H, I]) as the reference decodes them."""
        return self.experts("gate_up").dequantize(dtype), self.experts("down").dequantize(dtype)

    def format_bytes(self) -> int:
        return sum(self.experts(p).nbytes() for p in self.PROJECTIONS)

    def tensors_changed(self) -> None:
        self._experts = {}
        if self.gate_up_bitvectors.device.type == "cuda":
            for p in self.PROJECTIONS:
                self.experts(p)

    def _apply(self, fn, recurse=True):
        from .linear import apply_keeping_dtypes

        apply_keeping_dtypes(self, super()._apply, fn, recurse, ("gate_up_cache", "down_cache"))
        self.tensors_changed()
        return self

    def install(self, model: nn.Module, name: str, device: torch.device | None = None) -> None:
        super().install(model, name, device)
        self._buffers["expert_range"] = torch.arange(self.num_experts + 1, device=device or self.gate_up_cache.device)

    def checkpoint_config(self) -> dict:
        return {"num_experts": self.num_experts, "hidden_dim": self.hidden_dim, "intermediate_dim": self.intermediate_dim,
                "num_sums": self.num_sums, "act_bits": self.act_bits,
                "cache_lines": [int(getattr(self, f"{p}_cache").shape[0]) for p in self.PROJECTIONS]}

    @classmethod
    def from_checkpoint_config(cls, name: str, cfg: dict, old: nn.Module) -> "SbvrMoeExperts":
        return cls(*saved_experts_shape(cls, cfg, old), num_sums=cfg["num_sums"], act_fn=old.act_fn, cache_lines=tuple(cfg["cache_lines"]),
                   act_bits=cfg.get("act_bits", ACT_BITS), device="meta")

    def check_checkpoint_values(self, name: str, staged: dict) -> None:
        for p in self.PROJECTIONS:
            try:
                sbvr.SbvrExperts(*(staged[f"{name}.{p}_{t}"] for t in ("bitvectors", "coeff_idx", "cache", "cache_offsets")),
                                 self.groups[p])
            except (ValueError, TypeError) as e:
                raise ValueError(f"module {name!r} ({p}): {e}") from None

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, intermediate_dim={self.intermediate_dim}, "
                f"format=sbvr, num_sums={self.num_sums}, act_bits={self.act_bits}")


SbvrLinear.experts_class = SbvrMoeExperts
