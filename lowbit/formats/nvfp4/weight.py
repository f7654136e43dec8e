"""NVFP4 weight objects: ``NvFp4Weight`` (the checkpoint layout, with the kernels' tiled copy made
once) and ``NvFp4Experts`` (a stack of experts in the tiled layout), and the checkpoint conventions."""

from __future__ import annotations

import torch

from ..._checks import FLOAT_DTYPES, check_finite, check_tensor
from . import tiled
from .definition import (BLOCK, E2M1_MAX, E4M3_MAX, check_nvfp4_tensors, dequantize_reference, encode_e2m1,
                         encode_e4m3, from_blocked, pack, scale_2_from, to_blocked)
from .tiled import SCALE_BYTES, tiled_shape



class NvFp4Weight:
    """An NVFP4 weight: ``packed`` uint8 [N, K/2], ``scales`` float8_e4m3fn [N, K/16] (plain layout),
    ``scale_2`` fp32 scalar (the multiplier). See the module doc."""

    __slots__ = ("packed", "scales", "scale_2", "_tiled")

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, scale_2: torch.Tensor):
        check_nvfp4_tensors(packed, scales, scale_2)
        self.packed, self.scales, self.scale_2 = packed, scales, scale_2.reshape(())
        self._tiled = None

    def tiled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(qweight, qscales) in the kernels' layout (:mod:`.tiled`), made once and kept."""
        if self._tiled is None:
            self._tiled = tiled.pack(self)
        return self._tiled

    @classmethod
    def from_tensors(cls, packed, scales, global_scale, *, convention: str, scale_layout: str = "plain",
                     k: int | None = None) -> "NvFp4Weight":
        """From a checkpoint's tensors: ``convention`` names the global scale's meaning ("modelopt" or
        "inverse", required); ``scale_layout`` "plain" ([N, K/16]) or "blocked" (flat swizzled, then
        ``k`` -- the input width -- is required)."""
        if scale_layout == "blocked":
            if k is None:
                raise ValueError("scale_layout='blocked' needs k (the weight's input width)")
            if k % BLOCK:
                raise ValueError(f"k must be a multiple of {BLOCK}, got {k}")
            scales = from_blocked(scales, packed.shape[0], k // BLOCK)
        elif scale_layout != "plain":
            raise ValueError(f"scale_layout must be 'plain' or 'blocked', got {scale_layout!r}")
        return cls(packed, scales, scale_2_from(global_scale, convention).to(packed.device))

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2

    @property
    def device(self) -> torch.device:
        return self.packed.device

    def global_scale(self, convention: str) -> torch.Tensor:
        """The tensor scale as ``convention`` stores it."""
        scale_2_from(1.0, convention)  # validates the name
        return self.scale_2.clone() if convention == "modelopt" else torch.reciprocal(self.scale_2)

    def blocked_scales(self) -> torch.Tensor:
        return to_blocked(self.scales)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.packed, self.scales, self.scale_2

    def to(self, device) -> "NvFp4Weight":
        return NvFp4Weight(self.packed.to(device), self.scales.to(device), self.scale_2.to(device))

    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() + 4

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_reference(self.packed, self.scales, self.scale_2, dtype)

    def __repr__(self) -> str:
        n, k = self.shape
        return f"NvFp4Weight(shape=({n}, {k}), scale_2={self.scale_2.item():.4g}, device={self.device})"


def quantize(weight: torch.Tensor) -> NvFp4Weight:
    """NVFP4 of a float weight ``[N, K]`` (K a multiple of 16) on its device, as the module doc says."""
    check_tensor("weight", weight, dtypes=FLOAT_DTYPES, dim=2)
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"K (weight.shape[1]) must be a multiple of {BLOCK} for NVFP4, got {k}")
    check_finite("weight", weight)
    w = weight.to(torch.float32)
    amax = w.abs().amax() if w.numel() else torch.zeros((), device=w.device)
    scale_2 = (amax / (E2M1_MAX * E4M3_MAX)) if amax > 0 else torch.ones((), device=w.device)
    scale_2 = scale_2.to(torch.float32)
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    scales = encode_e4m3((blocks.abs().amax(dim=-1) / E2M1_MAX) / scale_2)
    step = scales.to(torch.float32) * scale_2
    safe = torch.where(step > 0, step, torch.ones_like(step))
    scaled = torch.where(step[..., None] > 0, blocks / safe[..., None], torch.zeros_like(blocks))
    codes = encode_e2m1(scaled).reshape(n, k)
    return NvFp4Weight(pack(codes), scales, scale_2)


def linear_reference(x: torch.Tensor, w: NvFp4Weight) -> torch.Tensor:
    """``x @ W^T`` in fp32 from the reference dequantization, rounded once to x's dtype."""
    y = x.to(torch.float32) @ w.dequantize(torch.float32).to(x.device).t()
    return y.to(x.dtype)


# ------------------------------------------------------------------ checkpoint layouts
#: tensor names per linear (after the module prefix) in the two checkpoint conventions
MODELOPT_KEYS = ("weight", "weight_scale", "weight_scale_2")
COMPRESSED_TENSORS_KEYS = ("weight_packed", "weight_scale", "weight_global_scale")


def from_state_dict(state: dict, prefix: str = "") -> NvFp4Weight:
    """One linear's NVFP4 weight from a checkpoint state dict: ModelOpt's ``{prefix}weight`` (uint8)
    + ``weight_scale`` (fp8) + ``weight_scale_2`` (fp32 multiplier), or compressed-tensors'
    ``{prefix}weight_packed`` + ``weight_scale`` + ``weight_global_scale`` (fp32 inverse). The key
    names say which convention applies; a dict with both or neither is refused."""
    has_mo = all(prefix + k in state for k in MODELOPT_KEYS)
    has_ct = all(prefix + k in state for k in COMPRESSED_TENSORS_KEYS)
    if has_mo == has_ct:
        raise ValueError(f"{prefix!r}: expected exactly one NVFP4 layout: ModelOpt {MODELOPT_KEYS} or "
                         f"compressed-tensors {COMPRESSED_TENSORS_KEYS} (got keys "
                         f"{sorted(k for k in state if k.startswith(prefix))})")
    if has_mo:
        packed, scales, g = (state[prefix + k] for k in MODELOPT_KEYS)
        return NvFp4Weight.from_tensors(packed, scales, g, convention="modelopt")
    packed, scales, g = (state[prefix + k] for k in COMPRESSED_TENSORS_KEYS)
    return NvFp4Weight.from_tensors(packed, scales, g, convention="inverse")


def to_state_dict(w: NvFp4Weight, layout: str, prefix: str = "") -> dict:
    """The tensors a checkpoint of ``layout`` ("modelopt" or "compressed-tensors") holds for ``w``."""
    if layout == "modelopt":
        return {prefix + "weight": w.packed, prefix + "weight_scale": w.scales,
                prefix + "weight_scale_2": w.global_scale("modelopt")}
    if layout == "compressed-tensors":
        return {prefix + "weight_packed": w.packed, prefix + "weight_scale": w.scales,
                prefix + "weight_global_scale": w.global_scale("inverse").reshape(1)}
    raise ValueError(f"layout must be 'modelopt' or 'compressed-tensors', got {layout!r}")




def from_tiled(qweight: torch.Tensor, qscales: torch.Tensor, scale_2: torch.Tensor, n: int, k: int) -> NvFp4Weight:
    """The :class:`NvFp4Weight` a tiled pair holds."""
    return NvFp4Weight(tiled.unpack_codes(qweight, n, k), tiled.unpack_scales(qscales, n, k), scale_2)


def dequantize_tiled(qweight, qscales, scale_2, n: int, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dense ``[n, k]`` straight from the tiled layout (the reference's arithmetic)."""
    return from_tiled(qweight, qscales, scale_2, n, k).dequantize(dtype)


class NvFp4Experts:
    """A stack of E NVFP4 expert weights ``[E, N, K]`` in the tiled layout, for the grouped (MoE) GEMV:
    ``qweight`` int32 [E, T, G, 4, 32, 4], ``qscales`` uint8 [E, T, G, 256], ``scale_2`` fp32 [E]."""

    def __init__(self, qweight: torch.Tensor, qscales: torch.Tensor, scale_2: torch.Tensor, n: int, k: int):
        t_count, g_count = tiled_shape(n, k)
        e = qweight.shape[0]
        if tuple(qweight.shape) != (e, t_count, g_count, 4, 32, 4) or tuple(qscales.shape) != (e, t_count, g_count, SCALE_BYTES):
            raise ValueError(f"qweight / qscales must be {(e, t_count, g_count, 4, 32, 4)} / {(e, t_count, g_count, SCALE_BYTES)}, "
                             f"got {tuple(qweight.shape)} / {tuple(qscales.shape)}")
        if scale_2.dtype != torch.float32 or tuple(scale_2.shape) != (e,):
            raise ValueError(f"scale_2 must be fp32 [{e}], got {scale_2.dtype} {tuple(scale_2.shape)}")
        self.qweight, self.qscales, self.scale_2, self.n, self.k = qweight, qscales, scale_2, n, k

    @classmethod
    def from_weights(cls, weights) -> "NvFp4Experts":
        """Stack :class:`NvFp4Weight` experts of one shape (repacked to the tiled layout)."""
        weights = list(weights)
        if not weights or any(not isinstance(w, NvFp4Weight) for w in weights):
            raise TypeError("weights must be a non-empty sequence of NvFp4Weight")
        shapes = {w.shape for w in weights}
        if len(shapes) != 1:
            raise ValueError(f"experts must share one shape, got {sorted(shapes)}")
        n, k = weights[0].shape
        packed = [tiled.pack(w) for w in weights]
        return cls(torch.stack([q for q, _ in packed]), torch.stack([s for _, s in packed]),
                   torch.stack([w.scale_2.reshape(()) for w in weights]).to(torch.float32), n, k)

    @property
    def experts(self) -> int:
        return self.qweight.shape[0]

    def weight(self, e: int) -> NvFp4Weight:
        return from_tiled(self.qweight[e], self.qscales[e], self.scale_2[e], self.n, self.k)

    def to(self, device) -> "NvFp4Experts":
        return NvFp4Experts(self.qweight.to(device), self.qscales.to(device), self.scale_2.to(device), self.n, self.k)
