"""lowbit as a transformers quantizer: ``from_pretrained(..., quantization_config=LowbitConfig(...))``.

Importing ``lowbit.hf`` registers the quantization method ``"lowbit"`` with transformers (its
``register_quantization_config`` / ``register_quantizer`` hooks), so a user writes::

    from transformers import AutoModelForCausalLM
    from lowbit.hf import LowbitConfig

    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, device_map="cuda",
                                                 quantization_config=LowbitConfig(format="kbit", bits=4))

and gets the model :func:`lowbit.quantize_model` would make from the same weights (the same modules, the
same tensors, bit for bit), quantized while it loads: the loader hands each dense tensor to the quantizer
on its target device, and each layer (a fused q|k|v or gate|up group: once its last member arrives) is
quantized and installed at once, so the unquantized model is never whole on the device. What is quantized,
fused and skipped is decided once on the empty (meta) model by :func:`lowbit.model.plan_quantization`,
the plan ``quantize_model`` itself runs.

Round to nearest only: calibrated quantization (``method="gptq"``) needs the whole model to run, so it
stays with :func:`lowbit.quantize_model`.

``save_pretrained(directory)`` writes the quantized modules' tensors as they hold them (kbit: the tiled
layout its kernels read), and in ``config.json`` each quantized module's entry and the CRC-32 of each of
its tensors; ``from_pretrained(directory)`` rebuilds those modules empty, lets transformers load into
them, and checks every checksum and the values the kernels trust (:class:`lowbit.model.LoadError` otherwise).
:func:`lowbit.save_quantized` / :func:`lowbit.load_quantized` remain lowbit's own, compact format.
"""

from __future__ import annotations

import re
import time
from typing import Any

import torch
from torch import nn
from transformers.core_model_loading import ConversionOps
from transformers.quantizers import HfQuantizer
from transformers.quantizers.auto import (AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING,
                                          register_quantization_config, register_quantizer)
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..model.checkpoint import LoadError, check_not_split, crc32, module_config, skeleton_module
from ..model.quantize import DEFAULT_SKIP, QuantizePlan, model_bytes, plan_quantization
from ..nn import QuantizedModule, linear_class
from ..nn.fused import FusedParts, fused_name
from . import tp

#: transformers' name of the method (``config.json``'s ``quantization_config.quant_method``).
METHOD = "lowbit"


class LowbitConfig(QuantizationConfigMixin):
    """How ``from_pretrained`` quantizes: :func:`lowbit.quantize_model`'s options, round to nearest.

    * ``format``: ``"kbit"`` (default), ``"nvfp4"`` or ``"sbvr"``; ``bits``: the format's bits (kbit 2..5).
    * ``skip``: fnmatch patterns of module names left unquantized (default: the output projection).
    * ``bits_for``: ``{pattern: bits}`` for modules that take other bits (``{"lm_head": 4}`` adds the head).
    * ``fuse``: quantize q|k|v and gate|up as one weight each (None: the format's default).
    * ``experts``: quantize transformers' fused MoE expert blocks (kbit).
    * ``rotation``: 32 stores kbit/SBVR weights rotated by a block-32 Hadamard transform.
    """

    def __init__(self, format: str = "kbit", bits: int = 4, skip: list[str] | tuple[str, ...] = DEFAULT_SKIP,
                 bits_for: dict[str, int] | None = None, fuse: bool | None = None, experts: bool = True,
                 rotation: int = 0, modules: dict[str, dict] | None = None, checksums: dict[str, int] | None = None,
                 **kwargs: Any):
        self.quant_method = METHOD
        self.format = format
        self.bits = bits
        self.skip = list(skip)
        self.bits_for = dict(bits_for or {})
        self.fuse = fuse
        self.experts = experts
        self.rotation = rotation
        # Written by save_pretrained (not options): every quantized module's checkpoint entry, and the CRC-32 of
        # each of their tensors, so that from_pretrained(directory) rebuilds the modules and checks their bytes.
        self.modules = modules
        self.checksums = checksums
        if kwargs.get("method", "rtn") != "rtn":
            raise ValueError(f"method={kwargs['method']!r}: calibrated quantization runs the whole model on calibration "
                             "text, which from_pretrained cannot; load the model, then call lowbit.quantize_model(model, "
                             "method='gptq')")
        kwargs.pop("method", None)
        unknown = set(kwargs) - {"quant_method"}
        if unknown:
            raise TypeError(f"LowbitConfig got unknown options {sorted(unknown)}")
        self.post_init()

    def post_init(self):
        """Check the options as quantize_model would, before anything is loaded."""
        cls = linear_class(self.format)  # ValueError naming the formats
        if isinstance(self.bits, bool) or not isinstance(self.bits, int):
            raise TypeError(f"bits must be an int, got {self.bits!r}")
        cls.check_options(bits=self.bits)
        if not all(isinstance(p, str) for p in self.skip):
            raise TypeError(f"skip must be a list of fnmatch patterns (str), got {self.skip!r}")
        for pat, b in self.bits_for.items():
            if not isinstance(pat, str):
                raise TypeError(f"bits_for keys must be fnmatch patterns (str), got {pat!r}")
            cls.check_options(bits=b)
        if self.fuse is not None and not isinstance(self.fuse, bool):
            raise TypeError(f"fuse must be True, False or None, got {self.fuse!r}")
        if isinstance(self.rotation, bool) or self.rotation not in cls.rotations:
            raise ValueError(f"rotation must be one of {cls.rotations} for format={self.format!r}, got {self.rotation!r}")

    def plan_kwargs(self) -> dict:
        return dict(bits=self.bits, skip=tuple(self.skip), format=self.format, experts=self.experts,
                    bits_for=self.bits_for or None, fuse=self.fuse, rotation=self.rotation)


class LowbitHfQuantizer(HfQuantizer):
    """transformers' side of :class:`LowbitConfig`: plans on the empty model, quantizes layers as they load."""

    requires_calibration = False

    def __init__(self, quantization_config: LowbitConfig, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self.plan: QuantizePlan | None = None
        self._item_of: dict[str, int] = {}      # tensor key -> index of the plan item that reads it
        self._pending: dict[int, set[str]] = {}  # item -> keys not loaded yet
        self._built: set[int] = set()
        self._derived: list[tuple[nn.Module, str, torch.Tensor]] = []  # built modules' non-persistent buffers
        self._loaded: dict[str, QuantizedModule] = {}  # a saved model's modules, by name
        self._sliced: dict[str, tuple] = {}  # under TP: modules whose tiled buffers lowbit reads in slices
        self._files: list[str] = []
        self._model = None  # the model being loaded
        self._started = 0.0

    def validate_environment(self, *args, device_map=None, **kwargs):
        if isinstance(device_map, dict) and "disk" in device_map.values():
            raise ValueError("lowbit: a device_map that offloads to disk is not supported: lowbit modules live on a "
                             "device (a GPU, or the CPU for checking)")
        cfg = self.quantization_config
        if self.pre_quantized and (not isinstance(cfg.modules, dict) or not isinstance(cfg.checksums, dict)):
            raise LoadError("lowbit: this checkpoint's quantization_config lists no saved modules and checksums "
                            "(config.json was not written by save_pretrained of a lowbit model)")

    def _process_model_before_weight_loading(self, model, **kwargs):
        self._model = model
        if self.pre_quantized:  # a saved lowbit model: its modules' empty skeletons take the saved tensors
            self._loaded = {name: skeleton_module(model, name, cfg) for name, cfg in self.quantization_config.modules.items()}
            called, experts = [], []
            for name, mod in self._loaded.items():
                mod.install(model, name)
                for m in self._called(model, name, mod):
                    m._lowbit_tp_managed = mod.k_multiple  # a TP plan's split is lowbit's (lowbit.hf.tp)
                    called.append(m)
                if hasattr(mod, "num_experts"):  # an expert block
                    if self._tp_size(model) > 1 and not mod.tp_experts:
                        raise NotImplementedError(f"lowbit: {type(mod).__name__} expert blocks ({name}) do not split "
                                                  "for tensor parallelism")
                    experts.append(name)
            tp.take_over(model, [n for n, m in model.named_modules() if m in called and n not in experts], experts)
            self._slice_loads(model, kwargs.get("checkpoint_files"))
            return model
        self.plan = plan_quantization(model, **self.quantization_config.plan_kwargs())
        experts = [name for name, _, kind in self.plan.items if kind == "experts"]
        experts_cls = self.plan.linear_cls.experts_class
        if self._tp_size(model) > 1 and self.plan.linear_cls._tp_part is QuantizedModule._tp_part:
            raise NotImplementedError(f"lowbit: format={self.quantization_config.format!r} does not split for tensor "
                                      "parallelism (kbit and nvfp4 do)")
        if experts and self._tp_size(model) > 1 and not experts_cls.tp_experts:
            raise NotImplementedError(
                f"lowbit: {experts_cls.__name__} expert blocks ({experts[0]}, ...) do not split for tensor parallelism; "
                "LowbitConfig(experts=False) leaves them to transformers (unquantized)")
        names = {id(m): n for n, m in model.named_modules()}
        for _, mod, kind in self.plan.items:
            for m in mod[2] if kind == "fused" else [mod]:
                m._lowbit_tp_managed = experts_cls.k_multiple if kind == "experts" else self.plan.linear_cls.k_multiple
        tp.take_over(model, [names[id(m)] for _, mod, kind in self.plan.items if kind != "experts"
                             for m in (mod[2] if kind == "fused" else [mod])], experts)
        self._item_of.clear()
        self._pending.clear()
        self._built.clear()
        self._derived.clear()
        for i, item in enumerate(self.plan.items):
            keys = {f"{names[id(m)]}.{t}" if names[id(m)] else t for m, t in self.plan.tensors(item)}
            self._pending[i] = keys
            self._item_of.update(dict.fromkeys(keys, i))
        self._started = time.perf_counter()
        return model

    def _slice_loads(self, model, files) -> None:
        """Under TP, a module whose saved tensors can be read in slices (``tp_read_slices``: kbit and NVFP4
        linears, kbit expert blocks) gives those buffers up before loading: transformers leaves those keys alone
        and :meth:`_check_loaded` reads this rank's slices of them (:class:`_SliceReader`), so no rank reads the
        whole of a split weight."""
        self._sliced, self._files = {}, list(files or [])
        world = self._tp_size(model)
        if world <= 1 or not self._files:
            return
        for name, mod in self._loaded.items():
            split = tp.planned_split(model, name, mod)
            if split not in ("colwise", "rowwise", "experts") or not hasattr(mod, "tp_read_slices"):
                continue
            held = {b: (tuple(mod._buffers[b].shape), mod._buffers[b].dtype) for b in mod.tp_read_slices(split, 0, world)}
            for b in held:
                del mod._buffers[b]
            self._sliced[name] = (split, held)
            model._keys_to_ignore_on_load_unexpected = set(model._keys_to_ignore_on_load_unexpected or ()) | {
                re.escape(f"{name}.{b}") for b in held}

    def _read_slices(self, model) -> None:
        """Fill every sliced module's tiled buffers with this rank's slices (zeros elsewhere: never read, the
        rank's part is cut from the slices alone); ``model.lowbit_tp_read`` records bytes read vs stored."""
        if not self._sliced:
            return
        reader, stored = _SliceReader(self._files), 0
        for name, (_, held) in list(self._sliced.items()):
            mod = self._loaded[name]
            # the split and rank :meth:`_check_loaded` then cuts with (tp.place); not split after all: read whole
            rec = tp.recorded(self._called(model, name, mod), name)
            if rec is None:
                slices = {b: [(slice(None),)] for b in held}
                del self._sliced[name]  # whole again: its CRC-32 is checked
            else:
                style, mesh = rec
                slices = mod.tp_read_slices(tp.SPLITS[style], mesh.get_local_rank(), mesh.size())
            kept = [t for t in mod.state_dict().values() if t.device.type != "meta"]  # loaded whole
            device = kept[0].device if kept else torch.device("cpu")
            for b, index in slices.items():
                shape, dtype = held[b]
                full = torch.zeros(shape, dtype=dtype)
                for idx in index:
                    full[idx] = reader.read(f"{name}.{b}", idx)
                mod._buffers[b] = full.to(device)
                stored += full.numel() * full.element_size()
        model.lowbit_tp_read = {"read_bytes": reader.read_bytes, "stored_bytes": stored}

    @staticmethod
    def _tp_size(model) -> int:
        return getattr(getattr(model.config, "distributed_config", None), "tp_size", 1) or 1

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        return param_name in self._item_of

    def get_quantize_ops(self):
        return _QuantizeOnLoad(self)

    def _arrived(self, model, key: str, value: torch.Tensor) -> None:
        """Put one loaded tensor in its module; build the plan item once all its tensors are in."""
        mod_name, _, attr = key.rpartition(".")
        module = model.get_submodule(mod_name) if mod_name else model
        if attr in module._parameters:
            module._parameters[attr] = nn.Parameter(value, requires_grad=False)
        else:
            module._buffers[attr] = value
        i = self._item_of[key]
        pending = self._pending[i]
        pending.discard(key)
        if not pending and i not in self._built:
            self._build(i)

    @staticmethod
    def _called(model, name: str, mod: QuantizedModule) -> list[nn.Module]:
        """The modules the model calls for ``mod`` installed as ``name`` (a fused module: its parts)."""
        if isinstance(mod, FusedParts):
            parent = model.get_submodule(name.rpartition(".")[0])
            return [getattr(parent, n) for n in mod.part_names]
        return [mod]

    def _build(self, i: int) -> None:
        item = self.plan.items[i]
        name, mod, kind = item  # (MoE experts under TP were refused before loading)
        members = mod[2] if kind == "fused" else [mod]
        style = tp.recorded(members, name)
        slots = [(mod[0], fused_name(mod[1]))] if kind == "fused" else self.plan.parents.get(id(mod), [])
        with torch.no_grad():
            new = self.plan.build(item)
            if style is not None:
                new = tp.place(new, slots, *style)
        # transformers re-allocates every non-persistent buffer after loading (empty, for _init_weights to fill):
        # keep ours (e.g. an expert block's expert_range) to put back
        self._derived += [(new, b, new._buffers[b]) for b in new._non_persistent_buffers_set]
        self._built.add(i)
        self.plan.items[i] = None  # its dense tensors are freed with the replaced modules

    def _process_model_after_weight_loading(self, model, **kwargs):
        if self.pre_quantized:
            self._check_loaded(model)
            self._model = None
            return model
        # Items whose tensors the checkpoint lacked: transformers initialized them (and reports them missing).
        for i in sorted(set(self._pending) - self._built):
            item = self.plan.items[i]
            meta = [f"{t}" for m, t in self.plan.tensors(item) if getattr(m, t).is_meta]
            if meta:
                raise RuntimeError(f"lowbit: {item[0]} has tensors that were never loaded or initialized: {meta}")
            self._build(i)
        for module, b, value in self._derived:
            module._buffers[b] = value
        self._derived.clear()
        report = self.plan.report
        report.seconds = time.perf_counter() - self._started
        report.model_bytes_after = model_bytes(model)
        devices = {str(b.device) for m in model.modules() if hasattr(m, "format_bytes") for b in m.buffers(recurse=False)}
        report.device = ",".join(sorted(devices)) or "-"
        model.lowbit_quantization = {"format": report.label, "method": "rtn",
                                     "rotation": self.quantization_config.rotation}
        model.lowbit_report = report
        self.plan = self._model = None
        return model

    def _check_loaded(self, model) -> None:
        """lowbit's integrity checks on a loaded checkpoint: every quantized tensor's CRC-32 as saved, values the
        kernels trust (codebooks, scales), then what the modules derive from their tensors."""
        sums = self.quantization_config.checksums
        self._read_slices(model)
        sliced = {f"{name}.{b}" for name, (_, held) in self._sliced.items() for b in held}
        for name, mod in self._loaded.items():
            state = {f"{name}.{k}": v for k, v in mod.state_dict().items()}
            for key, t in state.items():
                if t.is_meta:
                    raise LoadError(f"tensor {key!r} is missing from the checkpoint")
                # a tensor read in slices has no whole to check against its CRC-32
                if key in sums and key not in sliced and crc32(t.detach().cpu().contiguous()) != sums[key]:
                    raise LoadError(f"tensor {key!r} fails its checksum: the checkpoint is corrupted or was modified")
            try:
                mod.check_checkpoint_values(name, state)
            except ValueError as e:
                raise LoadError(str(e)) from None
            device = next(t.device for t in state.values())
            style = tp.recorded(self._called(model, name, mod), name)
            mod.install(model, name, device)  # re-derives non-persistent buffers (transformers re-allocated them)
            mod.tensors_changed()
            if style is not None:
                parent_name, _, child = name.rpartition(".")
                with torch.no_grad():
                    tp.place(mod, [(model.get_submodule(parent_name), child)], *style)
        self._loaded = {}

    def get_state_dict_and_metadata(self, model):
        """save_pretrained: the model's own state dict (quantized modules in the layout they hold), with each
        quantized module's entry and each of its tensors' CRC-32 recorded in the config it writes next."""
        quantized = {n: m for n, m in model.named_modules() if isinstance(m, QuantizedModule)}
        check_not_split(quantized)
        cfg = self.quantization_config
        cfg.modules = {n: module_config(m) for n, m in quantized.items()}
        cfg.checksums = {f"{n}.{k}": crc32(t.detach().cpu().contiguous())
                         for n, m in quantized.items() for k, t in m.state_dict().items()}
        return None, {}

    def update_tp_plan(self, config):
        tp.register_styles()  # the plan itself is taken over on the model (tp.take_over), not in its config
        return config

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True

    def is_serializable(self) -> bool:
        return True


class _SliceReader:
    """Slices of saved tensors, read from the checkpoint's safetensors files without reading the rest."""

    def __init__(self, files: list[str]):
        from safetensors import safe_open

        self._handles, self._where = [], {}
        for f in files:
            if str(f).endswith(".safetensors"):
                h = safe_open(str(f), framework="pt")
                self._handles.append(h)
                self._where.update(dict.fromkeys(h.keys(), h))
        self.read_bytes = 0

    def read(self, key: str, index: tuple) -> torch.Tensor:
        h = self._where.get(key)
        if h is None:
            raise LoadError(f"tensor {key!r} is missing from the checkpoint")
        t = h.get_slice(key)[index]
        self.read_bytes += t.numel() * t.element_size()
        return t


class _QuantizeOnLoad(ConversionOps):
    """The loader's per-tensor hook: hands each tensor lowbit quantizes to the quantizer."""

    def __init__(self, quantizer: LowbitHfQuantizer):
        self.quantizer = quantizer

    def convert(self, input_dict: dict, model=None, missing_keys=None, **kwargs) -> dict:
        for key, value in input_dict.items():
            if isinstance(value, (list, tuple)):
                value = value[0]
            self.quantizer._arrived(model, key, value)
            if missing_keys is not None:
                missing_keys.discard(key)
        return {}


def register() -> None:
    """Register ``"lowbit"`` with transformers (idempotent; ``import lowbit.hf`` does it)."""
    if METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(METHOD)(LowbitConfig)
    if METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(METHOD)(LowbitHfQuantizer)


register()

__all__ = ["LowbitConfig", "LowbitHfQuantizer", "register"]
