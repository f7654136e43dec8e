"""Save / load quantized models with safetensors (never pickle), every format; and install other
tools' NVFP4 checkpoints (:func:`load_nvfp4_checkpoint`).

A saved model is a directory::

    lowbit_model.json                 index: format name + version, lowbit version, the quantized
                                      modules (type, bits, shapes), every tensor's file, dtype,
                                      shape and CRC-32, and tied tensors (aliases)
    model-00001-of-0000N.safetensors  the state dict (quantized weights + unquantized tensors),
                                      sharded by size; each file's metadata names the format too

Quantized weights are stored compact, not in the GPU layout the modules hold: kbit codes as bit
planes ``planes [..., N, K_in/32, bits]`` (int32) and absmax codes ``absmax [..., N, K_in/32]``
(uint8), exactly (bits + 8/32) bits per weight with no tile padding. The loader re-tiles them on
the target device (``kbit_tiled.repack``). Unquantized tensors are stored in the dtype asked for
(``save_quantized(..., dtype=torch.bfloat16)``) or as the model holds them.

``load_quantized(model, dir)`` turns a skeleton (e.g. a transformers model built from its config)
into the saved quantized model: it checks everything first -- format and version, that every
module exists with the saved shapes, that every tensor is present with the expected dtype and
shape and that its bytes match their checksum -- and only then changes the model, so a
refused load leaves the model as it was.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import torch
from torch import nn

from .._version import __version__
from ..formats import nvfp4

from ..nn import NvFp4Linear
from ..nn.base import REGISTRY, QuantizedModule

FORMAT_NAME = "lowbit"
FORMAT_VERSION = 2  # 2: compact bit planes instead of the tiled GPU layout
INDEX_FILE = "lowbit_model.json"
DEFAULT_SHARD_BYTES = 2 * 2**30


class LoadError(ValueError):
    """A saved model that cannot be loaded into this skeleton (the message names the tensor/module/file)."""


def _safetensors():
    try:
        import safetensors.torch  # noqa: F401
        from safetensors import safe_open
        from safetensors.torch import save_file
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError('lowbit save/load needs safetensors: pip install "lowbit[hf]" (or safetensors)') from e
    return safe_open, save_file


def crc32(t: torch.Tensor) -> int:
    """CRC-32 of a CPU tensor's bytes (the checkpoints' per-tensor checksum)."""
    return zlib.crc32(t.reshape(-1).view(torch.uint8).numpy().data)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_not_split(quantized: dict[str, QuantizedModule]) -> None:
    """Refuse to save a tensor-parallel model: each rank holds only its parts of the split modules."""
    split = [n for n, m in quantized.items() if m.tp_part is not None]
    if split:
        style, rank, world = quantized[split[0]].tp_part
        raise NotImplementedError(f"lowbit: this model is split for tensor parallelism ({split[0]} is part {rank} of "
                                  f"{world}, split {style}); a checkpoint needs whole modules: save the quantized "
                                  "model from one process, before it is split, and load that under torchrun")


def module_config(mod: QuantizedModule) -> dict:
    """A quantized module's checkpoint entry: its type and what rebuilds its empty skeleton."""
    return {"type": type(mod).__name__, **mod.checkpoint_config()}


def save_quantized(model: nn.Module, directory: str | os.PathLike, *, dtype: torch.dtype | None = None,
                   max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> Path:
    """Write ``model`` (quantized by :func:`lowbit.quantize_model`) to ``directory``; returns the index path.

    ``dtype``: store the unquantized floating-point tensors (embeddings, norms, biases, kept
    linears) in this dtype, e.g. ``torch.bfloat16`` for a model that ran in fp32 on the CPU;
    default: as the model holds them. Quantized weights are always stored compact (see above).
    """
    _, save_file = _safetensors()
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype or None, got {dtype!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    quantized = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedModule)}
    check_not_split(quantized)
    modules = {name: module_config(m) for name, m in quantized.items()}

    state = model.state_dict()
    format_keys = {f"{name}.{k}" for name, m in quantized.items() for k in m.state_dict()
                   if k != "bias"}  # codebook, scales, codes: never cast
    compact: dict[str, torch.Tensor] = {}
    for name, m in quantized.items():
        for qkey, akey, pkey, skey, n, k in m.compact_pairs():
            codes, scales = m.to_compact(state.pop(f"{name}.{qkey}"), state.pop(f"{name}.{akey}"), n, k)
            compact[f"{name}.{pkey}"], compact[f"{name}.{skey}"] = codes, scales
    aliases, tensors, seen = {}, {}, {}
    for key, t in state.items():
        ident = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() and ident in seen:  # tied weights: stored once
            aliases[key] = seen[ident]
            continue
        seen[ident] = key
        if dtype is not None and t.is_floating_point() and key not in format_keys:
            t = t.to(dtype)
        tensors[key] = t.detach().to("cpu").contiguous()
    tensors.update((key, t.to("cpu").contiguous()) for key, t in compact.items())

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, t in tensors.items():
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += t.nbytes
    meta = {"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION), "lowbit_version": __version__}
    entries = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / fname), metadata=meta)
        for key, t in shard.items():
            entries[key] = {"file": fname, "dtype": _dtype_name(t.dtype), "shape": list(t.shape), "crc32": crc32(t)}
    index = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "lowbit_version": __version__,
             "modules": modules, "tensors": entries, "aliases": aliases,
             # how the weights were chosen (quantize_model's method, calibration data and options)
             "quantization": getattr(model, "lowbit_quantization", None)}
    path = directory / INDEX_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, path)  # the index appears last, complete
    return path


# ----------------------------------------------------------------------------------------- load
def _read_index(directory: Path) -> dict:
    path = directory / INDEX_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not a directory written by lowbit.save_quantized")
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise LoadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT_NAME:
        raise LoadError(f"{path}: format is {index.get('format') if isinstance(index, dict) else None!r}, expected {FORMAT_NAME!r}")
    if index.get("format_version") != FORMAT_VERSION:
        raise LoadError(f"{path}: format version {index.get('format_version')!r} is not supported "
                        f"(this lowbit reads version {FORMAT_VERSION}; saved by lowbit {index.get('lowbit_version')}): "
                        "quantize and save the model again with this lowbit")
    for k in ("modules", "tensors", "aliases"):
        if not isinstance(index.get(k), dict):
            raise LoadError(f"{path}: missing or malformed {k!r}")
    return index


def skeleton_module(model: nn.Module, name: str, cfg: dict) -> QuantizedModule:
    """The empty quantized module (on meta) that replaces ``name`` in the skeleton."""
    cls = REGISTRY.get(cfg.get("type")) if isinstance(cfg, dict) else None
    if cls is None:
        raise LoadError(f"module {name!r}: unknown module type {cfg.get('type') if isinstance(cfg, dict) else cfg!r}")
    try:
        old = model.get_submodule(cls.replaced_module(name, cfg))
    except AttributeError:
        raise LoadError(f"module {name!r} of the saved model does not exist in this model") from None
    try:
        return cls.from_checkpoint_config(name, cfg, old)
    except (KeyError, TypeError) as e:
        raise LoadError(f"module {name!r}: malformed module entry {cfg!r} ({e})") from None
    except ValueError as e:
        raise LoadError(f"module {name!r}: {e}") from None


def _replaced_names(replaced: dict[str, QuantizedModule]) -> list[str]:
    """Every module name whose tensors the load replaces (a fused module also takes over its linears)."""
    return [n for name, mod in replaced.items() for n in mod.replaced_names(name)]


def _expected_state(model: nn.Module, replaced: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    """The state dict (meta/real tensors, for shape and dtype) the model will have after loading."""
    prefixes = tuple(n + "." for n in _replaced_names(replaced))
    expected = {k: v for k, v in model.state_dict(keep_vars=True).items() if not k.startswith(prefixes)}
    for name, mod in replaced.items():
        state = mod.state_dict(keep_vars=True)
        for qkey, akey, pkey, skey, n, k in mod.compact_pairs():
            held_codes, held_scales = state.pop(qkey), state.pop(akey)
            codes, scales = mod.compact_shapes(n, k)
            state[pkey] = torch.empty(codes, dtype=held_codes.dtype, device="meta")
            state[skey] = torch.empty(scales, dtype=held_scales.dtype, device="meta")
        for k, v in state.items():
            expected[f"{name}.{k}"] = v
    return expected


def _dtype_fits(saved: str, want: torch.dtype, quantized: bool) -> bool:
    if saved == _dtype_name(want):
        return True
    # Unquantized float tensors load in the dtype they were saved in (the skeleton may be fp32).
    return not quantized and want.is_floating_point and saved in ("float16", "bfloat16", "float32", "float64")


def load_quantized(model: nn.Module, directory: str | os.PathLike, *, device: str | torch.device | None = None,
                   dtype: torch.dtype | None = None) -> nn.Module:
    """Load a model saved by :func:`save_quantized` into the skeleton ``model`` (in place; returned).

    ``device``: where the tensors go (default: the skeleton's device, or CPU for a skeleton on
    the meta device); the quantized weights are re-tiled there (fastest on a GPU).
    ``dtype``: the dtype of the unquantized floating-point tensors (default: as saved).
    Raises :class:`LoadError` naming the tensor, module or file on a mismatch, a missing or
    unexpected tensor, a truncated file or a checksum failure; the model is then unchanged.
    """
    safe_open, _ = _safetensors()
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype or None, got {dtype!r}")
    directory = Path(directory)
    index = _read_index(directory)
    if device is None:
        real = [t.device for t in [*model.parameters(), *model.buffers()] if t.device.type != "meta"]
        device = real[0] if real else torch.device("cpu")
    device = torch.device(device)

    replaced = {name: skeleton_module(model, name, cfg) for name, cfg in index["modules"].items()}
    expected = _expected_state(model, replaced)
    entries, aliases = index["tensors"], index["aliases"]
    quantized_keys = {f"{n}.{k}" for n, m in replaced.items() for k in m.state_dict() if k != "bias"}

    for key in expected:
        if key not in entries and key not in aliases:
            raise LoadError(f"tensor {key!r} is missing from the saved model")
    for key in [*entries, *aliases]:
        if key not in expected:
            raise LoadError(f"tensor {key!r} in the saved model has no place in this model (unexpected tensor)")
    for key, target in aliases.items():
        if target not in entries:
            raise LoadError(f"tensor {key!r} is saved as an alias of {target!r}, which is not saved")
    for key, e in entries.items():
        want = expected[key]
        if not isinstance(e, dict) or not {"file", "dtype", "shape", "crc32"} <= e.keys():
            raise LoadError(f"tensor {key!r}: malformed index entry {e!r}")
        if list(want.shape) != list(e["shape"]) or not _dtype_fits(e["dtype"], want.dtype, key in quantized_keys):
            raise LoadError(f"tensor {key!r}: saved {e['dtype']}{list(e['shape'])} does not fit the expected "
                            f"{_dtype_name(want.dtype)}{list(want.shape)}")
    for name, buf in model.named_buffers():
        if buf.device.type == "meta" and name not in expected and not name.startswith(tuple(n + "." for n in _replaced_names(replaced))):
            raise LoadError(f"buffer {name!r} is on the meta device and not in the saved model (non-persistent); "
                            "build the skeleton on a real device")

    # Read and verify every tensor before touching the model.
    staged: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for key, e in entries.items():
        by_file.setdefault(e["file"], []).append(key)
    for fname, keys in by_file.items():
        path = directory / fname
        if Path(fname).name != fname or not path.is_file():
            raise LoadError(f"tensor {keys[0]!r}: file {fname!r} not found in {directory}")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                meta = f.metadata() or {}
                if meta.get("format") != FORMAT_NAME or meta.get("format_version") != str(FORMAT_VERSION):
                    raise LoadError(f"{path}: file metadata says format {meta.get('format')!r} version "
                                    f"{meta.get('format_version')!r}, expected {FORMAT_NAME!r} version {FORMAT_VERSION}")
                present = set(f.keys())
                for key in keys:
                    if key not in present:
                        raise LoadError(f"tensor {key!r} is missing from {fname}")
                    t = f.get_tensor(key)
                    e = entries[key]
                    if list(t.shape) != list(e["shape"]) or _dtype_name(t.dtype) != e["dtype"]:
                        raise LoadError(f"tensor {key!r} in {fname} is {_dtype_name(t.dtype)}{list(t.shape)}, "
                                        f"the index says {e['dtype']}{e['shape']}")
                    if crc32(t) != e["crc32"]:
                        raise LoadError(f"tensor {key!r} in {fname} fails its checksum: the file is corrupted or was modified")
                    staged[key] = t
        except LoadError:
            raise
        except Exception as ex:  # safetensors raises its own errors on truncated / malformed files
            raise LoadError(f"{path}: cannot read it ({type(ex).__name__}: {ex}); truncated or not a safetensors file") from None
    for name, mod in replaced.items():
        try:
            mod.check_checkpoint_values(name, staged)
        except ValueError as e:
            raise LoadError(str(e)) from None
    for key, target in aliases.items():
        staged[key] = staged[target]
    moved = {}
    for key, t in staged.items():  # to the device (may run out of memory: still before any change)
        if id(t) not in moved:
            cast = dtype is not None and t.is_floating_point() and key not in quantized_keys
            moved[id(t)] = t.to(device, dtype if cast else t.dtype)
    staged = {k: moved[id(t)] for k, t in staged.items()}
    for name, mod in replaced.items():  # compact -> the layout the module holds (kbit: the tiled GPU layout)
        for qkey, akey, pkey, skey, _, _ in mod.compact_pairs():
            codes, scales = staged.pop(f"{name}.{pkey}"), staged.pop(f"{name}.{skey}")
            staged[f"{name}.{qkey}"], staged[f"{name}.{akey}"] = mod.from_compact(codes, scales)

    # Commit: nothing below can fail on the data.
    for name, new in replaced.items():
        new.install(model, name, device)
    owners: dict[int, list[tuple[nn.Module, str, str]]] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((mod, pname, f"{mname}.{pname}" if mname else pname))
    for pid, places in owners.items():
        key = next((k for _, _, k in places if k in staged), None)
        if key is None:
            continue
        old = places[0][0]._parameters[places[0][1]]
        new_p = nn.Parameter(staged[key], requires_grad=old.requires_grad and staged[key].is_floating_point())
        for mod, pname, _ in places:
            mod._parameters[pname] = new_p
    for mname, mod in model.named_modules(remove_duplicate=False):
        for bname in list(mod._buffers):
            key = f"{mname}.{bname}" if mname else bname
            if key in staged and bname not in mod._non_persistent_buffers_set:
                mod._buffers[bname] = staged[key]
        if isinstance(mod, QuantizedModule):
            mod.tensors_changed()
    if device.type != "meta":
        model.to(device)  # the rest of the skeleton (non-persistent buffers) joins the weights
    if index.get("quantization") is not None:
        model.lowbit_quantization = index["quantization"]
    return model


# ------------------------------------------------------------------ other tools' NVFP4 checkpoints
def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def load_nvfp4_checkpoint(model: nn.Module, state_dict: dict) -> list[str]:
    """Install an NVFP4 checkpoint's quantized linears into ``model``: every ``nn.Linear`` whose name has
    NVFP4 tensors in ``state_dict`` (ModelOpt ``weight`` / ``weight_scale`` / ``weight_scale_2`` or
    compressed-tensors ``weight_packed`` / ``weight_scale`` / ``weight_global_scale``, see
    :func:`lowbit.formats.nvfp4.from_state_dict`) becomes an :class:`NvFp4Linear` with them (and the
    checkpoint's bias, else the module's). Other tensors (unquantized layers, activation scales) are
    left to the caller's ``load_state_dict(..., strict=False)``. Returns the names replaced."""
    done = []
    for name, mod in list(model.named_modules()):
        if type(mod) is not nn.Linear:
            continue
        prefix = name + "."
        if not (prefix + "weight_scale") in state_dict:
            continue
        w = nvfp4.from_state_dict(state_dict, prefix)
        if w.shape != (mod.out_features, mod.in_features):
            raise ValueError(f"{name}: checkpoint weight is {w.shape}, the module is "
                             f"{(mod.out_features, mod.in_features)}")
        bias = state_dict.get(prefix + "bias", mod.bias)
        device = mod.weight.device if mod.weight.device.type != "meta" else w.device
        _replace(model, name, NvFp4Linear.from_weight(w.to(device), None if bias is None else bias.to(device)))
        done.append(name)
    return done
