"""Calibrated quantization: GPTQ over a whole model, one decoder block at a time.

:func:`calibrate` is what ``quantize_model(..., method="gptq")`` runs. It holds no per-format code:
the format's module class names its column quantizer (``QuantizedModule.column_quantizer``) and
builds itself from that quantizer's result.

1. The calibration ids run through the embeddings; each decoder block's ``forward`` is replaced for
   that one pass by a stub that records its arguments (the hidden states of block 0, and each block's
   masks / position embeddings, which differ between block types in some models) and stops the model
   at the last block. Nothing else of the model runs.
2. Block by block: forward hooks on the layers to quantize accumulate ``H = 2 X^T X / n`` in fp32 (one
   H per distinct input: q/k/v or gate/up read the same tensor and share it); MoE expert blocks get one
   H per expert from the tokens routed to it (and for ``down`` the expert's own intermediate). Each
   layer is then quantized by :func:`lowbit.model.gptq.gptq` (experts: a chunk of them per
   :func:`~lowbit.model.gptq.gptq_stack` walk) and replaced by its quantized module, and the block runs
   again so the next block sees the outputs of this quantized one. Only one block's activations are
   held (updated in place). ``GptqOptions.true_sequential`` instead quantizes the layers reading the
   block's first input, runs the block again, and so on (q/k/v, o, gate/up, down).
3. Layers outside the decoder blocks (an ``lm_head`` that ``bits_for`` asks for) are rounded to nearest
   and listed in the report.

Experts routed fewer than ``min_expert_tokens`` calibration tokens use the Hessian pooled over all the
block's experts (every routed token) instead of their own, and are listed in the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..formats.kbit import rotation as kbit_rotation
from . import gptq as gptq_mod
from .calibration_data import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN


#: What ``lowbit generate --method gptq`` adds where its command line does not say, per (format, bits):
#: measured best on the default model (benchmarks/journal/2026-11-24_gptq_calibration.md, KL over 1,024
#: eval tokens): kbit3 needs the fitted codebook and the block-32 rotation to reach RTN kbit4's KL
#: (0.43 -> 0.211), kbit2 also a second codebook round (7.07 -> 0.927). The rotation costs decode
#: speed (about 8% at batch 1 on Llama-3-8B shapes), so 4-5 bits, already good without it, go without.
GPTQ_RECIPES = {("kbit", 2): {"codebook": "fit", "rotation": 32, "codebook_rounds": 2},
                ("kbit", 3): {"codebook": "fit", "rotation": 32}}


def gptq_recipe(fmt: str, bits: int) -> dict:
    """The measured GPTQ settings for ``fmt`` at ``bits`` (keys ``codebook``, ``rotation``,
    ``codebook_rounds``; empty where the plain defaults are best)."""
    return dict(GPTQ_RECIPES.get((fmt, bits), {}))


@dataclass
class GptqOptions:
    """GPTQ's settings (``quantize_model(..., method="gptq", gptq=GptqOptions(...))``)."""

    damp: float = 0.01             # added to H's diagonal, as a fraction of its mean
    block_size: int = 128          # columns updated eagerly; the rest once per block
    act_order: bool = True         # columns by decreasing H diagonal, block scales fixed beforehand
    samples: int = DEFAULT_SAMPLES  # windows cut from calibration text
    seq_len: int = DEFAULT_SEQ_LEN  # tokens per window
    batch_tokens: int = 8192       # tokens per forward through a block
    min_expert_tokens: int = 32    # an expert routed fewer calibration tokens uses its block's pooled H
    scale_search: int = 0          # > 1: each block scale the best of this many candidates (absmax .. 0.6 absmax)
    codebook_rounds: int = 1       # codebook="fit": GPTQ runs again with the codebook refitted to its targets
    true_sequential: bool = False  # within a block, each group of layers sees the quantized ones before it

    def check(self) -> None:
        if not (isinstance(self.damp, (int, float)) and 0 <= self.damp < 1):
            raise ValueError(f"damp must be in [0, 1), got {self.damp!r}")
        for name in ("block_size", "samples", "seq_len", "batch_tokens", "min_expert_tokens", "scale_search",
                     "codebook_rounds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name in ("min_expert_tokens", "scale_search") else 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")


@dataclass
class CalibrationInfo:
    """What the calibration did (``QuantizeReport.calibration``)."""

    method: str
    data: str                                   # the text / ids and how many tokens
    options: GptqOptions
    seconds: float = 0.0
    peak_memory: int | None = None              # bytes, CUDA (None on the CPU)
    blocks: int = 0
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (layer, what it got instead)

    def summary(self) -> str:
        peak = f", peak GPU memory {self.peak_memory / 2**30:.1f} GiB" if self.peak_memory else ""
        return f"{self.method.upper()} over {self.blocks} blocks in {self.seconds:.1f} s{peak}, on {self.data}"


class _Stop(Exception):
    pass


def decoder_blocks(model: nn.Module, names: list[str]) -> tuple[str, nn.ModuleList] | None:
    """The ``nn.ModuleList`` holding most of ``names`` (the model's decoder blocks), with its name."""
    best, count = None, 0
    for lname, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0:
            c = sum(n.startswith(lname + ".") for n in names)
            if c > count:
                best, count = (lname, mod), c
    return best


def _block_index(name: str, prefix: str) -> int | None:
    if not name.startswith(prefix + "."):
        return None
    head = name[len(prefix) + 1:].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _capture(model, blocks: nn.ModuleList, ids: torch.Tensor, batch: int, device):
    """(hidden states of block 0 per batch, (args, kwargs) per block per batch) without running the blocks."""
    hidden, calls = [], [[] for _ in blocks]
    last = len(blocks) - 1

    def stub(i):
        def forward(*args, **kwargs):
            if args:
                h, rest = args[0], args[1:]
            else:
                h, rest = kwargs.pop("hidden_states"), ()
            if i == 0:
                hidden.append(h)
            calls[i].append((rest, kwargs))
            if i == last:
                raise _Stop
            return h
        return forward

    for i, blk in enumerate(blocks):
        blk.forward = stub(i)
    try:
        for lo in range(0, ids.shape[0], batch):
            try:
                model(input_ids=ids[lo:lo + batch].to(device), use_cache=False)
            except _Stop:
                pass
    finally:
        for blk in blocks:
            del blk.forward
    if len(hidden) != len(calls[last]):
        raise RuntimeError("the decoder blocks were not all called once per forward: lowbit cannot calibrate "
                           f"this model block by block ({type(model).__name__})")
    return hidden, calls


def _run_block(blk, h, args, kwargs):
    out = blk(h, *args, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


class _SharedInputs:
    """One Hessian per distinct input tensor of a block: linears that read the same tensor share it."""

    def __init__(self):
        self.by_key: dict = {}
        self.alive: list = []  # the first batch's inputs, held so no later tensor reuses their memory (and key)
        self.batch = 0
        self.order: list = []  # item keys in the order the block first called them

    def called(self, item_key) -> None:
        if item_key not in self.order:
            self.order.append(item_key)

    def next_batch(self, j: int) -> None:
        self.batch = j
        if j > 0:
            self.by_key.clear()
            self.alive.clear()

    def hook(self, item_key, table: dict):
        def fn(module, inputs, output):
            x = inputs[0]
            self.called(item_key)
            acc = table.get(item_key)
            if acc is None:  # first batch: the same tensor (storage, view and version) means the same input
                key = (x.data_ptr(), tuple(x.shape), x.stride(), x._version)
                acc = self.by_key.get(key)
                if acc is None:
                    acc = self.by_key[key] = gptq_mod.HessianAccumulator(x.shape[-1], x.device)
                    acc.last_batch = -1
                    self.alive.append(x)
                table[item_key] = acc
            if acc.last_batch != self.batch:
                acc.add(x.detach())
                acc.last_batch = self.batch
        return fn


class _ExpertHessians:
    """Per-expert Hessians of a transformers fused expert block: gate/up from the tokens routed to each
    expert, down from the expert's own intermediate ``act(gate) * up`` on them (the weights as given)."""

    def __init__(self, module):
        e, i2, h = module.gate_up_proj.shape
        dev = module.gate_up_proj.device
        self.e, self.i = e, i2 // 2
        self.gu = torch.zeros((e, h, h), dtype=torch.float32, device=dev)
        self.dn = torch.zeros((e, self.i, self.i), dtype=torch.float32, device=dev)
        self.tokens = torch.zeros(e, dtype=torch.int64)

    def hook(self, module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        top_k = args[1] if len(args) > 1 else kwargs["top_k_index"]
        x_all = hidden.reshape(-1, hidden.shape[-1])
        for e in torch.unique(top_k).tolist():
            if not 0 <= e < self.e:
                continue  # expert-parallel sentinels
            rows = (top_k == e).any(dim=-1).nonzero().reshape(-1)
            x = x_all.index_select(0, rows).to(torch.float32)
            self.gu[e].addmm_(x.t(), x)
            gu = x @ module.gate_up_proj[e].to(torch.float32).t()
            inter = module.act_fn(gu[:, :self.i]) * gu[:, self.i:]
            self.dn[e].addmm_(inter.t(), inter)
            self.tokens[e] += rows.numel()

    def hessians(self, min_tokens: int):
        """(gate/up H [E, H, H], down H [E, I, I], experts that got the pooled H)."""
        total = max(1, int(self.tokens.sum()))
        pooled_gu, pooled_dn = self.gu.sum(0) * (2.0 / total), self.dn.sum(0) * (2.0 / total)
        few = [e for e in range(self.e) if int(self.tokens[e]) < min_tokens]
        for e in range(self.e):
            if e in few:
                self.gu[e], self.dn[e] = pooled_gu, pooled_dn
            else:
                self.gu[e] *= 2.0 / int(self.tokens[e])
                self.dn[e] *= 2.0 / int(self.tokens[e])
        return self.gu, self.dn, few


def _check_finite(name: str, h: torch.Tensor) -> None:
    if not bool(torch.isfinite(h).all()):
        raise ValueError(f"the calibration activations reaching {name} contain NaN or inf: the model in its "
                         "current dtype overflows on the calibration text (try float32 or bfloat16)")


def calibrate(model: nn.Module, items: list, build: Callable, quantizer_cls, *, ids: torch.Tensor, data: str,
              options: GptqOptions, bits_of: Callable, codebook, progress: bool, rotation: int = 0) -> CalibrationInfo:
    """GPTQ every item of ``items`` (quantize_model's work list: ``(name, module, kind)``) block by block;
    ``build(item, quantized)`` installs an item's module from its quantizer's result (None: round to
    nearest). See the module doc."""
    info = CalibrationInfo("gptq", data, options)
    start = time.perf_counter()
    found = decoder_blocks(model, [name for name, _, _ in items])
    if found is None:
        raise ValueError("GPTQ calibrates block by block and found no list of decoder blocks (nn.ModuleList) "
                         "holding the layers to quantize")
    prefix, blocks = found
    per_block: dict[int, list] = {}
    outside = []
    for it in items:
        b = _block_index(it[0], prefix)
        (outside if b is None else per_block.setdefault(b, [])).append(it)
    items.clear()  # from here on each block's list holds its original layers: freed once the block is done
    params = next(iter(model.parameters()))
    device = params.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    batch = max(1, options.batch_tokens // ids.shape[1])
    with torch.no_grad():
        hidden, calls = _capture(model, blocks, ids, batch, device)
        todo = sorted(per_block)
        bar = _bar(todo, progress, f"GPTQ, {len(todo)} blocks")
        for bi in bar:
            blk = blocks[bi]
            work = dict(enumerate(per_block.pop(bi)))
            while work:  # one pass (all layers), or with true_sequential one per distinct input, in call order
                done = _calibrate_pass(blk, work, hidden, calls[bi], quantizer_cls, bits_of, codebook, options, info,
                                       build, rotation)
                for idx in done:
                    del work[idx]
            for j, h in enumerate(hidden):  # the next block's inputs: this block's outputs, quantized
                hidden[j] = _run_block(blk, h, *calls[bi][j])
            info.blocks += 1
        for item in outside:
            info.fallbacks.append((item[0], "outside the decoder blocks: round-to-nearest"))
            build(item, None)
    if cuda:
        torch.cuda.synchronize(device)
        info.peak_memory = torch.cuda.max_memory_allocated(device)
    info.seconds = time.perf_counter() - start
    return info


def _calibrate_pass(blk, work: dict, hidden, calls, quantizer_cls, bits_of, codebook, options, info, build,
                    rotation: int = 0) -> list:
    """Run the block once over the calibration batches with hooks on the layers in ``work`` ({index: item}),
    then GPTQ and install them: all of them, or with ``options.true_sequential`` those that read the first
    input the block computed (q/k/v, then o, then gate/up, then down: each later group then sees the
    quantized earlier ones). Returns the indices done."""
    shared, tables, handles, experts = _SharedInputs(), {}, [], {}
    for idx, (name, mod, kind) in work.items():
        if kind == "experts":
            experts[idx] = _ExpertHessians(mod)

            def hook(module, args, kwargs, output, _h=experts[idx], _i=idx):
                shared.called(_i)
                _h.hook(module, args, kwargs, output)
            handles.append(mod.register_forward_hook(hook, with_kwargs=True))
        else:
            target = mod[2][0] if kind == "fused" else mod
            handles.append(target.register_forward_hook(shared.hook(idx, tables)))
    try:
        for j, h in enumerate(hidden):
            shared.next_batch(j)
            _run_block(blk, h, *calls[j])
        shared.next_batch(len(hidden))
    finally:
        for hd in handles:
            hd.remove()
    todo = list(work)
    if options.true_sequential and shared.order:
        first = shared.order[0]
        todo = [first] + [i for i in shared.order[1:] if first in tables and tables.get(i) is tables[first]]
    for idx in todo:
        item = work[idx]
        name, mod, kind = item
        bits = bits_of(item)
        if kind == "experts":
            quantized = _experts(name, mod, experts.pop(idx), quantizer_cls, bits, codebook, options, info)
        else:
            acc = tables.get(idx)
            if acc is None:  # the block never called it: nothing to calibrate with
                info.fallbacks.append((name, "not called on the calibration data: round-to-nearest"))
                build(item, None)
                continue
            h = acc.hessian()
            _check_finite(name, h)
            w = torch.cat([m.weight for m in mod[2]]) if kind == "fused" else mod.weight
            if rotation:  # GPTQ of W H against H^T Hess H: the rotated weight the module will store
                r = torch.block_diag(*[kbit_rotation.hadamard(w.device)] * (w.shape[1] // kbit_rotation.BLOCK))
                w, h = kbit_rotation.rotate(w.detach().to(torch.float32)), r.t() @ h @ r
            quantized = _linear(w, h, quantizer_cls, bits, codebook, options)
        build(item, quantized)
    return todo


def _linear(w, h, quantizer_cls, bits, codebook, options):
    """GPTQ of one weight; with a fitted codebook and ``codebook_rounds`` > 1, the codebook is refitted to
    what each walk rounded and the walk runs again (the last walk's result is kept)."""
    rounds = options.codebook_rounds if isinstance(codebook, str) else 1
    for r in range(rounds):
        q = quantizer_cls(w, bits, codebook, importance=torch.diagonal(h), search=options.scale_search)
        if r + 1 < rounds and hasattr(q, "record_targets"):
            q.record_targets()
        gptq_mod.gptq(w, h, q, damp=options.damp, block_size=options.block_size, act_order=options.act_order)
        if r + 1 < rounds and getattr(q, "targets", None) is not None:
            codebook = q.refit_codebook()
    return q.result()


#: experts walked together by one gptq_stack call: bounds its fp32 copies (weights, H, its factors) to ~1 GiB
_STACK_BYTES = 1 << 30


def _experts(name, mod, hess: _ExpertHessians, quantizer_cls, bits, codebook, options, info):
    """GPTQ of a fused expert block, each expert with its own Hessian, a chunk of experts per walk
    (:func:`lowbit.model.gptq.gptq_stack`) -> ``{"gate_up": result, "down": result}`` (stacked results)."""
    gu_h, dn_h, few = hess.hessians(options.min_expert_tokens)
    if few:
        info.fallbacks.append((name, f"experts {few} were routed < {options.min_expert_tokens} calibration "
                                     "tokens: their block's pooled Hessian"))
    out = {}
    for prefix, stack, hs in (("gate_up", mod.gate_up_proj, gu_h), ("down", mod.down_proj, dn_h)):
        _check_finite(f"{name}.{prefix}", hs)
        e_, n, k = stack.shape
        per = max(1, _STACK_BYTES // (4 * (3 * k * k + 2 * n * k)))
        parts = []
        for lo in range(0, e_, per):
            w, h = stack[lo:lo + per], hs[lo:lo + per]
            q = quantizer_cls(w, bits, codebook, importance=torch.diagonal(h, dim1=-2, dim2=-1),
                              search=options.scale_search)
            gptq_mod.gptq_stack(w, h, q, damp=options.damp, block_size=options.block_size, act_order=options.act_order)
            parts.append(q.result())
            codebook = parts[-1][2]  # one codebook per expert block: fitted ("fit") on the first chunk, kept
        out[prefix] = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), codebook,
                       torch.cat([p[3].reshape(-1) for p in parts]))
    return out


def _bar(items, enabled: bool, desc: str):
    if not enabled or not items:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="block", leave=False)
