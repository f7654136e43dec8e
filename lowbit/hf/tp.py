"""Tensor parallelism of lowbit modules inside transformers' own (``from_pretrained(...,
distributed_config=DistributedConfig(tp_plan="auto", tp_size=N))`` under ``torchrun``).

transformers shards a model while it loads: each ``colwise`` / ``rowwise`` entry of the model's TP plan
makes its linear's parameters DTensor placeholders, so that every rank reads only its slice, and wraps the
linear's forward (input and output layouts, the all-reduce after a row split). A lowbit weight cannot be
quantized slice by slice: its tensor scale (and, fused, its q|k|v rows) come from the whole weight. So the
quantizer rewrites those styles (and the LM head's gathering colwise) to ``lowbit_<style>`` (:func:`plan_styles`),
which act exactly like transformers' for every module lowbit does not take, and for the ones it takes only
record the style: the weight arrives whole, is quantized, and the quantized module is split
(:meth:`lowbit.nn.QuantizedModule.tp_shard`: rows for colwise, whole blocks of columns for rowwise; a
fused module splits each projection; codebook and scales shared). Each rank then keeps its part and
transformers' own style wraps it (:func:`place`), in its local-tensor path: the forward is lowbit's kernel
on the local part, and a row split's partial outputs are summed by the style's all-reduce.

A model quantized in one process (``lowbit generate`` under ``torchrun``) is split after the fact by
:func:`shard_model`, with the same plan and the same :func:`place`.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from transformers.distributed.tensor_parallel import (
    ALL_PARALLEL_STYLES,
    ColwiseParallel,
    ParallelInterface,
    RowwiseParallel,
    TensorParallelLayer,
)

from ..nn import QuantizedModule
from ..nn.base import tp_split_problem
from ..nn.fused import FusedParts, install
from .head import LowbitDenseHead, use_dense_head

#: transformers' styles that lowbit takes over for the modules it quantizes, by the split they make (the
#: gathering ones keep transformers' output all-gather: the LM head's). An MoE expert block ("moe_tp_experts"
#: on the block, "packed_colwise" / "rowwise" on its gate_up / down parameters) splits every expert's
#: intermediate features; its partial outputs are summed over the ranks (:func:`place`).
SPLITS = {"colwise": "colwise", "colwise_gather_output": "colwise", "colwise_rep": "colwise", "rowwise": "rowwise",
          "moe_tp_experts": "experts", "packed_colwise": "experts"}
#: the styles a quantized linear (a module lowbit quantizes, not an expert block) may have
LINEAR_STYLES = ("colwise", "colwise_gather_output", "colwise_rep", "rowwise")
PREFIX = "lowbit_"


class LowbitStyle(TensorParallelLayer):
    """transformers' style ``base`` for modules lowbit does not take; for the ones it does (marked
    ``_lowbit_tp_managed`` = the format's block size before the model is distributed), it checks that the
    split fits the format's blocks and records ``(base, mesh)`` in ``_lowbit_tp``."""

    def __init__(self, base: str):
        self.base_name = base

    @property
    def base(self) -> TensorParallelLayer:
        return ALL_PARALLEL_STYLES[self.base_name]

    @staticmethod
    def _ours(module: nn.Module) -> bool:
        return getattr(module, "_lowbit_tp_managed", False)

    def validate_param(self, module, param, mesh, parameter_name=None):
        if not self._ours(module):
            self.base.validate_param(module, param, mesh, parameter_name)

    def shard_param(self, module, param, mesh):
        if not self._ours(module):  # ours load whole: quantized first, split after
            self.base.shard_param(module, param, mesh)

    def install_forward(self, module, mesh):
        if self._ours(module):
            check_split(module, SPLITS[self.base_name], mesh.size(), module._lowbit_tp_managed)
            module._lowbit_tp = (self.base_name, mesh)
            return module
        return self.base.install_forward(module, mesh)


def check_split(module: nn.Module, split: str, world: int, k_multiple: int) -> None:
    """Refuse, before anything loads, a split that a module's quantized weight cannot take (the rule
    QuantizedModule.tp_shard applies after)."""
    if split == "experts":  # a transformers expert block or lowbit's: intermediate_dim
        problem = tp_split_problem(split, [], module.intermediate_dim, world, k_multiple)
    else:
        problem = tp_split_problem(split, [module.out_features], module.in_features, world, k_multiple)
    if problem:
        raise ValueError(f"lowbit: {problem}")


def register_styles() -> None:
    for base in SPLITS:
        if PREFIX + base not in ParallelInterface._global_mapping:
            ParallelInterface.register(PREFIX + base, LowbitStyle(base))


def plan_styles(plan: dict | None) -> dict | None:
    """A TP plan with lowbit's styles in place of the ones it takes over."""
    if not plan:
        return plan
    return {k: PREFIX + v if v in SPLITS else v for k, v in plan.items()}


def original_styles(plan: dict | None) -> dict | None:
    if not plan:
        return plan
    return {k: v.removeprefix(PREFIX) if v.removeprefix(PREFIX) in SPLITS else v for k, v in plan.items()}


def take_over(model: nn.Module, names: list[str], experts: list[str] = ()) -> None:
    """Before transformers distributes ``model``: its TP plan (and a plan the user passed in its
    DistributedConfig, which replaces it) gets lowbit's styles; a linear (``names``) or expert block
    (``experts``) lowbit quantizes whose style lowbit cannot split is refused now, not after loading."""
    dist_cfg = getattr(model.config, "distributed_config", None)
    if getattr(dist_cfg, "tp_size", 1) <= 1:
        return
    user_plan = getattr(dist_cfg, "tp_plan", None)
    plan = original_styles(user_plan if isinstance(user_plan, dict) else dict(getattr(model, "_tp_plan", None) or {}))
    for name in [*names, *experts]:
        style = _style_of(name, plan)
        allowed = ("moe_tp_experts",) if name in experts else LINEAR_STYLES
        if style is not None and style not in allowed:
            raise NotImplementedError(f"lowbit: {name} is split as {style!r} by the tensor-parallel plan, which lowbit "
                                      f"does not split ({', '.join(allowed)}); leave it unquantized: "
                                      f"LowbitConfig(skip=[...])")
    if isinstance(user_plan, dict):
        dist_cfg.tp_plan = plan_styles(user_plan)
    model._tp_plan = plan_styles(getattr(model, "_tp_plan", None) or {})  # transformers' instance plan


def planned_split(model: nn.Module, name: str, mod: nn.Module) -> str | None:
    """The split ("colwise", "rowwise", "experts") the TP plan gives lowbit module ``mod`` installed as ``name``
    (a fused module: its parts' common style), or None. Read after :func:`take_over`."""
    dist_cfg = getattr(model.config, "distributed_config", None)
    user_plan = getattr(dist_cfg, "tp_plan", None)
    plan = original_styles(user_plan if isinstance(user_plan, dict) else dict(getattr(model, "_tp_plan", None) or {}))
    if isinstance(mod, FusedParts):
        parent = name.rpartition(".")[0]
        styles = {_style_of(f"{parent}.{p}" if parent else p, plan) for p in mod.part_names}
        style = styles.pop() if len(styles) == 1 else None
    else:
        style = _style_of(name, plan)
    return SPLITS.get(style)


def recorded(modules: list[nn.Module], what: str) -> tuple[str, object] | None:
    """The one ``(style, mesh)`` the TP plan gave ``modules`` (a fused group's members), or None."""
    infos = {getattr(m, "_lowbit_tp", None) for m in modules}
    if len(infos) > 1:
        raise ValueError(f"lowbit: the tensor-parallel plan splits the members of {what} differently "
                         f"({sorted(str(i[0]) if i else 'none' for i in infos)}); quantize them apart: LowbitConfig(fuse=False)")
    return infos.pop()


# ---- the all-reduce of a row split's partial outputs (o_proj, down_proj, expert blocks)

#: ``auto`` (the default): ``symm-mem`` where every rank of the group is on one host and each GPU can read its
#: peers' memory directly (NVLink or PCIe peer-to-peer), else ``nccl``; decided once per process group, with its
#: ranks (:func:`resolve_allreduce`). On 2 x H100 over NVLink, compiled Llama-3-70B decode ran 3-10% faster with
#: symm-mem than with NCCL at batch 1 and 8% at batch 4 (benchmarks/journal/2026-11-26_tp_fused_layers.md).
#: ``nccl``: the process group's own ``all_reduce``, in place (NCCL on GPUs; gloo on the CPU);
#: ``symm-mem``: torch's symmetric-memory one-shot all-reduce (each rank copies its partial sum into a buffer its
#: peers can read over NVLink / P2P, then reads and adds theirs: one kernel with a barrier at each end, no NCCL
#: protocol; CUDA only; fp16 tensors, which it does not sum, sizes that are not whole 16-byte vectors and messages
#: over :data:`SYMM_MEM_MAX_BYTES` go to NCCL); ``dtensor``: transformers' own (a DTensor redistribute
#: from Partial to Replicate).
ALLREDUCE_KINDS = ("auto", "nccl", "symm-mem", "dtensor")
#: the symmetric buffer's size per process group and dtype: a decode step's partial outputs (batch x hidden) are
#: kilobytes; a prefill's larger ones take NCCL, which is bandwidth-efficient there
SYMM_MEM_MAX_BYTES = 4 << 20
_allreduce = os.environ.get("LOWBIT_TP_ALLREDUCE", "auto")
_auto: dict[str, str] = {}  # process group name -> what ``auto`` chose for it
_symm_buffers: dict[tuple, torch.Tensor] = {}


def set_allreduce(kind: str) -> None:
    """Choose how lowbit's row-split modules sum their partial outputs (:data:`ALLREDUCE_KINDS`; default
    ``auto``, or ``$LOWBIT_TP_ALLREDUCE``). Read at every call, so it can change between decodes (not inside a
    captured CUDA graph, which keeps the kernels it captured)."""
    global _allreduce
    if kind not in ALLREDUCE_KINDS:
        raise ValueError(f"the tensor-parallel all-reduce must be one of {', '.join(ALLREDUCE_KINDS)}, got {kind!r}")
    _allreduce = kind


def allreduce_kind() -> str:
    if _allreduce not in ALLREDUCE_KINDS:  # a bad $LOWBIT_TP_ALLREDUCE: said at the first use
        raise ValueError(f"LOWBIT_TP_ALLREDUCE must be one of {', '.join(ALLREDUCE_KINDS)}, got {_allreduce!r}")
    return _allreduce


def choose_allreduce(ranks: list[dict]) -> str:
    """What ``auto`` means for a group whose ranks report ``ranks`` (one dict each: ``host``, ``cuda``: the rank
    runs on a GPU, ``symm_mem``: this torch has the one-shot kernel, ``p2p``: its GPU can read every peer's):
    ``symm-mem`` when there are peers, every rank says yes to all three and all share one host, else ``nccl``
    (one rank alone has nothing to exchange: no symmetric buffer for it)."""
    one_host = len({r["host"] for r in ranks}) == 1
    if len(ranks) > 1 and one_host and all(r["cuda"] and r["symm_mem"] and r["p2p"] for r in ranks):
        return "symm-mem"
    return "nccl"


def _symm_mem_available() -> bool:
    try:
        import torch.distributed._symmetric_memory
    except ImportError:
        return False
    return hasattr(getattr(torch.ops, "symm_mem", None), "one_shot_all_reduce_copy")


def resolve_allreduce(group, device: torch.device) -> str:
    """The kind lowbit's all-reduce uses on ``group``: the chosen one, or for ``auto`` what
    :func:`choose_allreduce` says of the group's ranks. The first call for a group is a collective (two
    ``all_gather_object``: the ranks' GPUs by UUID, then what each can reach), so every rank must make it, in the
    same order: :func:`shard_model` does, and otherwise the first all-reduce (the model's first forward)."""
    kind = allreduce_kind()
    if kind != "auto":
        return kind
    if group.group_name not in _auto:
        import socket

        import torch.distributed as dist

        cuda = device.type == "cuda" and torch.cuda.is_available()
        me = torch.cuda.get_device_properties(device).uuid if cuda else None
        ids: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(ids, str(me) if me is not None else None, group=group)
        p2p = cuda
        if cuda:  # the peers' GPUs among those this process sees, each readable from ours
            seen = {str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())}
            here = device.index if device.index is not None else torch.cuda.current_device()
            for u in ids:
                if u == str(me):
                    continue
                p2p = p2p and u in seen and torch.cuda.can_device_access_peer(here, seen[u])
        facts = {"host": socket.gethostname(), "cuda": cuda, "symm_mem": cuda and _symm_mem_available(), "p2p": p2p}
        ranks: list = [None] * len(ids)
        dist.all_gather_object(ranks, facts, group=group)
        _auto[group.group_name] = choose_allreduce(ranks)
    return _auto[group.group_name]


def _symm_buffer(group, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """This rank's symmetric buffer for ``group`` (allocated and exchanged with the peers on first use: a
    collective, so every rank must reach it in the same order -- the model's first forward does)."""
    key = (group.group_name, device, dtype)
    if key not in _symm_buffers:
        import warnings

        import torch.distributed._symmetric_memory as symm_mem

        # NVLink multicast stays off (the one-shot kernel needs none)
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older torch, deprecated (a no-op) by newer
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(group.group_name)
        buf = symm_mem.empty(SYMM_MEM_MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(buf, group.group_name)
        _symm_buffers[key] = buf
        quiet_inductor_symm_mem()
    return _symm_buffers[key]


class _DropMessage:
    """A logging filter that drops records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def filter(self, record) -> bool:
        return not record.getMessage().startswith(self.prefix)


#: what torch.compile's lowering of the symm-mem all-reduce logs at every call site when its buffer is not one the
#: compiled graph allocates. lowbit's is allocated and exchanged once, outside the graph (:func:`_symm_buffer`), and
#: the op runs on it as written, so the message is expected: a compiled 80-layer decode step printed it 160 times
#: per rank and compile.
_SYMM_MEM_NOTE = "Failed to realize the input as a symmetric memory buffer"


def quiet_inductor_symm_mem() -> None:
    """Drop inductor's :data:`_SYMM_MEM_NOTE` warnings (only those; the logger's other messages pass)."""
    import logging

    log = logging.getLogger("torch._inductor.comm_lowering")
    if not any(isinstance(f, _DropMessage) for f in log.filters):
        log.addFilter(_DropMessage(_SYMM_MEM_NOTE))


def all_reduce(t: torch.Tensor, group, kind: str | None = None) -> torch.Tensor:
    """The sum of ``t`` over ``group`` by :func:`allreduce_kind` (``auto``: :func:`resolve_allreduce`; ``nccl`` or
    ``symm-mem``; ``dtensor`` is a style's business, here it means ``nccl``). Returns the sum: ``t`` itself
    (reduced in place) or a new tensor."""
    import torch.distributed as dist

    kind = kind or allreduce_kind()
    if kind == "auto":  # decided once per group, outside compiled code and graph capture (else NCCL, on every rank)
        kind = _auto.get(group.group_name)
        if kind is None:
            capturing = t.is_cuda and torch.cuda.is_current_stream_capturing()
            kind = "nccl" if torch.compiler.is_compiling() or capturing else resolve_allreduce(group, t.device)
    if kind == "symm-mem":
        if t.device.type != "cuda":
            raise ValueError(f"the symm-mem all-reduce needs CUDA tensors, got one on {t.device}; use 'nccl'")
        nbytes = t.numel() * t.element_size()
        # The kernel takes 16-byte vectors when the buffer and the input both allow them, and refuses a mismatch.
        # Allocations are 512-byte aligned, so the storage offset says it. torch.compile traces neither data_ptr()
        # nor (torch 2.11) storage_offset(): compiled, the input is taken as what the row splits pass, a module's
        # fresh output (offset 0); a view into the middle of a tensor would make the kernel raise, not misread.
        offset_ok = torch.compiler.is_compiling() or (t.storage_offset() * t.element_size()) % 16 == 0
        aligned = nbytes % 16 == 0 and offset_ok
        small = nbytes <= SYMM_MEM_MAX_BYTES
        if t.is_contiguous() and t.dtype in (torch.bfloat16, torch.float32) and aligned and small:
            buf = _symm_buffer(group, t.device, t.dtype)[:t.numel()].view(t.shape)
            return torch.ops.symm_mem.one_shot_all_reduce_copy(buf, t, "sum", group.group_name)
    dist.all_reduce(t, group=group)
    return t


def _group(mesh):
    return mesh.get_group() if mesh.ndim == 1 else mesh.get_group("tp")


class ReducedRowwise(RowwiseParallel):
    """transformers' ``rowwise`` style for a lowbit part run on local tensors, whose partial output is summed by
    :func:`all_reduce` (the kind chosen with :func:`set_allreduce`; ``dtensor``: transformers' own path); the
    bias, kept whole on every rank, is added once after the sum, as transformers does."""

    def __init__(self):
        super().__init__(input_layouts=Shard(-1), output_layouts=Replicate())

    def transform_output_post_forward(self, module, output, mesh):
        if allreduce_kind() == "dtensor" or isinstance(output, DTensor) or not self.should_use_local_tensors(module):
            return super().transform_output_post_forward(module, output, mesh)
        output = all_reduce(output, _group(mesh))
        bias = module._parameters.get("bias")
        if bias is not None:
            output = output + (bias.to_local() if isinstance(bias, DTensor) else bias)
        return output


class GatheredColwise(ColwiseParallel):
    """transformers' ``colwise_gather_output`` style (the LM head) for a part run on local tensors, whose output
    columns are gathered by the process group's ``all_gather`` (CUDA-graph capturable), unless the all-reduce
    kind is ``dtensor`` (transformers' own redistribute)."""

    def __init__(self):
        super().__init__(output_layouts=Replicate(), use_local_output=True)

    def transform_output_post_forward(self, module, output, mesh):
        import torch.distributed as dist

        if allreduce_kind() == "dtensor" or isinstance(output, DTensor) or not self.should_use_local_tensors(module):
            return super().transform_output_post_forward(module, output, mesh)
        output = output.contiguous()
        parts = [torch.empty_like(output) for _ in range(mesh.size())]
        dist.all_gather(parts, output, group=_group(mesh))
        return torch.cat(parts, dim=-1)


def _style(name: str) -> TensorParallelLayer:
    """The style that wraps a local part: lowbit's for the row split and the gathering column split (their
    collectives are the chosen kind's), transformers' for the rest."""
    if name == "rowwise":
        return ReducedRowwise()
    if name == "colwise_gather_output":
        return GatheredColwise()
    return ALL_PARALLEL_STYLES[name]


def place(new: QuantizedModule, slots: list[tuple[nn.Module, str]], style: str, mesh) -> QuantizedModule:
    """Split ``new`` (installed in ``slots``: (parent, child name); a fused module: (parent, fused name)) for this
    rank, put the part in its place, and wrap what the model calls (the module, or each projection of a fused
    one) with transformers' style, in its local path."""
    part = new.tp_shard(SPLITS[style], mesh.get_local_rank(), mesh.size())
    if SPLITS[style] == "experts":
        # transformers' expert style sums the ranks' outputs only for DTensor parameters; lowbit's are local
        for parent, cname in slots:
            setattr(parent, cname, part)
        part.register_forward_hook(_sum_over_ranks(mesh))
        return part
    base = _style(style)
    if isinstance(new, FusedParts):
        (parent, _), = slots
        install(parent, new.part_names, part)
        called = [getattr(parent, n) for n in new.part_names]
    else:
        for parent, cname in slots:
            setattr(parent, cname, part)
        called = [part]
    for m in called:
        m._hf_quantized_needs_local_tp = True
        base.install_forward(m, mesh)
        m._lowbit_tp_local = LocalSplit(style, _group(mesh), mesh.get_local_rank(), m.forward)
    return part


@dataclass(frozen=True, eq=False)
class LocalSplit:
    """A lowbit part that :func:`place` wrapped: transformers' ``style`` (``colwise``, ``rowwise``, ...), the process
    ``group`` a row split's partial outputs are summed over, this ``rank`` in it, and the ``forward`` the style
    installed. The fused decoder layer (:mod:`lowbit.hf.layers`) stands in for that forward (the part's kernel on local
    tensors; :func:`all_reduce` after a row split) only while it is still the module's forward."""

    style: str
    group: object
    rank: int
    forward: object


def _sum_over_ranks(mesh):
    """A forward hook that sums a module's output over ``mesh`` (:func:`all_reduce`): an expert block's partial
    sums."""
    group = _group(mesh)

    def hook(module, args, output):
        return all_reduce(output, group, "nccl" if allreduce_kind() == "dtensor" else None)

    return hook


def _style_of(name: str, plan: dict) -> str | None:
    """The TP plan's style for module ``name`` (layer numbers match ``*``, as transformers matches them)."""
    return plan.get(re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name))


def shard_model(model: nn.Module, mesh) -> tuple[int, int]:
    """Split, for this rank of ``mesh``, every lowbit module of a quantized model that the model's TP plan
    splits colwise or rowwise, every kbit expert block it splits as ``moe_tp_experts`` (:func:`place`), and every
    plain ``nn.Linear`` left unquantized that the plan splits colwise or rowwise into equal parts (an LM head kept
    in bf16, also one a decode already switched to lowbit's dense GEMV: its vocabulary rows, the logits gathered);
    everything else stays whole on every rank (replicated: correct, not smaller). A bf16/fp16 head on a GPU is
    first switched to lowbit's dense GEMV (:func:`lowbit.hf.head.use_dense_head`, as a decode would), so that its
    slice keeps it. Also settles what the ``auto`` all-reduce means on the mesh (:func:`resolve_allreduce`).
    Returns how many (quantized modules, plain linears) were split."""
    plan = original_styles(dict(getattr(model, "tp_plan", None) or {}))
    # A bf16 head on a GPU decodes through lowbit's dense GEMV (greedy_decode switches it), but a split head keeps
    # its TP forward and could no longer be switched: switch it first, and its slice keeps the class.
    use_dense_head(model)
    todo, plain = [], []
    for name, mod in model.named_modules():
        parent_name, _, child = name.rpartition(".")
        parent = (model.get_submodule(parent_name) if parent_name else model) if name else None
        if isinstance(mod, FusedParts):
            styles = {_style_of(f"{parent_name}.{p}" if parent_name else p, plan) for p in mod.part_names}
            if styles & set(SPLITS) and len(styles) > 1:
                raise ValueError(f"lowbit: the tensor-parallel plan splits the parts of {name} differently ({styles}); "
                                 "quantize them apart (fuse=False)")
            style = styles.pop()
        elif isinstance(mod, QuantizedModule):
            style = _style_of(name, plan)
        elif type(mod) in (nn.Linear, LowbitDenseHead) and _style_of(name, plan) in LINEAR_STYLES:
            style = _style_of(name, plan)
            n = mod.out_features if SPLITS[style] == "colwise" else mod.in_features
            if n % mesh.size() == 0:  # else it stays whole (a vocabulary of 32001 on 2 ranks)
                plain.append((mod, parent, child, style))
            continue
        else:
            continue
        if style in SPLITS:
            allowed = ("moe_tp_experts",) if hasattr(mod, "num_experts") else LINEAR_STYLES
            if style not in allowed or (style == "moe_tp_experts" and not mod.tp_experts):
                raise NotImplementedError(f"lowbit: {name} ({type(mod).__name__}) is split as {style!r} by the "
                                          "tensor-parallel plan, which lowbit does not split for it")
            todo.append((mod, parent, child, style))
    with torch.no_grad():
        for mod, parent, child, style in todo:
            place(mod, [(parent, child)], style, mesh)
        for lin, parent, child, style in plain:
            _place_linear(lin, parent, child, style, mesh)
    if mesh.size() > 1:  # what ``auto`` means here, decided now with every rank (a collective), not mid-forward
        cuda = mesh.device_type == "cuda" and torch.cuda.is_available()
        here = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        resolve_allreduce(_group(mesh), here)
    return len(todo), len(plain)


def localize_head(model: nn.Module) -> bool:
    """Give a head that transformers split while loading (``from_pretrained(..., distributed_config=...)``) the
    form :func:`shard_model` leaves: this rank's vocabulary rows as a local :class:`~lowbit.hf.head.LowbitDenseHead`
    under lowbit's gathering style. transformers' head is a ``Linear`` whose weight is a DTensor (``Shard(0)`` over
    a 1-D mesh) with a forward of its own, which :func:`~lowbit.hf.head.use_dense_head` must refuse, so a decode
    would run it through cuBLAS. A split head kept that way cost `lowbit generate` ~20% on Llama-3-70B shapes
    (benchmarks/journal/2026-11-26_tp_auto_allreduce.md). Only an unbiased fp16/bf16 GPU head under the plan's
    ``colwise_gather_output``, not tied to the input embeddings, split into equal parts; returns whether the
    model's head is now local."""
    from .head import refusal

    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not nn.Linear or head.bias is not None or head._forward_hooks or head._forward_pre_hooks:
        return False  # (a replaced module would drop its hooks)
    w = head.weight.data
    if not isinstance(w, DTensor) or w.device_mesh.ndim != 1 or tuple(w.placements) != (Shard(0),):
        return False
    if w.shape[0] % w.device_mesh.size():  # uneven rows: the gather wants equal parts (transformers refuses them too)
        return False
    inputs = getattr(model, "get_input_embeddings", lambda: None)()
    if inputs is not None and getattr(inputs, "weight", None) is head.weight:
        return False
    name = next(n for n, m in model.named_modules() if m is head)
    if _style_of(name, original_styles(dict(getattr(model, "tp_plan", None) or {}))) != "colwise_gather_output":
        return False
    new = _local_linear(nn.Linear, w.to_local(), None)
    if refusal(new) is not None:
        return False
    new.__class__ = LowbitDenseHead
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    _style("colwise_gather_output").install_forward(new, w.device_mesh)
    return True


def _local_linear(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A ``cls`` (``nn.Linear`` or a subclass) holding this rank's ``weight`` (and ``bias``) as plain local tensors,
    marked for the local-tensor path of transformers' styles; not yet wrapped by one."""
    new = cls(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    new.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    if bias is not None:
        new.bias = nn.Parameter(bias.clone(), requires_grad=False)
    new._hf_quantized_needs_local_tp = True
    return new


def _place_linear(lin: nn.Linear, parent: nn.Module, child: str, style: str, mesh) -> None:
    """Replace a plain ``nn.Linear`` (or :class:`~lowbit.hf.head.LowbitDenseHead`) by this rank's slice (colwise:
    output rows, rowwise: input columns, the bias whole) under transformers' style in its local-tensor path (as
    :func:`place` does for lowbit's parts)."""
    rank, world = mesh.get_local_rank(), mesh.size()
    split = SPLITS[style]
    part = (lin.out_features if split == "colwise" else lin.in_features) // world
    sl = slice(rank * part, (rank + 1) * part)
    w = lin.weight[sl] if split == "colwise" else lin.weight[:, sl]
    bias = None if lin.bias is None else lin.bias[sl] if split == "colwise" else lin.bias
    # the same class: a head that decodes through lowbit's dense GEMV keeps doing so on its slice
    new = _local_linear(type(lin), w, bias)
    setattr(parent, child, new)
    _style(style).install_forward(new, mesh)


@contextlib.contextmanager
def emulated_row_split(model: nn.Module, world: int):
    """Inside the block, every quantized linear that the model's TP plan splits rowwise computes, on its own
    device, the sum of its ``world`` parts (:meth:`~lowbit.nn.QuantizedModule.tp_shard`), each rounded to the
    activation dtype and added in rank order, as a row split's all-reduce adds them: what the summation order
    alone does to a model's outputs, in one process. Yields how many modules it split."""
    plan = original_styles(dict(getattr(model, "tp_plan", None) or {}))
    changed = []
    for name, mod in model.named_modules():
        if isinstance(mod, QuantizedModule) and not isinstance(mod, FusedParts) and _style_of(name, plan) == "rowwise":
            parts = [mod.tp_shard("rowwise", r, world) for r in range(world)]
            k = mod.in_features // world

            def forward(x, parts=parts, k=k):
                out = parts[0](x[..., :k])
                for r in range(1, len(parts)):
                    out = out + parts[r](x[..., r * k:(r + 1) * k])
                return out

            mod.forward = forward
            changed.append(mod)
    try:
        yield len(changed)
    finally:
        for mod in changed:
            del mod.forward  # the class's forward again


def launched_world() -> int:
    """Processes started by torchrun (WORLD_SIZE), 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup(device_type: str):
    """This process's device and a 1-D mesh over all ranks (NCCL on GPUs, gloo on CPUs), initializing the
    process group from torchrun's environment if nobody did."""
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():  # on GPUs bound to this rank's device (NCCL need not guess it)
        if device_type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return device, dist.init_device_mesh(device.type, (dist.get_world_size(),))


def teardown() -> None:
    """End the process group (generate's, under torchrun). A barrier first: every rank's collectives are
    finished before any rank destroys the group. Without it a gloo rank could be torn down with work still
    queued on its worker threads, and at exit that aborted ("terminate called without an active exception",
    seen once in the CPU suite)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
