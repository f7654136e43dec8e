"""``KbitLinear``: a drop-in for ``nn.Linear`` whose weight is stored in kbit.

The module holds only what the kernels read: the tiled GPU layout (``qweight``, ``qabsmax``;
see ``lowbit/formats/kbit/tiled.py``), the codebook and the fp32 tensor scale -- on every
device, so a model moves between CPU and GPU without repacking and its state dict is the
saved format. The CPU forward decodes the same bytes with the reference.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import dispatch
from ..formats import kbit
from ..formats.kbit import columns as kbit_columns
from ..formats.kbit import rotation as kbit_rotation
from ..formats.kbit import tiled as kbit_tiled
from .base import QuantizedModule, describe


def quantized_codes(weight: torch.Tensor, bits: int, codebook, quantized: tuple | None):
    """``kbit.quantize_codes(weight, ...)``, or ``quantized`` (codes, absmax, codebook, scale) checked
    against the weight's shape."""
    if quantized is None:
        return kbit.quantize_codes(weight.detach(), bits, codebook)
    codes, absmax, codebook, scale = quantized
    lead, (n, k) = weight.shape[:-2], weight.shape[-2:]
    if tuple(codes.shape) != (*lead, n, k // kbit.BLOCK, kbit.BLOCK) or tuple(absmax.shape) != (*lead, n, k // kbit.BLOCK):
        raise ValueError(f"quantized codes {tuple(codes.shape)} / absmax {tuple(absmax.shape)} do not fit a weight "
                         f"of shape {tuple(weight.shape)}")
    if codebook.numel() != 2**bits or (codes.numel() and int(codes.max()) >= 2**bits):
        raise ValueError(f"quantized codes / codebook are not {bits}-bit")
    return codes, absmax, codebook, scale


def _check_features(in_features: int, out_features: int) -> None:
    if not (isinstance(in_features, int) and isinstance(out_features, int) and in_features > 0 and out_features > 0):
        raise ValueError(f"in_features and out_features must be positive ints, got {in_features}, {out_features}")
    if in_features % kbit.BLOCK:
        raise ValueError(f"kbit needs in_features % {kbit.BLOCK} == 0, got in_features={in_features}")
    if in_features >= 2**31 or out_features >= 2**31:
        raise ValueError(f"features must be < 2^31, got {in_features}, {out_features}")


def apply_keeping_dtypes(module: nn.Module, apply, fn, recurse: bool, names) -> None:
    """``apply(fn, recurse)`` (nn.Module._apply) that moves the buffers ``names`` to the new device but
    keeps their dtypes: the format's own tensors survive ``model.half()`` and friends."""
    keep = {k: module._buffers[k] for k in names}
    apply(fn, recurse)
    for k, old in keep.items():
        new = module._buffers[k]
        if new.dtype != old.dtype:
            module._buffers[k] = old.to(new.device)


def check_kbit_values(name: str, staged: dict, scale_keys) -> None:
    """Values the kbit kernels trust: codebook finite, distinct, in [-1, 1]; scales finite and > 0."""
    cb = staged[f"{name}.codebook"]
    if not bool(torch.isfinite(cb).all()) or bool((cb.abs() > 1).any()) or cb.unique().numel() != cb.numel():
        raise ValueError(f"tensor {name + '.codebook'!r}: codebook values must be finite, distinct and in [-1, 1]")
    for k in scale_keys:
        s = staged[f"{name}.{k}"]
        if not bool(torch.isfinite(s).all()) or bool((s <= 0).any()):
            raise ValueError(f"tensor {name + '.' + k!r}: scales must be finite and > 0")


class KbitLinear(QuantizedModule):
    """``y = x @ W^T + b`` with W in kbit (K = 2..5 bits, blocks of 32, E4M4 absmax).

    Build one with :meth:`from_linear`; ``KbitLinear(in, out, bias, bits)`` makes an empty
    skeleton that ``load_state_dict`` / :func:`lowbit.load_quantized` fills. Output dtype = x's
    dtype (fp16/bf16/fp32); accumulation in fp32. Inference only (no autograd through W).
    On CPU (the reference path) the module decodes its weight to fp32 on the first call and keeps
    that copy: CPU runs are for checking and demos, the compact format is for the GPU kernels.
    """

    _QUANT_BUFFERS = ("qweight", "qabsmax", "codebook", "scale")
    format_name = "kbit"
    k_multiple = kbit.BLOCK

    def __init__(self, in_features: int, out_features: int, bias: bool = True, bits: int = 4, *,
                 device=None, dtype: torch.dtype | None = None, rotation: int = 0):
        super().__init__()
        _check_features(in_features, out_features)
        self.bits = kbit.check_bits(bits)
        # 32: the stored weight is W H (block-32 Hadamard) and inputs are rotated the same way (formats/kbit/rotation.py)
        self.rotation = kbit_rotation.check_rotation(rotation)
        self.in_features, self.out_features = in_features, out_features
        tiles, groups = kbit_tiled.tiled_shape(out_features, in_features)
        self.register_buffer("qweight", torch.zeros((tiles, groups, bits, 32, 4), dtype=torch.int32, device=device))
        self.register_buffer("qabsmax", torch.zeros((tiles, groups, 128), dtype=torch.uint8, device=device))
        self.register_buffer("codebook", kbit.normal_float_codebook(bits).to(device))
        self.register_buffer("scale", torch.ones((), dtype=torch.float32, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._launcher = None
        self._cpu_weight = None  # (qweight it was decoded from, fp32 weight): the CPU path's cache

    column_quantizer = kbit_columns.ColumnQuantizer
    rotations = kbit_rotation.ROTATIONS

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, codebook: torch.Tensor | None = None,
                    quantized: tuple | None = None, rotation: int = 0) -> "KbitLinear":
        """Quantize an ``nn.Linear`` (on its device: a GPU quantizes in milliseconds). ``quantized``:
        ``(codes, absmax, codebook, scale)`` already chosen (a calibration's result, of the rotated weight
        when ``rotation``) instead of rounding. ``rotation=32``: store ``W H`` (block-32 Hadamard)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        w = linear.weight
        _check_features(w.shape[1], w.shape[0])
        kbit_rotation.check_rotation(rotation)
        if rotation and quantized is None:
            w = kbit_rotation.rotate(w.detach().to(torch.float32))
        codes, absmax, codebook, scale = quantized_codes(w, bits, codebook, quantized)
        qweight, qabsmax = kbit_tiled.pack_codes(codes, absmax, bits)
        del codes
        mod = cls(w.shape[1], w.shape[0], bias=linear.bias is not None, bits=bits, device="meta", rotation=rotation)
        mod.set_quantized(qweight, qabsmax, codebook, scale)
        if linear.bias is not None:
            mod.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return mod

    def set_quantized(self, qweight, qabsmax, codebook, scale) -> None:
        """Install quantized tensors (checked against this module's shape and bits)."""
        from .. import ops

        ops.check_tiled_args(qweight, qabsmax, codebook, scale, self.bits, self.out_features, self.in_features)
        kbit._check_codebook_values(codebook)
        self._buffers.update(qweight=qweight, qabsmax=qabsmax, codebook=codebook, scale=scale)
        self._launcher = self._cpu_weight = None

    # -- forward ---------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.in_features
        if x.shape[-1] != k:
            raise ValueError(f"x must have shape [..., in_features={k}], got {tuple(x.shape)}")
        if not x.is_contiguous():
            x = x.contiguous()
        if x.is_cuda and not torch.compiler.is_compiling():
            # Eager decode: straight to the kernel (a few us of CPU; see dispatch.eager_launcher).
            m = x.numel() // k
            if dispatch.use_gemv(True, x.dtype, m):
                launch = self._launcher
                if launch is None or launch.tensors[0] is not self._buffers["qweight"] or launch.index != x.get_device():
                    launch = self._launcher = dispatch.eager_launcher("gemv", self._buffers, self.bits, self.out_features,
                                                                      k, x, self.rotation)
                if launch is not None:
                    out_shape = (*x.shape[:-1], self.out_features)
                    bias = self.bias
                    if bias is None or dispatch.fusable_bias(bias, x):
                        return launch(x, m, out_shape, bias)  # bias added in the kernel, one rounding
                    return launch(x, m, out_shape).add_(bias)
        b = self._buffers
        if not x.is_floating_point():
            raise TypeError(f"x must have dtype in (float16, bfloat16, float32), got {str(x.dtype).removeprefix('torch.')}")
        if x.device.type == "cpu" and not torch.compiler.is_compiling():
            # CPU runs the reference; decoding the weight once instead of per call keeps CPU
            # generation bearable (the same fp32 product, bias, one rounding as the op).
            cached = self._cpu_weight
            if cached is None or cached[0] is not b["qweight"]:
                cached = self._cpu_weight = (b["qweight"], self.dequantize(torch.float32))
            bias = None if self.bias is None else self.bias.to(torch.float32)
            return torch.nn.functional.linear(x.to(torch.float32), cached[1], bias).to(x.dtype)
        # rotation: the GEMV rotates x in registers, the other paths in PyTorch (dispatch); the CPU path
        # above decodes W itself
        y = dispatch.kbit_tiled_linear_op(x.reshape(-1, k), b["qweight"], b["qabsmax"], b["codebook"], b["scale"],
                                          self.bits, self.out_features, k, self.bias, self.rotation)
        return y.view(*x.shape[:-1], self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight ``[out_features, in_features]`` as the reference decodes it (rotated back to x's space
        when the module stores a rotated weight)."""
        w = kbit_tiled.dequantize(self.qweight, self.qabsmax, self.codebook, self.scale, self.bits,
                                  self.out_features, self.in_features, torch.float32 if self.rotation else dtype)
        return kbit_rotation.rotate(w).to(dtype) if self.rotation else w

    @classmethod
    def check_options(cls, bits: int = 4, codebook=None) -> None:
        kbit.check_bits(bits)

    # -- checkpoints (lowbit.model.checkpoint) -----------------------------------------------
    def checkpoint_config(self) -> dict:
        return {"bits": self.bits, "in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias is not None, **({"rotation": self.rotation} if self.rotation else {})}

    @classmethod
    def from_checkpoint_config(cls, name: str, cfg: dict, old: nn.Module) -> "KbitLinear":
        n, k, bias = cfg["out_features"], cfg["in_features"], cfg["bias"]
        if isinstance(old, (nn.Linear, KbitLinear)) and (old.out_features, old.in_features, old.bias is not None) == (n, k, bias):
            return cls(k, n, bias=bias, bits=cfg["bits"], device="meta", rotation=cfg.get("rotation", 0))
        raise ValueError(f"saved {cls.__name__}({k} -> {n}, bias={bias}) does not fit this model's {describe(old)}")

    def compact_pairs(self):
        # stored as bit planes + absmax (exactly bits + 1/4 per weight), held in the tiled GPU layout
        return [("qweight", "qabsmax", "planes", "absmax", self.out_features, self.in_features)]

    def compact_shapes(self, n: int, k_in: int):
        return (n, k_in // kbit.BLOCK, self.bits), (n, k_in // kbit.BLOCK)

    def to_compact(self, codes, scales, n: int, k_in: int):
        return kbit_tiled.unpack(codes, scales, self.bits, n, k_in)

    def from_compact(self, planes, absmax):
        return kbit_tiled.repack_in_chunks(planes, absmax, self.bits)

    def check_checkpoint_values(self, name: str, staged: dict) -> None:
        check_kbit_values(name, staged, ["scale"])

    def tensors_changed(self) -> None:
        self._launcher = self._cpu_weight = None

    def tp_read_slices(self, style: str, rank: int, world: int) -> dict[str, list[tuple]]:
        """The index ranges of the tiled buffers that rank ``rank``'s part (:meth:`tp_shard`) is cut from: whole
        tiles of 16 rows around each projection's rows (colwise), or whole 256-column groups around its
        columns (rowwise) -- what a rank must read of a saved checkpoint, and no more."""
        tn, gk = kbit_tiled.TILE_N, kbit_tiled.GROUP_K
        if style == "colwise":
            idx, o = [], 0
            for n in list(getattr(self, "out_sizes", None) or [self.out_features]):
                lo, hi = o + rank * (n // world), o + (rank + 1) * (n // world)
                idx.append((slice(lo // tn, -(-hi // tn)),))
                o += n
        elif style == "rowwise":
            part = self.in_features // world
            lo, hi = rank * part, (rank + 1) * part
            idx = [(slice(None), slice(lo // gk, -(-hi // gk)))]
        else:
            raise ValueError(f"style must be 'colwise' or 'rowwise', got {style!r}")
        return {"qweight": idx, "qabsmax": idx}

    def _tp_part(self, rows, cols, out_sizes):
        planes, absmax = self.to_compact(self.qweight, self.qabsmax, self.out_features, self.in_features)
        if rows is not None:
            rows = rows.to(planes.device)
            planes, absmax = planes[rows], absmax[rows]
        b0, b1 = (cols[0] // kbit.BLOCK, cols[1] // kbit.BLOCK) if cols else (0, planes.shape[1])
        planes, absmax = planes[:, b0:b1].contiguous(), absmax[:, b0:b1].contiguous()
        k, bias = (b1 - b0) * kbit.BLOCK, self.bias is not None
        if len(out_sizes) > 1:  # a fused module: the same parts, each split
            new = type(self)(k, out_sizes, bias=bias, bits=self.bits, device="meta", rotation=self.rotation)
            new.part_names = self.part_names
        else:
            new = KbitLinear(k, out_sizes[0], bias=bias, bits=self.bits, device="meta", rotation=self.rotation)
        new.set_quantized(*self.from_compact(planes, absmax), self.codebook, self.scale)
        if bias:
            b = self.bias.detach()
            new.bias = nn.Parameter((b[rows.to(b.device)] if rows is not None else b).clone(), requires_grad=False)
        new.train(self.training)
        return new

    # -- bookkeeping -------------------------------------------------------------------------
    def format_bytes(self) -> int:
        """Nominal bytes of the kbit format: (bits + 8/32) per weight."""
        return self.out_features * self.in_features * self.bits // 8 + self.out_features * self.in_features // 32

    def _apply(self, fn, recurse=True):
        # Device moves apply to everything; dtype casts (model.half(), .to(bfloat16)) must not
        # touch the fp32 codebook and scale, which are part of the format.
        apply_keeping_dtypes(self, super()._apply, fn, recurse, ("codebook", "scale"))
        self._launcher = self._cpu_weight = None
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, bits={self.bits}" + (f", rotation={self.rotation}" if self.rotation else ""))
