"""``KbitMoeExperts``: the fused MoE expert block of transformers 5.x models, in kbit.

transformers 5.x keeps a MoE layer's experts as two stacked parameters, ``gate_up_proj
[E, 2I, H]`` (gate rows first, then up) and ``down_proj [E, H, I]``, in one module called as
``experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`` (Qwen2/3-MoE,
Qwen3-Next, Mixtral, DeepSeek-V2/V3, GLM-4-MoE, OLMoE, ...). This module replaces it:

    route -> sort the T*k (token, expert) rows by expert -> one grouped launch for gate/up
    -> act(gate) * up -> one grouped launch for down -> weight each row -> sum each token's k rows

The dispatcher sends decode (few rows per expert) to the grouped GEMV (8 rows per weight pass) and
prefill / large batches to the grouped tensor-core GEMM; either way two launches per layer. At decode
sizes (``dispatch.moe_routed``) the kernel takes the router's ids as they are (``lowbit.ops.kbit_routed_gemv``,
ordering them itself) and the block is ``gate_up(x, ids) -> act(gate) * up -> down(., ids) -> weighted
sum``: no sort, offsets, gather or scatter kernels (:func:`moe_routed_forward`).
Every step has a static shape (``searchsorted`` for the offsets, no ``nonzero``), so the block
captures in CUDA graphs and compiles with ``fullgraph=True``. Rows routed to an expert id >= E
(expert-parallel sentinels) contribute zero, as in transformers.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import dispatch, ops
from ..formats import kbit
from ..formats.kbit import tiled as kbit_tiled
from .base import QuantizedModule, is_plain_silu, tp_split_problem
from .linear import KbitLinear, apply_keeping_dtypes, check_kbit_values, quantized_codes

#: experts quantized per step in from_experts (bounds the temporaries: ~30 bytes per weight).
_QUANT_CHUNK_WEIGHTS = 1 << 26


def fused_experts_layout(module: nn.Module) -> tuple[int, int, int] | None:
    """(E, H, I) if ``module`` is a transformers fused expert block this module reproduces, else None.

    Requirements: 3-D ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``, an ``act_fn``,
    and the default layout/gating (not transposed, concatenated gate/up, no bias, the default
    ``act(gate) * up``; GPT-OSS-style custom gates are left alone).
    """
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(gu, torch.Tensor) and isinstance(down, torch.Tensor) and gu.dim() == 3 and down.dim() == 3):
        return None
    if not hasattr(module, "act_fn"):
        return None
    if getattr(module, "is_transposed", False) or getattr(module, "has_bias", False):
        return None
    if not getattr(module, "has_gate", True) or not getattr(module, "is_concatenated", True):
        return None
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        return None
    e, two_i, h = gu.shape
    if two_i % 2 or tuple(down.shape) != (e, h, two_i // 2):
        return None
    return e, h, two_i // 2


def saved_experts_shape(cls: type, cfg: dict, old: nn.Module) -> tuple[int, int, int]:
    """(E, H, I) of a checkpoint's expert block entry, checked against the module it replaces (a ``cls`` module or a
    transformers fused expert block)."""
    shape = (cfg["num_experts"], cfg["hidden_dim"], cfg["intermediate_dim"])
    have = (old.num_experts, old.hidden_dim, old.intermediate_dim) if isinstance(old, cls) else fused_experts_layout(old)
    if have != shape:
        raise ValueError(f"saved experts (E, H, I) = {shape} do not fit this model's {type(old).__name__} {have}")
    return shape


def expert_tp_range(mod: nn.Module, style: str, rank: int, world: int, block: int) -> tuple[int, int]:
    """Rank ``rank`` of ``world``'s range ``[lo, hi)`` of an expert block's intermediate features for
    ``tp_shard(style="experts")``: ``world`` equal parts of whole ``block``-column blocks. Raises ValueError for
    another style, a bad rank or world, or a split the block does not allow."""
    if style != "experts":
        raise ValueError(f"an expert block splits as 'experts' (its intermediate features), got style {style!r}")
    if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(f"rank must be in [0, world) and world >= 1, got rank={rank}, world={world}")
    problem = tp_split_problem("experts", [], mod.intermediate_dim, world, block)
    if problem:
        raise ValueError(f"{type(mod).__name__}: {problem}")
    part = mod.intermediate_dim // world
    return rank * part, (rank + 1) * part


def tiled_expert_slices(style: str, intermediate_dim: int, rank: int, world: int) -> tuple[list, list]:
    """(gate|up, down) index ranges of a tiled expert stack ``[E, tiles, groups, ...]`` (kbit's and NVFP4's) that
    rank ``rank``'s part of the intermediate features is cut from: for every expert, whole 16-row tiles around its
    gate and up rows and whole 256-column groups around its down columns -- what a rank must read of a saved
    checkpoint, and no more."""
    if style != "experts":
        raise ValueError(f"an expert block splits as 'experts' (its intermediate features), got style {style!r}")
    tn, gk = kbit_tiled.TILE_N, kbit_tiled.GROUP_K
    i, part = intermediate_dim, intermediate_dim // world
    lo, hi = rank * part, (rank + 1) * part
    gate_up = [(slice(None), slice(a // tn, -(-b // tn))) for a, b in ((lo, hi), (i + lo, i + hi))]
    down = [(slice(None), slice(None), slice(lo // gk, -(-hi // gk)))]
    return gate_up, down


def _check_block_args(mod: nn.Module, hidden_states, top_k_index, top_k_weights) -> None:
    if hidden_states.dim() != 2 or hidden_states.shape[1] != mod.hidden_dim:
        raise ValueError(f"hidden_states must be [tokens, {mod.hidden_dim}], got {tuple(hidden_states.shape)}")
    if top_k_index.shape != top_k_weights.shape or top_k_index.dim() != 2 or top_k_index.shape[0] != hidden_states.shape[0]:
        raise ValueError(f"top_k_index and top_k_weights must both be [tokens, k], got {tuple(top_k_index.shape)} "
                         f"and {tuple(top_k_weights.shape)} for {hidden_states.shape[0]} tokens")


#: kbit's routed down GEMV computes the SiLU activation itself from the gate|up output (``swiglu=True`` of
#: :func:`lowbit.ops.kbit_routed_gemv`), so that no activation kernel runs between the two GEMVs (False: ``act(gate) * up``
#: as its own step; comparisons). Only for an ``nn.SiLU`` / SiLU-activation ``act_fn``.
ROUTED_SWIGLU = True

#: under torch.compile, sum each token's k weighted rows as k pointwise terms (rank order) instead of a reduction
#: over k, so that inductor fuses the sum into the kernel that consumes it (the residual add and the next layer's
#: RMSNorm): one kernel per MoE layer less (False: the reduction, as in eager mode; comparisons)
COMBINE_TERMS = True


def _combine(rows: torch.Tensor, weights: torch.Tensor, tokens: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """``sum_j weights[t k + j] * rows[t k + j]`` per token t, in fp32, rounded once to ``dtype``. Eager: one
    reduction over k; compiled (:data:`COMBINE_TERMS`): the same sum as k terms added in rank order."""
    prod = (rows.float() * weights[:, None]).view(tokens, k, rows.shape[-1])
    if COMBINE_TERMS and torch.compiler.is_compiling():
        acc = prod[:, 0]
        for j in range(1, k):
            acc = acc + prod[:, j]
        return acc.to(dtype)
    return prod.sum(dim=1).to(dtype)


def moe_forward(mod: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up, down) -> torch.Tensor:
    """The expert block's computation around its two grouped products (any format): route, sort the
    (token, expert) rows by expert, ``gate_up(x, offsets)``, ``act(gate) * up``, ``down(x, offsets)``, weight each
    row, sum each token's k rows. ``mod``: ``num_experts``, ``hidden_dim``, ``intermediate_dim``, ``act_fn`` and
    the buffer ``expert_range`` (``arange(E + 1)``)."""
    _check_block_args(mod, hidden_states, top_k_index, top_k_weights)
    tokens, k = top_k_index.shape
    dtype = hidden_states.dtype
    ids = top_k_index.reshape(-1)
    # Sentinel ids (>= E, expert parallelism; negative ones too) go to the last expert with weight 0.
    valid = (ids >= 0) & (ids < mod.num_experts)
    weights = torch.where(valid, top_k_weights.reshape(-1), 0).to(torch.float32)
    ids = torch.where(valid, ids, mod.num_experts - 1)
    sorted_ids, perm = torch.sort(ids, stable=True)
    offsets = torch.searchsorted(sorted_ids, mod.expert_range.to(sorted_ids.dtype))
    x = hidden_states.contiguous().index_select(0, perm // k)
    gu = gate_up(x, offsets)
    inter = mod.act_fn(gu[:, :mod.intermediate_dim]) * gu[:, mod.intermediate_dim:]
    out = down(inter.contiguous(), offsets)
    unsorted = torch.empty_like(out).index_copy_(0, perm, out)  # a permutation: deterministic
    return _combine(unsorted, weights, tokens, k, dtype)


def moe_routed_forward(mod: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor, gate_up, down, down_swiglu=None) -> torch.Tensor:
    """:func:`moe_forward` without the sort: ``gate_up(x, ids, k)`` and ``down(x, ids, 1)`` take row r of
    their output from x row ``r // rows_per_x`` and expert ``ids[r]`` (the router's flattened top-k), so
    rows stay in (token, rank) order and each token's k rows are summed in place. Bit-identical to
    :func:`moe_forward` (each row meets the same weights in the same kernel; sentinel ids >= E give zero
    rows of weight 0). ``down_swiglu(gu, ids)``: down_proj of ``silu(gate) * up`` straight from gate|up's output,
    used where :data:`ROUTED_SWIGLU` and the activation is SiLU (the product rounded once, in fp32)."""
    _check_block_args(mod, hidden_states, top_k_index, top_k_weights)
    tokens, k = top_k_index.shape
    ids = top_k_index.reshape(-1).to(torch.int64).contiguous()
    gu = gate_up(hidden_states.contiguous(), ids, k)
    if down_swiglu is not None and ROUTED_SWIGLU and is_plain_silu(mod.act_fn):
        out = down_swiglu(gu, ids)
    else:
        inter = mod.act_fn(gu[:, :mod.intermediate_dim]) * gu[:, mod.intermediate_dim:]
        out = down(inter.contiguous(), ids, 1)
    weights = torch.where((ids >= 0) & (ids < mod.num_experts), top_k_weights.reshape(-1), 0).to(torch.float32)
    return _combine(out, weights, tokens, k, hidden_states.dtype)


def _quantize_stack(w: torch.Tensor, bits: int, codebook):
    """[E, N, K] -> (qweight, qabsmax, codebook, scales), a few experts at a time."""
    per = max(1, _QUANT_CHUNK_WEIGHTS // (w.shape[1] * w.shape[2]))
    parts = []
    for lo in range(0, w.shape[0], per):
        codes, absmax, codebook, scales = kbit.quantize_codes(w[lo:lo + per].detach(), bits, codebook)
        qw, qa = kbit_tiled.pack_codes(codes, absmax, bits)
        parts.append((qw, qa, scales))
        del codes
    return (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), codebook,
            torch.cat([p[2] for p in parts]))


def _stack_quantized(quantized: tuple, w: torch.Tensor, bits: int):
    """Stacked (codes [E, ...], absmax [E, ...], codebook, scales [E]) -> (qweight, qabsmax, codebook, scales),
    packed a few experts at a time."""
    codes_all, absmax_all, codebook, scales_all = quantized_codes(w, bits, quantized[2], quantized)
    if tuple(scales_all.shape) != (w.shape[0],):
        raise ValueError(f"quantized experts: scales must be [{w.shape[0]}], got {tuple(scales_all.shape)}")
    per = max(1, _QUANT_CHUNK_WEIGHTS // (w.shape[1] * w.shape[2]))
    parts = []
    for lo in range(0, w.shape[0], per):
        codes, absmax, scales = codes_all[lo:lo + per], absmax_all[lo:lo + per], scales_all[lo:lo + per]
        parts.append((*kbit_tiled.pack_codes(codes, absmax, bits), scales))
    return (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), codebook,
            torch.cat([p[2] for p in parts]))


class KbitMoeExperts(QuantizedModule):
    """E experts, each ``down(act(gate(x)) * up(x))``, with gate/up and down in kbit.

    Buffers: ``gate_up_{qweight,qabsmax,scales}`` (E stacked [2I, H] weights), ``down_{...}``
    (E stacked [H, I]), one shared ``codebook``. Build with :meth:`from_experts`.
    """

    k_multiple = kbit.BLOCK

    def __init__(self, num_experts: int, hidden_dim: int, intermediate_dim: int, bits: int = 4,
                 act_fn: nn.Module | None = None, *, device=None):
        super().__init__()
        self.bits = kbit.check_bits(bits)
        for name, v in (("num_experts", num_experts), ("hidden_dim", hidden_dim), ("intermediate_dim", intermediate_dim)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name, v in (("hidden_dim", hidden_dim), ("intermediate_dim", intermediate_dim)):
            if v % kbit.BLOCK:
                raise ValueError(f"kbit needs {name} % {kbit.BLOCK} == 0, got {v}")
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden_dim, intermediate_dim
        self.act_fn = act_fn if act_fn is not None else nn.SiLU()
        for prefix, n, k in (("gate_up", 2 * intermediate_dim, hidden_dim), ("down", hidden_dim, intermediate_dim)):
            t, g = kbit_tiled.tiled_shape(n, k)
            self.register_buffer(f"{prefix}_qweight", torch.zeros((num_experts, t, g, bits, 32, 4), dtype=torch.int32, device=device))
            self.register_buffer(f"{prefix}_qabsmax", torch.zeros((num_experts, t, g, 128), dtype=torch.uint8, device=device))
            self.register_buffer(f"{prefix}_scales", torch.ones((num_experts,), dtype=torch.float32, device=device))
        self.register_buffer("codebook", kbit.normal_float_codebook(bits).to(device))
        self.register_buffer("expert_range", torch.arange(num_experts + 1, device=device), persistent=False)
        self._launchers = None
        self._cpu_weights: dict = {}

    # -- checkpoints (lowbit.model.checkpoint) -----------------------------------------------
    def checkpoint_config(self) -> dict:
        return {"bits": self.bits, "num_experts": self.num_experts, "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim}

    @classmethod
    def from_checkpoint_config(cls, name: str, cfg: dict, old: nn.Module) -> "KbitMoeExperts":
        return cls(*saved_experts_shape(cls, cfg, old), bits=cfg["bits"], act_fn=old.act_fn, device="meta")

    def compact_pairs(self):
        return [(f"{p}_qweight", f"{p}_qabsmax", f"{p}_planes", f"{p}_absmax", *self._shape(p)) for p in ("gate_up", "down")]

    def compact_shapes(self, n: int, k_in: int):
        e = self.num_experts
        return (e, n, k_in // kbit.BLOCK, self.bits), (e, n, k_in // kbit.BLOCK)

    def to_compact(self, codes, scales, n: int, k_in: int):
        return kbit_tiled.unpack(codes, scales, self.bits, n, k_in)

    def from_compact(self, planes, absmax):
        return kbit_tiled.repack_in_chunks(planes, absmax, self.bits)

    def check_checkpoint_values(self, name: str, staged: dict) -> None:
        check_kbit_values(name, staged, ["gate_up_scales", "down_scales"])

    def install(self, model: nn.Module, name: str, device: torch.device | None = None) -> None:
        super().install(model, name, device)
        self._buffers["expert_range"] = torch.arange(self.num_experts + 1, device=device or self.codebook.device)

    def tensors_changed(self) -> None:
        self._launchers, self._cpu_weights = None, {}

    @classmethod
    def from_experts(cls, module: nn.Module, bits: int = 4, codebook: torch.Tensor | None = None,
                     quantized: dict | None = None) -> "KbitMoeExperts":
        """Quantize a transformers fused expert block (see :func:`fused_experts_layout`) on its device.

        All experts of both projections share one codebook: with ``codebook="fit"`` it is fitted on
        the first chunk of gate/up experts (``_QUANT_CHUNK_WEIGHTS``) and reused for the rest.
        ``quantized``: ``{"gate_up": (codes, absmax, codebook, scales), "down": (...)}``, the stacked
        results of a calibration (``[E, ...]``, one codebook for both) instead of rounding.
        """
        layout = fused_experts_layout(module)
        if layout is None:
            raise TypeError(f"{type(module).__name__} is not a fused expert block lowbit knows "
                            "(gate_up_proj [E, 2I, H], down_proj [E, H, I], act(gate) * up)")
        e, h, i = layout
        device = module.gate_up_proj.device
        mod = cls(e, h, i, bits, module.act_fn, device="meta")
        if quantized is None:
            gu = _quantize_stack(module.gate_up_proj, bits, codebook)
            dn = _quantize_stack(module.down_proj, bits, gu[2])
        else:
            gu, dn = (_stack_quantized(quantized[p], getattr(module, f"{p}_proj"), bits) for p in ("gate_up", "down"))
            if not torch.equal(gu[2], dn[2]):
                raise ValueError("quantized gate_up and down experts must share one codebook")
        mod._buffers["codebook"] = gu[2]
        mod.set_quantized("gate_up", *gu[:2], gu[3])
        mod.set_quantized("down", *dn[:2], dn[3])
        mod._buffers["expert_range"] = torch.arange(e + 1, device=device)
        return mod

    def set_quantized(self, prefix: str, qweight, qabsmax, scales) -> None:
        from .. import ops

        n, k = self._shape(prefix)
        ops.check_tiled_args(qweight, qabsmax, self.codebook, scales, self.bits, n, k, experts=self.num_experts)
        self._buffers.update({f"{prefix}_qweight": qweight, f"{prefix}_qabsmax": qabsmax, f"{prefix}_scales": scales})
        self._launchers, self._cpu_weights = None, {}

    def _shape(self, prefix: str) -> tuple[int, int]:
        if prefix == "gate_up":
            return 2 * self.intermediate_dim, self.hidden_dim
        return self.hidden_dim, self.intermediate_dim

    def _stack(self, prefix: str) -> dict:
        b = self._buffers
        return {"qweight": b[f"{prefix}_qweight"], "qabsmax": b[f"{prefix}_qabsmax"], "codebook": b["codebook"],
                "scales": b[f"{prefix}_scales"]}

    def _grouped(self, idx: int, prefix: str, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        n, k = self._shape(prefix)
        path = dispatch.grouped_path(x, self.num_experts)
        if path != "reference" and not torch.compiler.is_compiling():
            # launchers[path][idx]: made once per path and projection, remade when the buffers move
            launchers = self._launchers if self._launchers is not None else {}
            per = launchers.get(path)
            if per is None or per[idx] is None or per[idx].tensors[0] is not self._buffers[f"{prefix}_qweight"]:
                kind = "grouped" if path == "grouped_gemv" else "grouped_gemm"
                per = launchers[path] = [dispatch.eager_launcher(kind, self._stack(p), self.bits, *self._shape(p), x)
                                         for p in ("gate_up", "down")]
                self._launchers = launchers
            if per[idx] is not None:
                return per[idx](x, offsets)
        s = self._stack(prefix)
        if x.device.type == "cpu" and not torch.compiler.is_compiling():
            # CPU reference with the decoded stack kept (see KbitLinear): expert by expert, fp32.
            cached = self._cpu_weights.get(prefix)
            if cached is None or cached[0] is not s["qweight"]:
                cached = self._cpu_weights[prefix] = (s["qweight"], kbit_tiled.dequantize(
                    s["qweight"], s["qabsmax"], s["codebook"], s["scales"], self.bits, n, k))
            off = offsets.tolist()
            y = x.new_empty((x.shape[0], n))
            for e in range(self.num_experts):
                if off[e + 1] > off[e]:
                    y[off[e]:off[e + 1]] = (x[off[e]:off[e + 1]].float() @ cached[1][e].t()).to(x.dtype)
            return y
        return dispatch.kbit_grouped_op(x, offsets, s["qweight"], s["qabsmax"], s["codebook"], s["scales"],
                                        self.bits, n, k, check_offsets=False)  # forward built them: valid

    def _routed(self, idx: int, prefix: str, x: torch.Tensor, ids: torch.Tensor, rows_per_x: int,
                swiglu: bool = False) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            launchers = self._launchers if self._launchers is not None else {}
            per = launchers.get("routed")
            if per is None or per[idx] is None or per[idx].tensors[0] is not self._buffers[f"{prefix}_qweight"]:
                per = launchers["routed"] = [dispatch.eager_launcher("routed", self._stack(p), self.bits, *self._shape(p), x)
                                             for p in ("gate_up", "down")]
                self._launchers = launchers
            if per[idx] is not None:
                return per[idx](x, ids, rows_per_x, swiglu)
        s = self._stack(prefix)
        return ops.kbit_routed_gemv(x, ids, s["qweight"], s["qabsmax"], s["codebook"], s["scales"], self.bits,
                                    *self._shape(prefix), rows_per_x, swiglu)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if dispatch.moe_routed(hidden_states, top_k_index.numel(), self.num_experts):
            return moe_routed_forward(self, hidden_states, top_k_index, top_k_weights,
                                      lambda x, ids, d: self._routed(0, "gate_up", x, ids, d),
                                      lambda x, ids, d: self._routed(1, "down", x, ids, d),
                                      lambda gu, ids: self._routed(1, "down", gu, ids, 1, swiglu=True))
        return moe_forward(self, hidden_states, top_k_index, top_k_weights,
                           lambda x, offsets: self._grouped(0, "gate_up", x, offsets),
                           lambda x, offsets: self._grouped(1, "down", x, offsets))

    # -- tensor parallelism (transformers' "moe_tp_experts": every rank runs every expert on its slice of I)
    tp_experts = True

    def tp_shard(self, style: str, rank: int, world: int) -> "KbitMoeExperts":
        """Rank ``rank`` of ``world``'s part for tensor parallelism (``style="experts"``): every expert's
        intermediate features split in ``world`` equal parts of whole 32-element blocks -- gate and up rows
        ``[r I/world, (r+1) I/world)`` of each half, down's columns the same. The parts' outputs sum to the
        block's output (the caller all-reduces them); codebook and per-expert scales are shared."""
        lo, hi = expert_tp_range(self, style, rank, world, kbit.BLOCK)
        i, part = self.intermediate_dim, hi - lo
        new = type(self)(self.num_experts, self.hidden_dim, part, self.bits, self.act_fn, device="meta")
        for prefix, rows, cols in (("gate_up", torch.cat([torch.arange(lo, hi), torch.arange(i + lo, i + hi)]), None),
                                   ("down", None, (lo // kbit.BLOCK, hi // kbit.BLOCK))):
            b = self._buffers
            planes, absmax = self.to_compact(b[f"{prefix}_qweight"], b[f"{prefix}_qabsmax"], *self._shape(prefix))
            if rows is not None:
                rows = rows.to(planes.device)
                planes, absmax = planes[:, rows], absmax[:, rows]
            if cols is not None:
                planes, absmax = planes[:, :, cols[0]:cols[1]], absmax[:, :, cols[0]:cols[1]]
            new._buffers["codebook"] = self.codebook
            new.set_quantized(prefix, *new.from_compact(planes.contiguous(), absmax.contiguous()), b[f"{prefix}_scales"])
        new._buffers["expert_range"] = self.expert_range
        new.train(self.training)
        new.tp_part = ("experts", rank, world)
        return new

    def tp_read_slices(self, style: str, rank: int, world: int) -> dict[str, list[tuple]]:
        """The index ranges of the tiled stacks that rank ``rank``'s part (:meth:`tp_shard`) is cut from: for
        every expert, whole 16-row tiles around its gate and up rows and whole 256-column groups around its
        down columns -- what a rank must read of a saved checkpoint, and no more."""
        gate_up, down = tiled_expert_slices(style, self.intermediate_dim, rank, world)
        return {"gate_up_qweight": gate_up, "gate_up_qabsmax": gate_up, "down_qweight": down, "down_qabsmax": down}

    def dequantize(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [E, 2I, H], down [E, H, I]) as the reference decodes them."""
        out = []
        for prefix in ("gate_up", "down"):
            s = self._stack(prefix)
            out.append(kbit_tiled.dequantize(s["qweight"], s["qabsmax"], s["codebook"], s["scales"], self.bits,
                                             *self._shape(prefix), dtype))
        return out[0], out[1]

    def format_bytes(self) -> int:
        w = self.num_experts * 3 * self.hidden_dim * self.intermediate_dim
        return w * self.bits // 8 + w // 32

    def _apply(self, fn, recurse=True):
        apply_keeping_dtypes(self, super()._apply, fn, recurse, ("codebook", "gate_up_scales", "down_scales"))
        self._launchers = None
        self._cpu_weights = {}
        return self

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, bits={self.bits}")


KbitLinear.experts_class = KbitMoeExperts
