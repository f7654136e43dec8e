"""``quantize_model``: replace a model's ``nn.Linear`` layers (and, for kbit, its fused MoE expert blocks)
by lowbit modules of one format, in place, with a report of what was done and what was left."""

from __future__ import annotations

import dataclasses
import fnmatch
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..nn import QuantizedModule, fused_experts_layout, linear_class
from ..nn.fused import DEFAULT_FUSE_GROUPS, LinearPart, fused_name, install
from .calibrate import CalibrationInfo, GptqOptions, calibrate
from .calibration_data import calibration_ids


#: module names skipped unless ``skip`` says otherwise (fnmatch patterns on the full dotted name).
DEFAULT_SKIP = ("lm_head", "*.lm_head")


@dataclass
class LayerReport:
    name: str
    kind: str              # "linear", "experts" or "fused" (several linears as one weight)
    shape: tuple           # (N, K_in) or (E, H, I)
    bytes_before: int      # the layer's tensors before (weights + bias)
    bytes_after: int       # the module's tensors after (tiled layout incl. padding, codebook, scales, bias)
    format_bytes: int      # nominal bytes of the format (kbit: (bits + 1/4) per weight)
    bits: int = 0          # this layer's bits (``bits_for`` may differ from the report's)
    linears: int = 1       # nn.Linear modules it replaces (several for "fused", none for "experts")


@dataclass
class QuantizeReport:
    bits: int
    format: str = "kbit"
    format_label: str = ""  # "kbit4", "NVFP4" (from the format's module)
    layers: list[LayerReport] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (module name, reason)
    model_bytes_before: int = 0
    model_bytes_after: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    method: str = "rtn"                 # "rtn" (round to nearest) or "gptq" (calibrated)
    calibration: "CalibrationInfo | None" = None  # what the calibration did (method="gptq")

    @property
    def bytes_before(self) -> int:
        return sum(x.bytes_before for x in self.layers)

    @property
    def bytes_after(self) -> int:
        return sum(x.bytes_after for x in self.layers)

    @property
    def linears(self) -> int:
        """nn.Linear modules quantized (a fused group counts each of its members)."""
        return sum(x.linears for x in self.layers)

    @property
    def label(self) -> str:
        """``kbit4``, ``NVFP4``: the format as reports name it."""
        return self.format_label or f"{self.format}{self.bits}"

    def summary(self) -> str:
        """One line: what was quantized, in the words every lowbit report uses."""
        experts = sum(x.kind == "experts" for x in self.layers)
        fused = [x for x in self.layers if x.kind == "fused"]
        what = f"{self.linears} linear layers" + (f" and {experts} MoE expert blocks" if experts else "")
        stored = (f" (stored as {len(self.layers) - experts} weights: {sum(x.linears for x in fused)} of them fused "
                  f"into {len(fused)})" if fused else "")
        how = " with GPTQ" if self.method == "gptq" else ""
        return f"quantized {what} to {self.label}{how}{stored} in {self.seconds:.2f} s on {self.device}"

    def __str__(self) -> str:
        gib = 2.0**30
        lines = [
            f"lowbit.quantize_model: {self.summary()}",
            f"  quantized layers: {self.bytes_before / gib:.3f} GiB -> {self.bytes_after / gib:.3f} GiB "
            f"({self.bytes_before / max(1, self.bytes_after):.2f}x smaller)",
            *(["  other bits: " + ", ".join(f"{x.name} kbit{x.bits}" for x in self.layers if x.bits != self.bits)]
              if any(x.bits != self.bits for x in self.layers) else []),
            f"  whole model:      {self.model_bytes_before / gib:.3f} GiB -> {self.model_bytes_after / gib:.3f} GiB",
        ]
        if self.calibration is not None:
            lines.append(f"  calibration: {self.calibration.summary()}")
            lines += [f"    {name}: {what}" for name, what in self.calibration.fallbacks]
        if self.skipped:
            lines.append(f"  left unquantized ({len(self.skipped)}):")
            lines += [f"    {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and buffers (shared tensors counted once)."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        key = (t.device, t.data_ptr(), t.nbytes)
        if key not in seen:
            seen.add(key)
            total += t.nbytes
    return total


def _tensor_bytes(*ts) -> int:
    return sum(t.nbytes for t in ts if t is not None)


def _skip_reason(name: str, mod: nn.Module, patterns: tuple[str, ...], skip_fn, output_embeddings) -> str | None:
    if mod is output_embeddings and any(fnmatch.fnmatchcase(p, "*lm_head*") for p in patterns):
        return "output embedding (lm_head), skipped by default"
    for p in patterns:
        if fnmatch.fnmatchcase(name, p):
            return f"matches skip pattern {p!r}"
    if skip_fn is not None and skip_fn(name, mod):
        return "skip callable returned True"
    return None


@dataclass
class QuantizePlan:
    """The layers :func:`quantize_model` takes and how each is built (:func:`plan_quantization` makes one).
    ``items``: ``(name, module, kind)`` in model order; kind ``"linear"``, ``"experts"``, or ``"fused"``,
    whose module is ``(parent, child names, linears, bits or None)``."""

    linear_cls: type
    items: list
    report: QuantizeReport
    parents: dict
    bits: int
    codebook: torch.Tensor | str | None
    rotation: int
    layer_bits: Callable[[str], int | None]

    def bits_of(self, item) -> int:
        """The bits ``item`` is quantized to."""
        return (item[1][3] if item[2] == "fused" else self.layer_bits(item[0])) or self.bits

    @staticmethod
    def tensors(item) -> list[tuple[nn.Module, str]]:
        """(module, tensor name) of every tensor ``item``'s build reads."""
        _, mod, kind = item
        mods = mod[2] if kind == "fused" else [mod]
        return [(m, t) for m in mods for t, _ in [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]]

    def build(self, item, quantized=None) -> nn.Module:
        """Install ``item``'s quantized module (from a calibration result, or rounded to nearest); returns it."""
        name, mod, kind = item
        given = {} if quantized is None else {"quantized": quantized}  # formats without GPTQ need not take it
        rotated = {"rotation": self.rotation} if self.rotation and kind != "experts" else {}
        if kind == "fused":
            parent, g, mods, b = mod
            b = b or self.bits
            new = self.linear_cls.fused_class.from_linears(mods, b, self.codebook, **given, **rotated)
            new.train(mods[0].training)
            install(parent, g, new)
            before = sum(_tensor_bytes(m.weight, m.bias) for m in mods)
            self.report.layers.append(LayerReport(name, kind, (new.out_features, new.in_features), before,
                                                  _tensor_bytes(*new.buffers(), new.bias), new.format_bytes(), b,
                                                  linears=len(mods)))
            return new
        b = self.layer_bits(name) or self.bits
        if kind == "linear":
            new = self.linear_cls.from_linear(mod, bits=b, codebook=self.codebook, **given, **rotated)
            before = _tensor_bytes(mod.weight, mod.bias)
            after = _tensor_bytes(*new.buffers(), new.bias)
            shape = (mod.out_features, mod.in_features)
        else:
            new = self.linear_cls.experts_class.from_experts(mod, b, self.codebook, **given)
            before = _tensor_bytes(mod.gate_up_proj, mod.down_proj)
            after = _tensor_bytes(*new.buffers(recurse=False))
            shape = (new.num_experts, new.hidden_dim, new.intermediate_dim)
        new.train(mod.training)
        for parent, cname in self.parents.get(id(mod), []):
            setattr(parent, cname, new)
        self.report.layers.append(LayerReport(name, kind, shape, before, after, new.format_bytes(), b,
                                              linears=int(kind == "linear")))
        return new


def plan_quantization(
    model: nn.Module,
    bits: int = 4,
    codebook: torch.Tensor | None = None,
    skip: Iterable[str] | Callable[[str, nn.Module], bool] | None = DEFAULT_SKIP,
    *,
    format: str = "kbit",
    experts: bool = True,
    bits_for: dict[str, int] | None = None,
    fuse: bool | Iterable[Iterable[str]] | None = None,
    rotation: int = 0,
) -> QuantizePlan:
    """What :func:`quantize_model` (same arguments) would do to ``model``, without doing it: the layers it
    takes, in model order, each built by :meth:`QuantizePlan.build`. The weights may still be on the meta
    device: transformers' loader (:mod:`lowbit.hf.quantizer`) plans on the empty model and builds each layer
    as its tensors arrive."""
    linear_cls = linear_class(format)  # ValueError naming the formats for an unknown one
    fused_cls, experts_cls = linear_cls.fused_class, linear_cls.experts_class
    if fuse and fused_cls is None:
        raise ValueError(f"fuse: format={format!r} has no fused module; pass fuse=False (or None)")
    fuse = fused_cls is not None and linear_cls.fuse_by_default if fuse is None else fuse
    linear_cls.check_options(bits=bits, codebook=codebook)
    if isinstance(rotation, bool) or rotation not in linear_cls.rotations:
        raise ValueError(f"rotation must be one of {linear_cls.rotations} for format={format!r}, got {rotation!r}")
    bits_for = dict(bits_for or {})
    for pat, b in bits_for.items():
        if not isinstance(pat, str):
            raise TypeError(f"bits_for keys must be fnmatch patterns (str), got {pat!r}")
        linear_cls.check_options(bits=b)
        if isinstance(codebook, torch.Tensor) and b != bits:
            raise ValueError(f"a codebook tensor is for kbit{bits}; bits_for asks {pat!r} -> {b} bits (pass codebook=None or 'fit')")

    def layer_bits(name: str) -> int | None:
        return next((b for pat, b in bits_for.items() if fnmatch.fnmatchcase(name, pat)), None)

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if callable(skip):
        patterns, skip_fn = (), skip
    else:
        patterns, skip_fn = tuple(skip or ()), None
    get_out = getattr(model, "get_output_embeddings", None)
    try:
        output_embeddings = get_out() if callable(get_out) else None
    except (NotImplementedError, AttributeError):
        output_embeddings = None

    report = QuantizeReport(bits=bits, format=format, format_label=linear_cls.label(bits),
                            model_bytes_before=model_bytes(model))
    block = linear_cls.k_multiple
    todo: list[tuple[str, nn.Module, str]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, (QuantizedModule, LinearPart)):
            report.skipped.append((name, "already quantized"))
            continue
        moe = experts and experts_cls is not None and fused_experts_layout(mod)
        kind = "linear" if isinstance(mod, nn.Linear) else ("experts" if moe else None)
        if kind is None:
            if isinstance(getattr(mod, "gate_up_proj", None), torch.Tensor) and getattr(mod, "gate_up_proj").dim() == 3:
                if experts_cls is None:
                    why = f"expert block: no {report.label} experts module yet (left in its dtype)"
                elif experts:
                    why = "expert block with a layout or gate lowbit does not reproduce (left as is)"
                else:
                    why = "expert block (experts=False)"
                report.skipped.append((name, why))
            continue
        why = None if layer_bits(name) is not None else _skip_reason(name, mod, patterns, skip_fn, output_embeddings)
        if why is None:
            dims = (mod.in_features,) if kind == "linear" else fused_experts_layout(mod)[1:]
            bad = [d for d in dims if d % block]
            if bad:
                why = f"input size {bad[0]} is not a multiple of {block}"
        if why is not None:
            report.skipped.append((name, why))
            continue
        todo.append((name, mod, kind))

    groups = DEFAULT_FUSE_GROUPS if fuse is True else tuple(tuple(g) for g in (fuse or ()))
    for g in groups:
        if len(g) < 2 or len(set(g)) != len(g) or not all(isinstance(n, str) and n and "." not in n for n in g):
            raise ValueError(f"fuse groups must be >= 2 distinct child names (no dots), got {g}")

    odd = [f"{n} ({w})" for n, w in report.skipped if "multiple of" in w]
    if odd:
        warnings.warn(f"lowbit.quantize_model: {len(odd)} layer(s) left unquantized: " + "; ".join(odd), stacklevel=2)

    # Replace every occurrence of a module (a module shared by two parents is quantized once).
    parents: dict[int, list[tuple[nn.Module, str]]] = {}
    for _, parent in model.named_modules(remove_duplicate=False):
        for cname, child in parent._modules.items():  # every slot, also a second one holding the same module
            if child is not None:
                parents.setdefault(id(child), []).append((parent, cname))

    fusions = _fusion_groups(model, todo, groups, parents, layer_bits, bits) if groups else []
    fused_ids = {id(m) for _, _, _, mods in fusions for m in mods}
    position = {id(m): i for i, (_, m, _) in enumerate(todo)}  # report layers in model order
    items = [(position[id(t[1])], t) for t in todo if id(t[1]) not in fused_ids]
    for pname, parent, g, mods in fusions:
        label = (f"{pname}." if pname else "") + "{" + ",".join(g) + "}"
        items.append((position[id(mods[0])], (label, (parent, g, mods, layer_bits(f"{pname}.{g[0]}" if pname else g[0])), "fused")))
    items = [t for _, t in sorted(items, key=lambda it: it[0])]

    return QuantizePlan(linear_cls=linear_cls, items=items, report=report, parents=parents, bits=bits,
                        codebook=codebook, rotation=rotation, layer_bits=layer_bits)


def quantize_model(
    model: nn.Module,
    bits: int = 4,
    codebook: torch.Tensor | None = None,
    skip: Iterable[str] | Callable[[str, nn.Module], bool] | None = DEFAULT_SKIP,
    *,
    format: str = "kbit",
    experts: bool = True,
    bits_for: dict[str, int] | None = None,
    fuse: bool | Iterable[Iterable[str]] | None = None,
    progress: bool = True,
    method: str = "rtn",
    calibration: torch.Tensor | list[str] | str | None = None,
    tokenizer=None,
    gptq: GptqOptions | None = None,
    rotation: int = 0,
) -> QuantizeReport:
    """Quantize ``model`` in place; returns a :class:`QuantizeReport`.

    ``format="kbit"`` (default): every ``nn.Linear`` -> :class:`KbitLinear` (K = ``bits``), every fused MoE
    expert block (transformers 5.x) -> :class:`KbitMoeExperts`. ``format="nvfp4"``: every ``nn.Linear`` ->
    :class:`NvFp4Linear` and every fused MoE expert block -> :class:`NvFp4MoeExperts` (4 bits: ``bits``,
    ``codebook`` and ``bits_for`` are kbit's).

    * ``skip``: fnmatch patterns on module names (default: ``lm_head``; the model's output
      embedding is recognised by identity too), or a callable ``(name, module) -> bool``. Pass
      ``()`` to quantize everything. Embeddings are never ``nn.Linear`` and stay as they are.
    * A layer whose input size is not a multiple of 32 stays unquantized, with a warning; the
      report lists it and why.
    * ``bits_for``: ``{fnmatch pattern: bits}`` for the modules that take other bits than ``bits``
      (first match wins); a module it names is quantized even where ``skip`` would leave it, e.g.
      ``bits_for={"lm_head": 5}`` adds the output projection at 5 bits.
    * ``fuse`` (kbit, NVFP4): quantize sibling linears that read the same input as one weight (one kernel launch;
      :mod:`lowbit.nn.fused`). ``True`` fuses ``DEFAULT_FUSE_GROUPS`` (q/k/v, gate/up, w1/w3, ...), ``False``
      quantizes every linear alone, or pass the groups of child names; None: the format's default
      (``fuse_by_default``: kbit and NVFP4 fuse). Measured on the H100, Llama-3-8B decode: kbit4 269 -> 310 tok/s
      (benchmarks/journal/2026-11-23_round_2_what_the_small_gemv.md), NVFP4 312 -> 345; the same quality
      (journal 2026-11-26_nvfp4_fused_by_default.md). A group is fused
      where all its members are quantized linears of one parent with the same input size, bias presence,
      dtype, device and bits; else each stays alone.
    * Each layer is quantized on the device its weight is on (a model on the GPU quantizes there).
    * ``method``: ``"rtn"`` (default) rounds each weight to nearest; ``"gptq"`` calibrates
      (:mod:`lowbit.model.calibrate`): GPTQ block by block over the model's decoder blocks, every format
      that names a column quantizer (kbit, NVFP4). ``calibration``: token ids ``[samples, seq_len]``, a
      list of strings, or None for the default text (the Python language reference, ``pydoc_data``; not
      the text ``lowbit eval`` scores on); text needs ``tokenizer``. ``gptq``: :class:`GptqOptions`
      (damping, act-order, samples x seq_len, ...). The report's ``calibration`` says what was done,
      and ``model.lowbit_quantization`` keeps it for :func:`save_quantized`.
    * ``rotation=32`` (kbit and SBVR linears): store each weight rotated by a block-32 Walsh-Hadamard transform and
      rotate its inputs the same way (:mod:`lowbit.formats.kbit.rotation`); with GPTQ it lowers the error
      at 2-3 bits. MoE expert blocks stay unrotated.
    """
    linear_cls = linear_class(format)  # ValueError naming the formats for an unknown one
    if method not in ("rtn", "gptq"):
        raise ValueError(f"method must be 'rtn' or 'gptq', got {method!r}")
    if method == "rtn" and (calibration is not None or tokenizer is not None or gptq is not None):
        raise ValueError("calibration, tokenizer and gptq are options of method='gptq'")
    if method == "gptq":
        if linear_cls.column_quantizer is None:
            raise ValueError(f"format={format!r} has no column quantizer: method='gptq' is not available for it")
        gptq = gptq if gptq is not None else GptqOptions()
        if not isinstance(gptq, GptqOptions):
            raise TypeError(f"gptq must be a lowbit.GptqOptions, got {type(gptq).__name__}")
        gptq.check()
    plan = plan_quantization(model, bits, codebook, skip, format=format, experts=experts, bits_for=bits_for, fuse=fuse,
                             rotation=rotation)
    report, items, build, experts_cls = plan.report, plan.items, plan.build, linear_cls.experts_class
    plan.items = []  # `items` holds the only references: each original layer is freed once replaced
    devices = {str(m.weight.device if k == "linear" else m.gate_up_proj.device) for _, m, k in items if k != "fused"}
    devices |= {str(m[2][0].weight.device) for _, m, k in items if k == "fused"}
    report.device = ",".join(sorted(devices)) or "-"
    sync = any(d.startswith("cuda") for d in devices)

    start = time.perf_counter()
    if method == "gptq" and experts_cls is not None and not experts_cls.calibrated:
        for item in [it for it in items if it[2] == "experts"]:  # this format's expert blocks: round to nearest
            build(item)
        items = [it for it in items if it[2] != "experts"]
    if method == "gptq":
        if not items:
            raise ValueError("method='gptq': the model has no layers to quantize (nothing quantize_model would take)")
        config = getattr(model, "config", None)
        ids, data = calibration_ids(calibration, tokenizer, getattr(config, "vocab_size", None),
                                    samples=gptq.samples, seq_len=gptq.seq_len)
        report.method = "gptq"
        report.calibration = calibrate(
            model, items, build, linear_cls.column_quantizer, ids=ids, data=data, options=gptq,
            bits_of=plan.bits_of, rotation=rotation,
            codebook=codebook, progress=progress)
        del items
    else:
        bar = _progress(items, progress, report.label)
        for i, item in enumerate(bar):
            items[i] = None  # `items` held the only reference: each original layer is freed once replaced
            build(item)
            del item
    if sync:
        torch.cuda.synchronize()
    report.seconds = time.perf_counter() - start
    report.model_bytes_after = model_bytes(model)
    info = report.calibration
    model.lowbit_quantization = {"format": report.label, "method": report.method, "rotation": rotation}
    if info is not None:
        model.lowbit_quantization.update(calibration=info.data, options=dataclasses.asdict(info.options),
                                         fallbacks=[list(f) for f in info.fallbacks])
    return report


def _fusion_groups(model, todo, groups, parents, layer_bits, bits) -> list:
    """(parent name, parent, group, linears) for every group whose members can be one weight."""
    linears = {name: mod for name, mod, kind in todo if kind == "linear"}
    out = []
    for pname, parent in model.named_modules():
        for g in groups:
            full = [f"{pname}.{n}" if pname else n for n in g]
            mods = [linears.get(f) for f in full]
            if any(m is None for m in mods) or any(len(parents.get(id(m), [])) != 1 for m in mods):
                continue  # not all quantized here, or a member is shared with another parent
            w0 = mods[0].weight
            same = all(m.in_features == mods[0].in_features and (m.bias is None) == (mods[0].bias is None)
                       and m.weight.dtype == w0.dtype and m.weight.device == w0.device for m in mods)
            if same and len({layer_bits(f) or bits for f in full}) == 1 and not hasattr(parent, fused_name(g)):
                out.append((pname, parent, g, mods))
    return out


def _progress(items: list, enabled: bool, label: str):
    if not enabled or not items:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress bars are optional (lowbit[hf] installs tqdm)
        return items
    return tqdm(items, desc=f"quantizing to {label}", unit="weight", leave=False)
