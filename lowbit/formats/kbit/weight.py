"""kbit weight objects: a quantized weight (or a stack of experts) with its GPU layout built once."""

from __future__ import annotations

import torch

from ..._checks import FLOAT_DTYPES, check_same_device, check_tensor
from . import tiled
from .definition import (BLOCK, check_bits, check_codebook, check_kbit_tensors, pack_planes, quantize_codes)



# --------------------------------------------------------------------------- weight object
class KbitWeight:
    """A kbit-quantized weight ``[N, K_in]``: planes, absmax codes, codebook, scale, bits."""

    __slots__ = ("planes", "absmax", "codebook", "scale", "bits", "_tiled", "_launcher")

    def __init__(self, planes, absmax, codebook, scale, bits):
        self.planes = planes
        self.absmax = absmax
        self.codebook = codebook
        self.scale = scale
        self.bits = bits
        self._tiled = None
        self._launcher = None  # the eager GEMV launcher lowbit.kbit_linear keeps for this weight
        check_kbit_tensors(planes, absmax, codebook, scale, bits)

    def tiled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(qweight, qabsmax) in the GPU layout (:mod:`.tiled`), built once and cached.

        Built eagerly by ``.to('cuda')``; call it before CUDA-graph capture otherwise.
        """
        if self._tiled is None:
            self._tiled = tiled.repack(self.planes, self.absmax, self.bits)
        return self._tiled

    @property
    def shape(self) -> tuple[int, int]:
        return (self.planes.shape[0], self.planes.shape[1] * BLOCK)

    @property
    def device(self) -> torch.device:
        return self.planes.device

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.planes, self.absmax, self.codebook, self.scale

    def to(self, device) -> "KbitWeight":
        w = KbitWeight(*(t.to(device) for t in self.tensors()), self.bits)
        if w.device.type == "cuda":
            w.tiled()  # the GEMV kernels' layout, built now rather than inside a captured graph
        return w

    def nbytes(self) -> int:
        """Bytes a kernel streams for this weight (planes + absmax)."""
        return self.planes.numel() * 4 + self.absmax.numel()

    def __repr__(self) -> str:
        n, k = self.shape
        return f"KbitWeight(shape=({n}, {k}), bits={self.bits}, device={self.device})"


def quantize(weight: torch.Tensor, bits: int = 4, codebook: torch.Tensor | None = None) -> KbitWeight:
    """Quantize ``weight[N, K_in]`` (fp16/bf16/fp32, finite, K_in % 32 == 0) to kbit."""
    check_bits(bits)
    check_tensor("weight", weight, dtypes=FLOAT_DTYPES, dim=2, contiguous=False)
    codes, absmax, codebook, scale = quantize_codes(weight, bits, codebook)
    return KbitWeight(pack_planes(codes, bits).contiguous(), absmax, codebook, scale, bits)


# --------------------------------------------------------------------------- MoE experts
class KbitExperts:
    """E experts' kbit weights ``[E, N, K_in]`` sharing one codebook, one fp32 scale per expert."""

    __slots__ = ("planes", "absmax", "codebook", "scales", "bits", "_tiled")

    def __init__(self, planes, absmax, codebook, scales, bits):
        check_bits(bits)
        check_tensor("planes", planes, dtypes=(torch.int32,), dim=4)
        check_tensor("absmax", absmax, dtypes=(torch.uint8,), dim=3)
        check_tensor("scales", scales, dtypes=(torch.float32,), dim=1)
        if tuple(absmax.shape) != tuple(planes.shape[:3]) or planes.shape[3] != bits or scales.shape[0] != planes.shape[0]:
            raise ValueError(f"inconsistent expert tensors: planes {tuple(planes.shape)}, absmax {tuple(absmax.shape)}, "
                             f"scales {tuple(scales.shape)}, bits {bits}")
        check_codebook(codebook, bits)
        check_same_device(planes=planes, absmax=absmax, codebook=codebook, scales=scales)
        self.planes, self.absmax, self.codebook, self.scales, self.bits = planes, absmax, codebook, scales, bits
        self._tiled = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.planes.shape[0], self.planes.shape[1], self.planes.shape[2] * BLOCK)

    @property
    def device(self) -> torch.device:
        return self.planes.device

    def expert(self, e: int) -> KbitWeight:
        return KbitWeight(self.planes[e], self.absmax[e], self.codebook, self.scales[e], self.bits)

    def tiled(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tiled is None:
            self._tiled = tiled.repack(self.planes, self.absmax, self.bits)
        return self._tiled

    def to(self, device) -> "KbitExperts":
        out = KbitExperts(self.planes.to(device), self.absmax.to(device), self.codebook.to(device),
                          self.scales.to(device), self.bits)
        if out.planes.device.type == "cuda":
            out.tiled()
        return out

    def nbytes(self) -> int:
        return self.planes.numel() * 4 + self.absmax.numel()

    def __repr__(self) -> str:
        e, n, k = self.shape
        return f"KbitExperts(experts={e}, shape=({n}, {k}), bits={self.bits}, device={self.planes.device})"


def quantize_experts(weights: torch.Tensor, bits: int = 4, codebook: torch.Tensor | None = None) -> KbitExperts:
    """Quantize stacked expert weights ``[E, N, K_in]``; each expert gets its own tensor scale."""
    check_tensor("weights", weights, dtypes=FLOAT_DTYPES, dim=3, contiguous=False)
    if weights.shape[0] == 0:
        raise ValueError("weights must hold at least one expert")
    codes, absmax, codebook, scales = quantize_codes(weights, bits, codebook)
    return KbitExperts(pack_planes(codes, bits).contiguous(), absmax, codebook, scales, bits)
