"""CUDA implementations of the kbit ops (registered on the ``lowbit::`` ops for device 'cuda')."""

from __future__ import annotations

import torch

from .. import ops
from ..formats import kbit, kbit_tiled
from .library import library_or_none as _library_or_none
from .library import ptr, stream_of


@ops.kbit_dequantize.register_kernel("cuda")
def _(planes, absmax, codebook, scale, bits, dtype):
    n, k_in = ops.check_kbit_dequantize_args(planes, absmax, codebook, scale, bits, dtype)
    lib = _library_or_none(planes.device)
    if lib is None:
        return kbit.dequantize_reference(planes, absmax, codebook, scale, bits, dtype)
    out = torch.empty((n, k_in), dtype=dtype, device=planes.device)
    args = [ptr(planes), ptr(absmax), ptr(codebook), ptr(scale), ptr(out), n * (k_in // kbit.BLOCK)]
    lib.call("kbit_dequant", [*args, stream_of(planes.device)], bits=bits, dtype=dtype)
    return out


@ops.kbit_linear.register_kernel("cuda")
def _(x, planes, absmax, codebook, scale, bits):
    # Dequantize (kernel) to x's dtype, then cuBLAS. Right for large M; decode-sized M gets a
    # fused GEMV once that kernel exists. Rounding W to fp16/bf16 before the product adds
    # at most one half-ulp per weight to the fp32 reference.
    m, n, k_in = ops.check_kbit_linear_args(x, planes, absmax, codebook, scale, bits)
    w = ops.kbit_dequantize(planes, absmax, codebook, scale, bits, x.dtype)
    return torch.nn.functional.linear(x, w)


# ------------------------------------------------------------------ GEMV (tiled layout)
_counters: dict[int, torch.Tensor] = {}
WARPS_PER_CTA = 8


def counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 split-K tile counters, one buffer per device; kernels reset what they use.

    Grown outside graph capture only (KbitWeight.to('cuda') sizes it); kernels sharing it must run
    on one stream at a time.
    """
    idx = device.index if device.index is not None else torch.cuda.current_device()
    buf = _counters.get(idx)
    if buf is None or buf.numel() < n:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("lowbit: split-K counters must be allocated before CUDA-graph capture; "
                               "run the layer once (or call KbitWeight.to('cuda')) before capturing")
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _counters[idx] = buf
    return buf


_occupancy: dict[tuple, int] = {}


def _aligned16(x: torch.Tensor) -> torch.Tensor:
    """The kernels read x with 16-byte loads: a view at an odd offset is copied to fresh memory."""
    return x if x.data_ptr() % 16 == 0 else x.clone()


def gemv_warps(lib, device: torch.device, bits: int, dtype: torch.dtype, m: int, n: int, k_in: int) -> int:
    """Warps for the stream-K GEMV: every resident warp of one full wave, but no more than units."""
    key = (device.index, bits, dtype, m)
    if key not in _occupancy:
        fn = lib.symbol("kbit_gemv_occupancy", bits=bits, dtype=dtype, m=m)
        _occupancy[key] = max(1, fn())
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles, groups = kbit_tiled.tiled_shape(n, k_in)
    return max(1, min(tiles * groups, _occupancy[key] * sms * WARPS_PER_CTA))


#: Dense GEMV kernel choice: "auto" (below), "streamk" or "split" (tuning / benchmarks).
DENSE_PATH = "auto"


def split_max_ctas(lib, device: torch.device, bits: int, dtype: torch.dtype, n_experts: int) -> int:
    """CTAs of the split-K kernel in one full wave (its shared memory grows with n_experts)."""
    key = ("split", device.index, bits, dtype, n_experts)
    if key not in _occupancy:
        fn = lib.symbol("kbit_split_gemv_occupancy", bits=bits, dtype=dtype)
        occ = fn(n_experts)
        if occ < 1:
            raise ValueError(f"lowbit: {n_experts} experts do not fit the grouped kernel's shared memory")
        _occupancy[key] = occ
    return _occupancy[key] * torch.cuda.get_device_properties(device).multi_processor_count


def split_items(n: int, k_in: int) -> int:
    """CTA items of the split-K kernel for one expert (mirrors split_for in csrc/kbit_gemv.cu)."""
    tiles, groups = kbit_tiled.tiled_shape(n, k_in)
    split = 1
    while split * 2 <= WARPS_PER_CTA and split * 2 <= groups:
        split *= 2
    per_item = WARPS_PER_CTA // split
    return -(-tiles // per_item)


#: Split-in-CTA while its items fill at most this many waves of CTAs. Measured on H100 (cold L2,
#: M=1, benchmarks/gemv_sweep.py): split wins at 2.4 waves (2048x10240: 10.3 vs 11.5 us at K=4),
#: stream-K wins at 3.4 (4096x14336: 18.0 vs 19.8 us) and beyond (8192x28672: 52.1 vs 58.3 us).
SPLIT_MAX_WAVES = 3


def use_split(lib, device, bits, dtype, n, k_in) -> bool:
    """Split-K inside a CTA for small and mid shapes: no atomics, no second pass, lowest fixed
    latency. Large shapes use stream-K, which balances any number of units over one wave of warps."""
    if DENSE_PATH != "auto":
        return DENSE_PATH == "split"
    return split_items(n, k_in) <= SPLIT_MAX_WAVES * split_max_ctas(lib, device, bits, dtype, 1)


@ops.kbit_gemv.register_kernel("cuda")
def _(x, qweight, qabsmax, codebook, scale, bits, n, k_in):
    m = ops.check_kbit_gemv_args(x, qweight, qabsmax, codebook, scale, bits, n, k_in)
    lib = _library_or_none(x.device)
    if lib is None:
        return ops.gemv_reference(x, qweight, qabsmax, codebook, scale, bits, n, k_in)
    x = _aligned16(x)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if use_split(lib, x.device, bits, x.dtype, n, k_in):
        args = [ptr(x), ptr(None), m, ptr(qweight), ptr(qabsmax), ptr(codebook), ptr(scale), ptr(y), 1, n, k_in,
                split_max_ctas(lib, x.device, bits, x.dtype, 1), stream_of(x.device)]
        lib.call("kbit_split_gemv", args, bits=bits, dtype=x.dtype)
        return y
    warps = gemv_warps(lib, x.device, bits, x.dtype, m, n, k_in)
    tiles, _ = kbit_tiled.tiled_shape(n, k_in)
    ws = torch.empty((warps, 2, 128), dtype=torch.float32, device=x.device)
    cnt = counters(x.device, tiles)
    args = [ptr(x), ptr(qweight), ptr(qabsmax), ptr(codebook), ptr(scale), ptr(y), ptr(ws), ptr(cnt),
            m, n, k_in, warps, stream_of(x.device)]
    lib.call("kbit_gemv", args, bits=bits, dtype=x.dtype, m=m)
    return y


@ops.kbit_grouped_gemv.register_kernel("cuda")
def _(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in):
    experts = ops.check_kbit_grouped_args(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    lib = _library_or_none(x.device)
    if lib is None:
        return ops.grouped_reference(x, expert_offsets, qweight, qabsmax, codebook, scales, bits, n, k_in)
    x = _aligned16(x)
    y = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return y
    max_ctas = split_max_ctas(lib, x.device, bits, x.dtype, experts)
    args = [ptr(x), ptr(expert_offsets), 0, ptr(qweight), ptr(qabsmax), ptr(codebook), ptr(scales), ptr(y),
            experts, n, k_in, max_ctas, stream_of(x.device)]
    lib.call("kbit_split_gemv", args, bits=bits, dtype=x.dtype)
    return y
