"""Launch planning for the tiled tensor-core kernels, shared by every format stored in the tiled
layout (kbit; NVFP4, whose codes use kbit's K=4 tiles): GEMV (stream-K and split-K), GEMM, grouped
(MoE) GEMV / GEMM, and the per-weight launchers that make every decision once.

A :class:`TiledFormat` says which compiled instances a weight runs: ``csrc`` exports them as
``<name>_gemv``, ``<name>_split_gemv``, ``<name>_gemm``, ... with the format's own parameters
(kbit: its ``bits``). The format's tensors keep their meaning: ``qweight`` (codes), ``qscales``
(per-block scales: kbit's E4M4 absmax, NVFP4's E4M3), ``values`` (the lookup values: kbit's codebook,
the 16 E2M1 values) and ``scale`` (the fp32 tensor scale, one per expert for a stack).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from ..formats.kbit import tiled as kbit_tiled  # the tile geometry every tiled format shares
from ..ops.common import GEMV_MAX_M, swiglu_reference
from . import picks
from .device import gpu_name, pdl_enabled, pdl_supported
from .library import ptr, stream_of

_P, _I = ctypes.c_void_p, ctypes.c_int


def tiled_signatures(name: str, grouped_gemm: bool = False, routed: bool = False, bulk: bool = False) -> dict[str, list]:
    """The C signatures of a format's instances of the tiled kernels (``csrc/tiled/``), for
    :func:`~lowbit.kernels.library.register_signatures`."""
    out = {
        # x, qweight, qscales, values, scale, y, bias (null: none), workspace, counters, m, n, k_in, n_warps,
        # flags, epilogue (lowbit_epilogue*, null: none), stream
        f"{name}_gemv": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _P],
        f"{name}_gemv_occupancy": [],
        f"{name}_gemv_swiglu_pairs": [],  # tile pairs a SwiGLU epilogue CTA holds at most on the current device
        # x, expert_offsets (null: dense), m_dense, qweight, qscales, values, scales, y, bias ([n_experts, n]
        # or null), n_experts, n, k_in, max_ctas, flags, epilogue (dense only; null: none), stream
        f"{name}_split_gemv": [_P, _P, _I, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _P],
        f"{name}_split_gemv_occupancy": [_I],
        # x, qweight, qscales, values, scale, y, bias (null: none), workspace, counters, m, n, k_in, splits, stream
        f"{name}_gemm": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _P],
        f"{name}_gemm_occupancy": [],
    }
    if bulk:
        # x, qweight, qscales, values, scale, y, bias (null: none), m (1..8), n, k_in, ctas, flags (PDL only), epilogue
        # (lowbit_epilogue*, null: none; SwiGLU only alone, on N % 32 == 0 rows), stream
        out[f"{name}_bulk_gemv"] = [_P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P, _P]
        # n, ctas, swiglu, m -> the ring's stages (0: it does not fit)
        out[f"{name}_bulk_gemv_ring"] = [_I, _I, _I, _I]
    if routed:
        # x, route ids int64 [count], count, rows per x row, qweight, qscales, values, scales [E], y, n_experts, n,
        # k_in, max_ctas, pdl (0/1), stream
        out[f"{name}_routed_gemv"] = [_P, _P, _I, _I, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P]
        # n_experts, routes, k_in -> 1 where the routed GEMV's own SiLU-mul (flag bit 5) fits the current device
        out[f"{name}_routed_act_fits"] = [_I, _I, _I]
    if grouped_gemm:
        # x, expert_offsets int64 [E + 1], qweight, qscales, values, scales [E], y, bias ([E, n] or null),
        # n_experts, n, k_in, ctas, stream
        out[f"{name}_grouped_gemm"] = [_P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _P]
        out[f"{name}_grouped_gemm_occupancy"] = [_I]
    return out


@dataclass(frozen=True)
class TiledFormat:
    """A weight format's instances of the tiled kernels: symbol prefix + leading symbol parameters."""

    name: str
    params: tuple = ()

    def symbol(self, op: str) -> tuple[str, dict]:
        """(symbol op, its leading parameters) of a kernel family: ``("kbit_gemv", {"bits": 4})``."""
        return f"{self.name}_{op}", dict(self.params)


def kbit_format(bits: int) -> TiledFormat:
    return TiledFormat("kbit", (("bits", int(bits)),))


NVFP4 = TiledFormat("nvfp4")


def tiled_format(fmt) -> TiledFormat:
    """``fmt`` as a :class:`TiledFormat`; an int is kbit's number of bits."""
    if isinstance(fmt, TiledFormat):
        return fmt
    if isinstance(fmt, int) and not isinstance(fmt, bool):
        return kbit_format(fmt)
    raise TypeError(f"fmt must be a TiledFormat or kbit's bits (int), got {fmt!r}")


# The GEMV launchers' `flags` (csrc/tiled/gemv.cuh): bit 0 PDL, bit 1 the block-32 rotation.
FLAG_ROT32 = 2
#: The stream-K GEMV's CTA-local mode (csrc/tiled/gemv.cuh): each CTA owns whole tiles.
FLAG_LOCAL = 4
#: The stream-K GEMV reads x from global memory even where it would stage a shared copy (kbit K <= 3;
#: comparisons and tests only).
FLAG_GLOBAL_X = 8
#: Whether the stream-K GEMV may stage x in shared memory where it pays (kbit K <= 3, csrc kStageX);
#: False passes FLAG_GLOBAL_X (comparisons: ``benchmarks/e2e_gpu.py --no-stage-x``).
STAGE_X = True
#: Where it may, the stream-K GEMV stages x only if every warp has at least this many units (16 x 256 weights) to run:
#: with fewer, the copy's L2 round trip and barrier come before the warp's only unit, which would have read its x
#: itself as soon. H100, cold, us staged / from global memory
#: (benchmarks/journal/2026-11-27_x_staging_rule_and_torch_int4.md): 2048x5120 (1.2 units per warp) K = 3 M = 1
#: 6.07 / 5.80, K = 2 M = 4 6.94 / 5.74; 2048x10240 (2.4) K = 3 M = 1 7.36 / 7.86; 4096x6144 (2.9) K = 2 M = 1
#: 8.26 / 8.84; 4096x28672 (13.6) K = 2 M = 2 19.07 / 21.63.
STAGE_X_MIN_UNITS = 2


def x_flag(units: int, warps: int) -> int:
    """FLAG_GLOBAL_X where a stream-K GEMV of ``units`` units on ``warps`` warps reads x from global memory rather
    than from a shared copy (:data:`STAGE_X`, :data:`STAGE_X_MIN_UNITS`); 0 where it may stage it (kbit K <= 3)."""
    return 0 if STAGE_X and units >= STAGE_X_MIN_UNITS * warps else FLAG_GLOBAL_X


_FLAG_ARGS = tuple(ctypes.c_int(i) for i in range(64))  # bits 1-5: a kernel family's own flags


def _pdl_arg(supported: bool, flags: int = 0) -> ctypes.c_int:
    """The launch flags of this call: ``flags`` plus programmatic dependent launch when
    ``lowbit.programmatic_launch()`` / LOWBIT_PDL asks for it and the device has it (sm_90+)."""
    return _FLAG_ARGS[flags | int(pdl_enabled() and supported)]


def fusable_bias(bias: torch.Tensor, x: torch.Tensor) -> bool:
    """The kernels add a bias of x's dtype, contiguous, in fp32 before rounding; any other bias is
    added after them."""
    return bias.dtype == x.dtype and bias.is_contiguous()


class Epilogue(ctypes.Structure):
    """``lowbit_epilogue`` (csrc/lowbit.h): the decode step's glue fused into a GEMV's output --
    ``y = (x W^T) * rsqrt(mean(rms_x^2) + eps) + bias + residual`` (one rounding), and
    ``yw = round(y * norm_weight)``; null pointers leave a part out. ``swiglu``: the weight's rows are
    ``[gate; up]`` and ``y = silu(gate) * up`` (``[M, N / 2]``; the CTA-local stream-K GEMV only)."""

    _fields_ = [("rms_x", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("norm_weight", ctypes.c_void_p),
                ("yw", ctypes.c_void_p), ("eps", ctypes.c_float), ("swiglu", ctypes.c_int)]


def epilogue(rms_x=None, eps: float = 0.0, residual=None, norm_weight=None, yw=None, swiglu: bool = False) -> Epilogue:
    """An :class:`Epilogue` over these tensors (contiguous, on the GEMV's device; the caller keeps them
    alive until the launch is queued)."""
    def p(t):
        return None if t is None else t.data_ptr()

    return Epilogue(p(rms_x), p(residual), p(norm_weight), p(yw), float(eps), int(swiglu))


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


def gemv_instance(m: int) -> int:
    """The compiled stream-K GEMV instance for M rows: 1..4 each their own, 5..8 share the M=8 one
    (the MMA covers 8 tokens either way)."""
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"the GEMV takes 1..{GEMV_MAX_M} rows, got {m}")
    return m if m <= 4 else GEMV_MAX_M


#: Warps per CTA of the stream-K kernel (kStreamWarps in csrc/tiled/gemv.cuh).
STREAM_CTA_WARPS = 16


def _stream_resident_warps(lib, device: torch.device, fmt, dtype: torch.dtype, m: int) -> int:
    """Resident warps of the stream-K kernel on the whole GPU (one wave)."""
    m = gemv_instance(m)
    fmt = tiled_format(fmt)
    key = (device.index, fmt, dtype, m)
    if key not in _occupancy:
        op, sym = fmt.symbol("gemv_occupancy")
        fn = lib.symbol(op, **sym, dtype=dtype, m=m)
        _occupancy[key] = max(STREAM_CTA_WARPS, fn())  # resident warps per SM
    return _occupancy[key] * torch.cuda.get_device_properties(device).multi_processor_count


def gemv_warps(lib, device: torch.device, fmt, dtype: torch.dtype, m: int, n: int, k_in: int) -> int:
    """Warps for the stream-K GEMV: at most one full wave of resident warps (stream_k_warps)."""
    tiles, groups = kbit_tiled.tiled_shape(n, k_in)
    return stream_k_warps(tiles, groups, _stream_resident_warps(lib, device, fmt, dtype, m))


def local_ctas(lib, device: torch.device, fmt, dtype: torch.dtype, m: int, n: int) -> int:
    """CTAs of the stream-K kernel's CTA-local mode: one wave, at most one per tile."""
    tiles = -(-n // 16)
    return min(tiles, _stream_resident_warps(lib, device, fmt, dtype, m) // STREAM_CTA_WARPS)


#: Tile pairs (a gate tile and its up tile) a CTA of the SwiGLU epilogue holds in shared memory at most
#: (csrc/tiled/gemv.cuh: kSwiMaxPairs); fewer where the device has less shared memory (swiglu_max_pairs).
SWIGLU_MAX_PAIRS = 32
_swiglu_pairs: dict = {}


def swiglu_max_pairs(lib, device: torch.device, fmt) -> int:
    """Tile pairs a CTA of the SwiGLU epilogue can hold on ``device`` (<= SWIGLU_MAX_PAIRS): 32 on an H100 or H200,
    18 on a 99 KB part (sm_86 / sm_89), the library's own answer (csrc/tiled/gemv.cuh: swi_max_pairs)."""
    fmt = tiled_format(fmt)
    key = (device.index, fmt)
    if key not in _swiglu_pairs:
        op, sym = fmt.symbol("gemv_swiglu_pairs")
        with torch.cuda.device(device):
            _swiglu_pairs[key] = lib.symbol(op, **sym)()
    return _swiglu_pairs[key]


def swiglu_ctas(lib, device: torch.device, fmt, dtype: torch.dtype, m: int, n: int) -> int:
    """CTAs of the SwiGLU epilogue's GEMV (CTA-local, one wave, at most one per pair of 16-row tiles) for a
    ``[gate; up]`` weight of ``n`` rows; 0 where it cannot run (``n`` not a multiple of 32, or more pairs per CTA
    than the device's shared memory holds). kbit and NVFP4 (the same kernel's FP4 instances; rotated kbit has
    none)."""
    if n % 32:
        return 0
    pairs = n // 32
    ctas = min(pairs, _stream_resident_warps(lib, device, fmt, dtype, m) // STREAM_CTA_WARPS)
    return ctas if -(-pairs // ctas) <= swiglu_max_pairs(lib, device, fmt) else 0


_routed_act: dict = {}


def routed_act_fits(lib, device: torch.device, fmt, n_experts: int, routes: int, k_in: int) -> bool:
    """Whether the routed down GEMV can compute ``silu(gate) * up`` itself (FLAG_ROUTED_SWIGLU) for ``routes``
    routes over ``n_experts`` experts of K_in ``k_in`` on ``device``: it stages min(8, routes) activation rows
    in shared memory, so long expert rows (Mixtral's 14336) do not fit at every batch size."""
    fmt = tiled_format(fmt)
    key = (device.index, fmt, n_experts, routes, k_in)
    if key not in _routed_act:
        op, sym = fmt.symbol("routed_act_fits")
        with torch.cuda.device(device):
            _routed_act[key] = bool(lib.symbol(op, **sym)(n_experts, routes, k_in))
    return _routed_act[key]


#: A tile-aligned warp count is used when it keeps at least this share of the resident warps busy.
ALIGNED_MIN_FILL = 0.75


def stream_k_warps(tiles: int, groups: int, resident: int) -> int:
    """How many warps share the ``tiles x groups`` units of a stream-K GEMV.

    Stream-K cuts the units into equal contiguous ranges, one per warp; a range that starts or
    ends inside a tile leaves a partial sum for a fix-up through global memory. A warp count that
    makes every range whole tiles (``tiles / j`` warps, j tiles each) or an equal share of one tile
    (``tiles * s`` warps, s dividing ``groups``) has no or fewer such fix-ups, and measured faster
    even with fewer warps resident: H100, K=4, 8192x28672 48.1 us with 1,792 warps (one tile each)
    vs 54.4 us with all 2,112; 4096x14336 19.1 vs 20.5 us with 1,792 (two warps per tile; at 896,
    one per tile, 23.3). Such a count is used when it keeps >= ALIGNED_MIN_FILL of the resident
    warps; otherwise every resident warp (plain stream-K)."""
    units = tiles * groups
    if units <= resident:
        return max(1, units)
    if tiles <= resident:
        s = max(d for d in range(1, groups + 1) if groups % d == 0 and tiles * d <= resident)
        aligned = tiles * s
    else:
        j = -(-tiles // resident)
        aligned = tiles // j if tiles % j == 0 else 0
    return aligned if aligned >= ALIGNED_MIN_FILL * resident else resident


#: Dense GEMV kernel choice: "auto" (bulk_ctas, then dense_path), "streamk", "local", "split" or "bulk" (the
#: bulk-copy kernel wherever it can run: up to 8 tokens of unrotated kbit; "local" elsewhere) (tuning / benchmarks /
#: tests).
DENSE_PATH = "auto"


def split_max_ctas(lib, device: torch.device, fmt, dtype: torch.dtype, n_experts: int) -> int:
    """CTAs of the split-K kernel in one full wave (its shared memory grows with n_experts)."""
    fmt = tiled_format(fmt)
    key = ("split", device.index, fmt, dtype, n_experts)
    if key not in _occupancy:
        op, sym = fmt.symbol("split_gemv_occupancy")
        fn = lib.symbol(op, **sym, dtype=dtype)
        occ = fn(n_experts)
        if occ < 1:
            raise ValueError(f"lowbit: {n_experts} experts do not fit the grouped kernel's shared memory")
        _occupancy[key] = occ
    return _occupancy[key] * torch.cuda.get_device_properties(device).multi_processor_count


def split_items(n: int, k_in: int) -> int:
    """CTA items of the split-K kernel for one expert (mirrors split_for in csrc/tiled/gemv.cuh:
    min(groups, warps per CTA) warps per tile)."""
    tiles, groups = kbit_tiled.tiled_shape(n, k_in)
    per_item = WARPS_PER_CTA // min(groups, WARPS_PER_CTA)
    return -(-tiles // per_item)


#: Split-in-CTA while its items fill at most this many waves of CTAs. Measured on H100 (cold L2,
#: M=1, benchmarks/gemv_sweep.py): split wins at 2.4 waves (2048x10240: 10.3 vs 11.5 us at K=4),
#: stream-K wins at 3.4 (4096x14336: 18.0 vs 19.8 us) and beyond (8192x28672: 52.1 vs 58.3 us).
SPLIT_MAX_WAVES = 3
#: ... unless stream-K gets a tile-aligned warp count (stream_k_warps) with at least this many
#: units per warp: long rows, where the split kernel's 8 warps per tile each walk many groups one
#: after another (28672x8192, K=4: stream-K on 2,048 aligned warps 49.9 us vs split 53.3; with 8
#: units per warp split still wins: 8192x8192 17.4 vs 18.2).
STREAM_K_MIN_UNITS = 16


def use_split(lib, device, fmt, dtype, n, k_in) -> bool:
    """Split-K inside a CTA for small and mid shapes: no atomics, no second pass, lowest fixed
    latency. Large shapes use stream-K, which balances any number of units over one wave of warps."""
    if DENSE_PATH != "auto":
        return DENSE_PATH == "split"
    if split_items(n, k_in) > SPLIT_MAX_WAVES * split_max_ctas(lib, device, fmt, dtype, 1):
        return False
    tiles, groups = kbit_tiled.tiled_shape(n, k_in)
    warps = gemv_warps(lib, device, fmt, dtype, 1, n, k_in)  # what stream-K would run on
    return not prefer_stream_k(tiles, groups, warps)


#: Whether "auto" may pick stream-K's CTA-local mode (False: the rule without it, for comparisons;
#: ``DENSE_PATH = "local"`` runs it anywhere). benchmarks/journal/2026-11-25_cta_local_stream_k.md
USE_LOCAL = True


def plain_pick(device, fmt, m: int, n: int, k_in: int, flags: int = 0) -> str | None:
    """The kernel ``lowbit tune --gemv-kernels`` measured fastest for a plain call (no epilogue) of this shape on this
    GPU where the rules below pick another (:mod:`lowbit.kernels.picks`): one token of unrotated kbit under DENSE_PATH
    "auto"; None elsewhere."""
    fmt = tiled_format(fmt)
    if DENSE_PATH != "auto" or m != 1 or flags or fmt.name != "kbit":
        return None
    return picks.pick(gpu_name(device), f"kbit{dict(fmt.params)['bits']}", n, k_in)


def dense_path(lib, device, fmt, dtype, n, k_in, pick: str | None = None) -> str:
    """The dense GEMV kernel for a shape: "split", "streamk" or "local" (stream-K, CTA-local); ``pick``
    (:func:`plain_pick`), where it names one of them, instead of the rules.

    The split kernel where it would run in one wave of CTAs (its lowest fixed cost); with
    USE_LOCAL, the CTA-local stream-K where every CTA of a one-per-SM grid gets whole tiles;
    otherwise (few tiles, long rows) the choice between split and global stream-K (use_split).
    H100, M = 1, K = 4, cold L2 (benchmarks/gemv_sweep.py): one-wave split beats local on 4096x4096 (7.5 vs 7.6-8.5 us) and
    14336x4096 (14.6 vs 15.1-15.9); local beats split past one wave (4096x6144: 9.0-9.7 vs 10.1-10.3;
    8192x10240: 19.6-20.3 vs 22.3) and global stream-K on large shapes (28672x8192: 48.7-48.9 vs
    50.7; 8192x29568 K=2: 35.7 vs 38.2)."""
    if DENSE_PATH != "auto":
        return DENSE_PATH
    if pick in ("split", "streamk", "local"):
        return pick
    split = use_split(lib, device, fmt, dtype, n, k_in)
    if split and split_items(n, k_in) <= split_max_ctas(lib, device, fmt, dtype, 1):
        return "split"
    resident = _stream_resident_warps(lib, device, fmt, dtype, 1)
    if USE_LOCAL and local_ctas(lib, device, fmt, dtype, 1, n) * STREAM_CTA_WARPS == resident:  # a CTA on every SM
        return "local"
    return "split" if split else "streamk"


#: Whether "auto" may pick the bulk-copy GEMV (csrc/tiled/bulk_gemv.cuh) where bulk_ctas's rules say so.
USE_BULK = True
#: Tokens the bulk-copy GEMV takes at most (the MMA's N: csrc/tiled/bulk_gemv.cuh, kBulkMaxM).
BULK_MAX_M = 8
#: Per K, the tokens up to which the decode layers' calls (with an epilogue, or SwiGLU) take it (K not listed: one
#: token); plain calls take it at one token only (bulk_rule's data). Llama-3-8B decode, compiled, H200, rows
#: alternated in one process, tok/s, with / without (``@bulk-m1``, or the default's one token):
#:   b4 kbit4 1814.5 / 1817.4 against 1724.3 / 1726.0 (+5.3%); kbit2 1912.2 / 1912.0 against 1869.3 / 1880.5 (+2.0%);
#:   kbit3 1665.2 against 1747.8 (-4.7%: K = 3's decode rate in the bulk-copy kernel);
#:   b8 kbit4 2825.1 / 2827.8 against 3110.8 / 3097.2 (-9%; not profiled. The partial sums take 1 KB per tile and
#:   token: at 8 tokens Llama-3-8B's gate|up, 14 tiles per CTA, leaves too little shared memory for a ring and takes
#:   another kernel, so the loss is in the other projections).
#: So up to 4 tokens, as measured (benchmarks/journal/2026-11-28_bulk_gemv_tokens.md,
#: benchmarks/journal/2026-11-28_gemv_picks.md).
BULK_LAYER_MAX_M = {2: 4, 4: 4}


def bulk_rule(bits: int, n: int, k_in: int, sms: int) -> bool:
    """Where the bulk-copy GEMV (weights by bulk copies into shared memory, x kept in registers) beat, for one token,
    the kernel "auto" picks otherwise (H100, M = 1, cold, fp16, two rounds of benchmarks/gemv_sweep.py --bulk;
    benchmarks/journal/2026-11-27_bulk_copies_and_allreduce_prefetch.md). With u = units (16 x 256 weights) per CTA:
      K = 2: K_in > 16384 (x past what the stream-K kernel stages: 28672x8192 38.2 -> 33.6 us, 20480x4096 17.7 ->
             17.1) or 20 <= u <= 64 (4096x4096 6.45 -> 5.96, 4096x6144 8.3 -> 7.3, 2048x10240 7.8 -> 6.9, 5120x2048
             5.75 -> 5.53); it loses on 8192x29568 (30.4 -> 32.2) and the other shapes in between;
      K = 4: two or more slices of 16 groups and >= 24 stages of one tile's slice per CTA (8192x29568 49.8 -> 47.6,
             8192x28672 48.7 -> 47.3, 28672x8192 48.2 -> 47.6) or 19 <= u <= 32 (4096x4096 7.8 -> 7.1, 5120x2048
             6.4 -> 5.9, 2048x5120 6.1 -> 5.9); it loses with one slice (4096x28672 25.95 -> 26.4) or few stages;
      K = 3 and K = 5: never (slower or tied everywhere measured; K = 3 with its fields in bytes too, but for
             4096x4096, 6.9 against the split kernel's 7.2)."""
    tiles, groups = -(-n // 16), -(-k_in // 256)
    ctas = max(1, min(tiles, sms))
    u = tiles * groups / ctas
    if bits == 2:
        return k_in > 16384 or 20 <= u <= 64
    if bits == 4:
        slices = -(-groups // 16)
        return (slices >= 2 and slices * -(-tiles // ctas) >= 24) or 19 <= u <= 32
    return False


_bulk_rings: dict = {}


#: K of the calls with an epilogue (the decode layers' GEMVs, chained under PDL) that take the bulk-copy GEMV on every
#: shape it fits: Llama-3-8B decode b1, compiled, against USE_BULK = False in the same process (two or three rows each;
#: benchmarks/journal/2026-11-27_bulk_copies_and_allreduce_prefetch.md): kbit2 510-512 -> 539-543 tok/s, kbit3 461.4 ->
#: 471.3, kbit4 432-435 -> 435.5-436.9. There its weights are in flight before the PDL wait, and the standalone sweep's
#: losses (q|k|v, down_proj) do not show. K = 3's large ones too (down_proj: > 64 units of 16 x 256 weights per CTA): a
#: rule held them off it where the stream-K kernel would stream faster than the bulk kernel decodes (its K = 3 rate
#: against the device's HBM bandwidth); it gained with the deeper ring (H100, kbit3 b1: Llama-3-8B 469.5 -> 478.6 tok/s,
#: 70B shapes 244.5 -> 254.1) and lost with the two-stage one (kBulkRing) on an H200, three times: Llama-3-8B 565.5 /
#: 565.4 -> 576.3 without it, 567.9 / 567.9 -> 577.7; 70B shapes (20 layers) 302.0 / 302.7 -> 310.8
#: (benchmarks/journal/2026-11-28_bulk_ring_align.md, benchmarks/journal/2026-11-29_bulk_prewait_and_k3_rule.md).
#: Dropped; the two-stage ring has not run on an H100.
BULK_EPILOGUE_BITS = (2, 3, 4)
#: Of those, the K whose SwiGLU epilogue (gate|up) takes it too: kbit4 in the step above 436.1 / 435.6 -> 446.5 /
#: 444.9 tok/s. Slower, so their gate|up stays the stream-K kernel's: kbit3 469.1 -> 447.6, again 471.0 -> 448.8
#: (462.7 with two tiles per ring stage); kbit2 537.5 -> 533.6
#: (benchmarks/journal/2026-11-27_final_recheck_step_profile_read_floor.md).
BULK_SWIGLU_BITS = (4,)


def bulk_ctas(lib, device, fmt, dtype, m: int, n: int, k_in: int, flags: int = 0, swiglu: bool = False,
              epilogue: bool = False) -> int:
    """CTAs of the bulk-copy GEMV for this call (one per SM, at most one per tile, or per tile pair with ``swiglu``),
    or 0 where the call takes another kernel: more than BULK_MAX_M tokens, rotated weights, not kbit, DENSE_PATH /
    USE_BULK, bulk_rule or a measured pick (plain calls, one token: plain_pick), BULK_EPILOGUE_BITS (calls with
    ``epilogue``: the norm's factor, the residual, the next norm's weight) or BULK_SWIGLU_BITS (``swiglu``) and
    BULK_LAYER_MAX_M, or a shape whose ring does not fit in shared memory."""
    fmt = tiled_format(fmt)
    if not 1 <= m <= BULK_MAX_M or flags or fmt.name != "kbit" or (swiglu and n % 32):
        return 0
    bits = dict(fmt.params)["bits"]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    ctas = min(n // 32 if swiglu else -(-n // 16), sms)
    if DENSE_PATH == "auto":
        if swiglu:
            picked = bits in BULK_SWIGLU_BITS and m <= BULK_LAYER_MAX_M.get(bits, 1)
        elif epilogue:
            picked = bits in BULK_EPILOGUE_BITS and m <= BULK_LAYER_MAX_M.get(bits, 1)
        else:
            pick = plain_pick(device, fmt, m, n, k_in, flags)
            picked = m == 1 and (pick == "bulk" if pick else bulk_rule(bits, n, k_in, sms))
        if not (USE_BULK and picked):
            return 0
    elif DENSE_PATH != "bulk":
        return 0
    key = (device.index, bits, n, ctas, swiglu, m)
    if key not in _bulk_rings:
        op, sym = fmt.symbol("bulk_gemv_ring")
        _bulk_rings[key] = lib.symbol(op, **sym)(n, ctas, int(swiglu), m)
    return ctas if _bulk_rings[key] > 0 else 0


def prefer_stream_k(tiles: int, groups: int, warps: int) -> bool:
    """Whether stream-K on ``warps`` (from stream_k_warps) beats the split kernel for a shape the
    split kernel could also take: tile-aligned ranges of STREAM_K_MIN_UNITS units or more."""
    units = tiles * groups
    aligned = units % warps == 0 and (groups % (units // warps) == 0 or (units // warps) % groups == 0)
    return aligned and units // warps >= STREAM_K_MIN_UNITS


def _raw_stream_getter():
    """Fastest way to the current stream's handle (the eager module path calls it per launch)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda idx: torch.cuda.current_stream(idx).cuda_stream


_current_stream = _raw_stream_getter()


class _Launcher:
    """What every launcher holds: the library, the weight's tensors (kept alive: the plans hold their
    addresses) and their raw pointers, the format, the weight's shape and device, and its plans."""

    def __init__(self, lib, tensors, fmt, n: int, k_in: int):
        self.lib, self.fmt, self.n, self.k_in = lib, tiled_format(fmt), n, k_in
        self.tensors = tuple(tensors)
        self.device = self.tensors[0].device
        self.index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.ptrs = tuple(ctypes.c_void_p(t.data_ptr()) for t in self.tensors)
        self._plans: dict = {}


class GemvLauncher(_Launcher):
    """The tiled GEMV of one weight with every per-weight decision made once.

    The eager forward of ``lowbit.nn`` modules calls this directly (no torch dispatcher, no
    re-checks of the weight's tensors: the module checked them when it was built), which keeps
    a decode call at a few microseconds of CPU; the registered op builds one per call. The
    kernel symbols are called without ctypes argtypes, every fixed argument pre-wrapped.
    Call: ``launcher(x, m, out_shape, bias=None)`` with x contiguous, ``m = x.numel() // K_in`` in
    1..8 rows of fp16/bf16 on the weight's device; returns y of ``out_shape`` (``m * N`` elements).
    ``bias`` (``[N]``, x's dtype, contiguous) is added in fp32 before the output's one rounding.
    ``rotation=32`` (kbit): the weight holds ``W H`` and the kernel multiplies by ``x H``
    (lowbit/formats/kbit/rotation.py), rotating x in its registers.
    """

    def __init__(self, lib, qweight, qscales, values, scale, fmt, n, k_in, rotation: int = 0):
        super().__init__(lib, (qweight, qscales, values, scale), fmt, n, k_in)
        self.tiles, self.groups = kbit_tiled.tiled_shape(n, k_in)
        self.pdl_ok = pdl_supported(self.device)
        if rotation not in (0, 32) or (rotation and tiled_format(fmt).name != "kbit"):
            raise ValueError(f"rotation={rotation!r}: the GEMV rotates kbit weights' inputs by 32-blocks only")
        self.flags = FLAG_ROT32 if rotation else 0

    def swiglu_ok(self, dtype, m: int) -> bool:
        """Whether a call of ``m`` rows takes the SwiGLU epilogue (:func:`epilogue` ``swiglu``)."""
        return self.flags == 0 and 1 <= m <= GEMV_MAX_M and swiglu_ctas(self.lib, self.device, self.fmt, dtype, m,
                                                                         self.n) > 0

    def _plan(self, dtype, m, swiglu: bool = False, epi: bool = False):
        lib, n, k_in, fmt = self.lib, self.n, self.k_in, self.fmt
        qw, qa, cb, sc = self.ptrs
        c_int = ctypes.c_int
        bulk = bulk_ctas(lib, self.device, fmt, dtype, m, n, k_in, self.flags, swiglu, epi)
        if bulk:  # up to 8 tokens (csrc/tiled/bulk_gemv.cuh; SwiGLU over tile pairs)
            op, sym = fmt.symbol("bulk_gemv")
            fn = lib.raw_symbol(op, **sym, dtype=dtype)
            plan = ("bulk", fn, (qw, qa, cb, sc), (c_int(m), c_int(n), c_int(k_in), c_int(bulk)))
            self._plans[(dtype, m, swiglu, epi)] = plan
            return plan
        if swiglu:  # CTA-local over tile pairs (csrc/tiled/gemv.cuh: SWI)
            op, sym = fmt.symbol("gemv")
            fn = lib.raw_symbol(op, **sym, dtype=dtype, m=gemv_instance(m))
            warps = STREAM_CTA_WARPS * swiglu_ctas(lib, self.device, fmt, dtype, m, n)
            flags = self.flags | FLAG_LOCAL | x_flag(self.tiles * self.groups, warps)
            fixed = (ctypes.c_void_p(None), c_int(m), c_int(n), c_int(k_in), c_int(warps))  # no counters: local
            plan = ("streamk", fn, (qw, qa, cb, sc), fixed, 0, flags)
            self._plans[(dtype, m, True, epi)] = plan
            return plan
        pick = None if epi else plain_pick(self.device, fmt, m, n, k_in, self.flags)  # the layers keep the rules
        path = dense_path(lib, self.device, fmt, dtype, n, k_in, pick)
        if path == "bulk":  # DENSE_PATH = "bulk" on a call it cannot take
            path = "local"
        if path == "split":
            op, sym = fmt.symbol("split_gemv")
            fn = lib.raw_symbol(op, **sym, dtype=dtype)
            max_ctas = split_max_ctas(lib, self.device, fmt, dtype, 1)
            fixed = (c_int(m), qw, qa, cb, sc, c_int(1), c_int(n), c_int(k_in), c_int(max_ctas))
            plan = ("split", fn, fixed, self.flags)
        else:
            op, sym = fmt.symbol("gemv")
            fn = lib.raw_symbol(op, **sym, dtype=dtype, m=gemv_instance(m))
            if path == "local":  # no workspace, no counters
                warps = STREAM_CTA_WARPS * local_ctas(lib, self.device, fmt, dtype, m, n)
                cnt, ws_warps, flags = ctypes.c_void_p(None), 0, self.flags | FLAG_LOCAL
            else:
                warps = gemv_warps(lib, self.device, fmt, dtype, m, n, k_in)
                cnt = ctypes.c_void_p(counters(self.device, self.tiles).data_ptr())
                ws_warps, flags = warps, self.flags
            flags |= x_flag(self.tiles * self.groups, warps)
            plan = ("streamk", fn, (qw, qa, cb, sc), (cnt, c_int(m), c_int(n), c_int(k_in), c_int(warps)), ws_warps, flags)
        self._plans[(dtype, m, swiglu, epi)] = plan
        return plan

    def __call__(self, x: torch.Tensor, m: int, out_shape, bias: torch.Tensor | None = None,
                 epilogue: Epilogue | None = None, y: torch.Tensor | None = None) -> torch.Tensor:
        """``epilogue``: the fused glue (:func:`epilogue`; its tensors checked by the caller); ``y``: the output
        buffer when the caller made it (for an epilogue's ``yw`` beside it)."""
        dtype = x.dtype
        swiglu, epi = epilogue is not None and epilogue.swiglu, epilogue is not None
        plan = self._plans.get((dtype, m, swiglu, epi)) or self._plan(dtype, m, swiglu, epi)
        if x.data_ptr() % 16:
            x = x.clone()  # the kernels read x with 16-byte loads
        if y is None:
            y = torch.empty(out_shape, dtype=dtype, device=self.device)
        vp = ctypes.c_void_p
        stream = vp(_current_stream(self.index))
        b = None if bias is None else vp(bias.data_ptr())
        epi = None if epilogue is None else ctypes.byref(epilogue)
        if plan[0] == "bulk":
            qw, qa, cb, sc = plan[2]
            m_, n, k, ctas = plan[3]
            err = plan[1](vp(x.data_ptr()), qw, qa, cb, sc, vp(y.data_ptr()), b, m_, n, k, ctas, _pdl_arg(self.pdl_ok),
                          epi, stream)
        elif plan[0] == "split":
            m_, qw, qa, cb, sc, one, n, k, ctas = plan[2]
            err = plan[1](vp(x.data_ptr()), None, m_, qw, qa, cb, sc, vp(y.data_ptr()), b, one, n, k, ctas,
                          _pdl_arg(self.pdl_ok, plan[3]), epi, stream)
        else:
            qw, qa, cb, sc = plan[2]
            cnt, m_, n, k, warps = plan[3]
            # workspace (global mode): alive until the launch is queued, like y
            ws = torch.empty((plan[4], 2, 128), dtype=torch.float32, device=self.device) if plan[4] else None
            err = plan[1](vp(x.data_ptr()), qw, qa, cb, sc, vp(y.data_ptr()), b, vp(None if ws is None else ws.data_ptr()), cnt, m_, n, k,
                          warps, _pdl_arg(self.pdl_ok, plan[5]), epi, stream)
        if err:
            self.lib.raise_error(self.fmt.symbol("gemv")[0], err)
        return y


def run_gemv_epilogue(launch, x, m, bias, rms_x, eps, residual, norm_weight, swiglu=False):
    """One launch of ``launch`` (a :class:`~.tiled.GemvLauncher`) with the epilogue: (y, yw or an empty tensor).
    ``swiglu`` where the launcher cannot take it (``swiglu_ok``): the plain epilogue, then ``silu(g) * u`` in torch."""
    n = launch.n
    if swiglu and not launch.swiglu_ok(x.dtype, m):
        y, yw = run_gemv_epilogue(launch, x, m, bias, rms_x, eps, residual, norm_weight)
        return swiglu_reference(y), yw
    y = torch.empty((m, n // 2 if swiglu else n), dtype=x.dtype, device=x.device)
    yw = torch.empty((m, n) if norm_weight is not None else (0,), dtype=x.dtype, device=x.device)
    if bias is not None:
        bias = bias.to(x.dtype).contiguous()  # added in the kernel, after the norm's factor
    epi = epilogue(rms_x, eps, residual, norm_weight, yw if norm_weight is not None else None, swiglu)
    launch(x, m, y.shape, bias, epilogue=epi, y=y)
    return y, yw


class _ExpertsLauncher(_Launcher):
    """What the grouped and routed launchers share: an expert stack, its split-K kernel symbol ``OP`` and the
    kernel's full wave of CTAs, per dtype."""

    OP = "split_gemv"

    def __init__(self, lib, qweight, qscales, values, scales, fmt, n, k_in):
        super().__init__(lib, (qweight, qscales, values, scales), fmt, n, k_in)
        self.experts = qweight.shape[0]
        self.pdl_ok = pdl_supported(self.device)

    def _plan(self, dtype):
        c_int = ctypes.c_int
        op, sym = self.fmt.symbol(self.OP)
        fn = self.lib.raw_symbol(op, **sym, dtype=dtype)
        # (the routed instance holds at most 3 KB more shared memory: its route ids and a 1 KB row map; two CTAs per
        # SM still fit, as for the grouped one)
        ctas = split_max_ctas(self.lib, self.device, self.fmt, dtype, self.experts)
        plan = (fn, self.ptrs, (c_int(self.experts), c_int(self.n), c_int(self.k_in), c_int(ctas)))
        self._plans[dtype] = plan
        return plan


class GroupedLauncher(_ExpertsLauncher):
    """The grouped (MoE) GEMV of one expert stack, decisions made once (see GemvLauncher).
    Call: ``launcher(x [rows, K_in], expert_offsets int64 [E + 1])`` -> y ``[rows, N]``."""

    _ZERO = ctypes.c_int(0)  # m_dense: unused with offsets

    def __call__(self, x: torch.Tensor, expert_offsets: torch.Tensor) -> torch.Tensor:
        fn, (qw, qa, cb, sc), (experts, n, k, ctas) = self._plans.get(x.dtype) or self._plan(x.dtype)
        if x.data_ptr() % 16:
            x = x.clone()
        y = torch.empty((x.shape[0], self.n), dtype=x.dtype, device=self.device)
        if x.shape[0] == 0:
            return y
        vp = ctypes.c_void_p
        err = fn(vp(x.data_ptr()), vp(expert_offsets.data_ptr()), self._ZERO, qw, qa, cb, sc, vp(y.data_ptr()), None, experts,
                 n, k, ctas, _pdl_arg(self.pdl_ok), None, vp(_current_stream(self.index)))
        if err:
            self.lib.raise_error(self.fmt.symbol("grouped_gemv")[0], err)
        return y


#: The routed GEMV fits its items in one wave of CTAs (fewer warps per tile); False keeps one group per
#: warp (flag bit 4; comparisons).
ROUTED_ONE_WAVE = True
#: The routed GEMV's flag bit 5: x is [gate | up] and the operand silu(gate) * up (stage_act in csrc/tiled/gemv.cuh).
FLAG_ROUTED_SWIGLU = 32


class RoutedLauncher(_ExpertsLauncher):
    """The routed (MoE, unsorted rows) GEMV of one expert stack: ``launcher(x [rows, K_in], route_ids int64
    [rows * rows_per_x], rows_per_x)`` -> y ``[len(route_ids), N]``, row r = x row ``r // rows_per_x`` times
    expert ``route_ids[r]`` (``lowbit.ops.kbit_routed_gemv``; at most ``ROUTED_MAX_ROUTES`` routes). ``swiglu``: x is
    ``[rows, 2 K_in]`` = [gate | up] and the operand ``silu(gate) * up`` (one route per x row)."""

    OP = "routed_gemv"

    def __call__(self, x: torch.Tensor, route_ids: torch.Tensor, rows_per_x: int, swiglu: bool = False) -> torch.Tensor:
        fn, (qw, qa, cb, sc), (experts, n, k, ctas) = self._plans.get(x.dtype) or self._plan(x.dtype)
        count = route_ids.shape[0]
        if swiglu and count and not routed_act_fits(self.lib, self.device, self.fmt, self.experts, count, self.k_in):
            x, swiglu = swiglu_reference(x), False  # its staged rows pass the device's shared memory: the product first
        if x.data_ptr() % 16:
            x = x.clone()
        y = torch.empty((count, self.n), dtype=x.dtype, device=self.device)
        if count == 0:
            return y
        vp = ctypes.c_void_p
        err = fn(vp(x.data_ptr()), vp(route_ids.data_ptr()), ctypes.c_int(count), ctypes.c_int(rows_per_x), qw, qa, cb,
                 sc, vp(y.data_ptr()), experts, n, k, ctas,
                 _pdl_arg(self.pdl_ok, (0 if ROUTED_ONE_WAVE else 16) | (FLAG_ROUTED_SWIGLU if swiglu else 0)),
                 vp(_current_stream(self.index)))
        if err:
            self.lib.raise_error(self.fmt.symbol("routed_gemv")[0], err)
        return y


# ------------------------------------------------------------------ GEMM (tiled layout, M > 8)
#: token tiles of 8 per CTA compiled into the library (csrc/kbit/gemm.cu, LOWBIT_DEFINE_GEMM_DTYPE)
GEMM_TOKEN_TILES = (2, 4, 8)
#: (token tiles, 16-row tiles per warp) of the dense GEMM compiled into the library
GEMM_INSTANCES = ((2, 1), (4, 1), (8, 1), (4, 2), (8, 2))
#: 16-row tiles per warp of the dense GEMM: None = the rule (gemm_tiles_per_warp); 1 or 2 pins it (benchmarks).
GEMM_TILES_PER_WARP: int | None = None


def gemm_token_tiles(m: int) -> int:
    """Token tiles of 8 per CTA for M rows: the smallest compiled one covering M (rows beyond 64 are
    taken 64 at a time by more CTAs)."""
    return next((nt for nt in GEMM_TOKEN_TILES if 8 * nt >= m), GEMM_TOKEN_TILES[-1])


#: weights (elements) from which the GEMM runs two tiles per warp at 32+ tokens even when its CTAs
#: need split-K to fill the GPU
GEMM_R2_MIN_WEIGHTS = 1 << 27


def gemm_tiles_per_warp(nt: int, tiles: int, groups: int, chunks: int, sms: int) -> int:
    """16-row tiles per warp of the dense GEMM: two (each x fragment loaded from shared memory feeds
    both tiles' MMAs; one CTA per SM) at 32+ tokens per CTA on large weights, or where the 256-row
    CTAs x token chunks fill 3/4 of the SMs without split-K. H100, K=4, us (one / two tiles per warp,
    `gemm_sweep.py --tiles-per-warp`): 8192x28672 M=32 86.5 / 73.8, M=64 151.8 / 128.2, M=128 304.4 /
    249.4; 28672x8192 82.2 / 75.0, 146.5 / 138.2, 257.8 / 238.7; 4096x14336 M=64 41.5 / 59.3, M=128
    80.7 / 66.7; 14336x4096 M=64 49.2 / 58.1; 4096x4096 M=64 26.6 / 38.6."""
    if GEMM_TILES_PER_WARP is not None:
        return GEMM_TILES_PER_WARP if (nt, GEMM_TILES_PER_WARP) in GEMM_INSTANCES else 1
    if nt < 4:
        return 1
    if tiles * 16 * groups * 256 >= GEMM_R2_MIN_WEIGHTS or -(-tiles // 16) * chunks >= 0.75 * sms:
        return 2
    return 1


#: K groups (of 256 columns) per CTA, split one CTA per SM, from which the GEMM fills two per SM instead
GEMM_TWO_PER_SM_MIN_GROUPS = 12


def gemm_splits(row_blocks: int, chunks: int, groups: int, sms: int, ctas_per_sm: int = 1) -> int:
    """K splits of the GEMM: each split keeps >= 2 groups of 256 columns, and the CTAs fill one per SM.

    Among the split counts, the one whose CTAs fill their waves best, the smallest where fills are within 5%
    (a grid of 112 CTAs on 132 SMs, 85%, is not split into 224: two waves at 85%). Where the instance fits
    ``ctas_per_sm`` = 2, and one per SM still splits K and leaves each CTA >= GEMM_TWO_PER_SM_MIN_GROUPS
    groups, it fills two per SM: long K loops hide their latency behind the second CTA's warps, while short
    ones pay the split's reduction and each CTA's start for nothing. H100, M = 16 / 32, cold us, kbit4
    (benchmarks/journal/2026-11-28_gemm_splits_one_per_sm.md, 22 shapes, K = 2..5 and NVFP4): 2048x10240
    unsplit 11.1 / 14.9 against three splits at two per SM 12.8 / 19.7; 4096x4096 four splits 10.3 / 14.8
    against eight 11.5 / 16.4; 8192x8192 M = 16 (16 groups per CTA at one per SM) four splits 20.9 against
    two 22.1."""
    def fill_best(resident: int) -> int:
        ctas = row_blocks * chunks
        pick, pick_fill = 1, 0.0
        for s in range(1, max(1, min(-(-resident // ctas), groups // 2)) + 1):
            total = ctas * s
            fill = total / (-(-total // resident) * resident)
            if fill > pick_fill * 1.05:
                pick, pick_fill = s, fill
        return pick

    s = fill_best(sms)
    if ctas_per_sm >= 2 and s > 1 and -(-groups // s) >= GEMM_TWO_PER_SM_MIN_GROUPS:
        s = fill_best(2 * sms)
    return s


def _gemm_occupancy(lib, index: int, op: str, sym: dict, dtype, *args, required: bool = True, **params) -> int:
    """CTAs per SM of a GEMM instance (``sym``: the symbol's leading parameters, e.g. bits); 0 where it does not
    fit an SM of this device (its shared memory: x stages for 8 * nt tokens beside the table) unless ``required``."""
    key = (op, index, tuple(sym.items()), dtype, args, tuple(params.items()))
    if key not in _occupancy:
        with torch.cuda.device(index):
            _occupancy[key] = lib.symbol(op + "_occupancy", **sym, dtype=dtype, **params)(*args)
    if required and _occupancy[key] < 1:
        raise RuntimeError(f"lowbit: {op} ({sym}, {params}, {args}) does not fit an SM of this GPU")
    return _occupancy[key]


def _fitting_token_tiles(nt: int, fits) -> int:
    """The largest compiled token-tile count <= ``nt`` whose instance ``fits(nt)`` on the device: a GPU with less
    shared memory per block than an H100 (99 KB on sm_86 / sm_89) takes 64 rows in two chunks of 32 (K <= 4) or
    four of 16 (K = 5) instead of one chunk of 64; the smallest is returned even if it does not fit (its
    occupancy query then says so)."""
    smaller = [t for t in GEMM_TOKEN_TILES if t <= nt]
    return next((t for t in reversed(smaller) if fits(t)), smaller[0])


class GemmLauncher(_Launcher):
    """The tiled GEMM (M > 8 rows) of one weight; plans per (dtype, M) made once (see GemvLauncher).
    Call: ``launcher(x [M, K_in] contiguous fp16/bf16, bias=None)`` -> y ``[M, N]``."""

    def __init__(self, lib, qweight, qscales, values, scale, fmt, n, k_in):
        super().__init__(lib, (qweight, qscales, values, scale), fmt, n, k_in)
        self.op, self.sym = self.fmt.symbol("gemm")
        self.tiles, self.groups = kbit_tiled.tiled_shape(n, k_in)

    def plan(self, dtype, m: int, splits: int | None = None):
        """(symbol, token tiles, tiles per warp, splits, workspace floats, counters) for M rows;
        ``splits`` overrides the rule (tests, tuning)."""
        key = (dtype, m, splits, GEMM_TILES_PER_WARP)
        if key in self._plans:
            return self._plans[key]
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        sym = self.sym

        def shape(nt):  # (chunks of 8 nt rows, tiles per warp)
            chunks = -(-m // (8 * nt))
            return chunks, gemm_tiles_per_warp(nt, self.tiles, self.groups, chunks, sms)

        nt = _fitting_token_tiles(gemm_token_tiles(m), lambda t: _gemm_occupancy(
            self.lib, self.index, self.op, sym, dtype, nt=t, r=shape(t)[1], required=False) > 0)
        chunks, r = shape(nt)
        occ = _gemm_occupancy(self.lib, self.index, self.op, sym, dtype, nt=nt, r=r)
        row_blocks = -(-self.tiles // (8 * r))
        if splits is None:
            splits = gemm_splits(row_blocks, chunks, self.groups, sms, occ)
        if not 1 <= splits <= self.groups:
            raise ValueError(f"splits must be in 1..{self.groups} (K groups), got {splits}")
        ws = chunks * splits * self.tiles * 16 * 8 * nt if splits > 1 else 0
        cnt = counters(self.device, chunks * row_blocks) if splits > 1 else None
        fn = self.lib.raw_symbol(self.op, **sym, dtype=dtype, nt=nt, r=r)
        plan = self._plans[key] = (fn, nt, r, splits, ws, cnt)
        return plan

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None, splits: int | None = None) -> torch.Tensor:
        m = x.shape[0]
        fn, _, _, splits, ws_floats, cnt = self.plan(x.dtype, m, splits)
        if x.data_ptr() % 16:
            x = x.clone()
        y = torch.empty((m, self.n), dtype=x.dtype, device=self.device)
        vp = ctypes.c_void_p
        ws = torch.empty(ws_floats, dtype=torch.float32, device=self.device) if ws_floats else None
        qw, qa, cb, sc = self.ptrs
        err = fn(vp(x.data_ptr()), qw, qa, cb, sc, vp(y.data_ptr()), None if bias is None else vp(bias.data_ptr()),
                 None if ws is None else vp(ws.data_ptr()), None if cnt is None else vp(cnt.data_ptr()),
                 ctypes.c_int(m), ctypes.c_int(self.n), ctypes.c_int(self.k_in), ctypes.c_int(splits),
                 vp(_current_stream(self.index)))
        if err:
            self.lib.raise_error(self.op, err)
        return y


def grouped_token_tiles(rows: int, experts: int) -> int:
    """Token tiles of 8 per CTA of the grouped GEMM: the smallest compiled one covering the mean
    rows per expert (the kernel takes longer runs in several chunks)."""
    return gemm_token_tiles(-(-rows // max(1, experts)))


class GroupedGemmLauncher(_Launcher):
    """The grouped (MoE) GEMM of one expert stack: one launch for any rows per expert (rows
    sorted by expert, ``expert_offsets`` on the device; nothing is read back to the host, so it is
    CUDA-graph safe). Call: ``launcher(x [rows, K_in], expert_offsets int64 [E + 1], nt=None)``."""

    def __init__(self, lib, qweight, qscales, values, scales, fmt, n, k_in):
        super().__init__(lib, (qweight, qscales, values, scales), fmt, n, k_in)
        self.experts = qweight.shape[0]

    def plan(self, dtype, nt: int):
        """(symbol, CTAs) of the instance for ``nt`` token tiles, or of the largest smaller one where ``nt``'s
        does not fit the device's shared memory (any ``nt`` takes any rows: longer runs in more chunks)."""
        key = (dtype, nt)
        if key not in self._plans:
            if nt not in GEMM_TOKEN_TILES:
                raise ValueError(f"nt must be one of {GEMM_TOKEN_TILES}, got {nt}")
            op, sym = self.fmt.symbol("grouped_gemm")
            fit = _fitting_token_tiles(nt, lambda t: _gemm_occupancy(self.lib, self.index, op, sym, dtype, self.experts,
                                                                     nt=t, required=False) > 0)
            occ = _gemm_occupancy(self.lib, self.index, op, sym, dtype, self.experts, nt=fit)
            ctas = occ * torch.cuda.get_device_properties(self.device).multi_processor_count
            fn = self.lib.raw_symbol(op, **sym, dtype=dtype, nt=fit)
            self._plans[key] = (fn, ctas)
        return self._plans[key]

    def __call__(self, x: torch.Tensor, expert_offsets: torch.Tensor, nt: int | None = None) -> torch.Tensor:
        rows = x.shape[0]
        fn, ctas = self.plan(x.dtype, nt or grouped_token_tiles(rows, self.experts))
        if x.data_ptr() % 16:
            x = x.clone()
        y = torch.empty((rows, self.n), dtype=x.dtype, device=self.device)
        if rows == 0:
            return y
        vp = ctypes.c_void_p
        qw, qa, cb, sc = self.ptrs
        err = fn(vp(x.data_ptr()), vp(expert_offsets.data_ptr()), qw, qa, cb, sc, vp(y.data_ptr()), None,
                 ctypes.c_int(self.experts), ctypes.c_int(self.n), ctypes.c_int(self.k_in), ctypes.c_int(ctas),
                 vp(_current_stream(self.index)))
        if err:
            self.lib.raise_error(self.fmt.symbol("grouped_gemm")[0], err)
        return y


def with_bias(run, x, bias):
    """run(bias or None): the kernels add a bias of x's dtype in fp32 before their one rounding; any
    other bias is added to their output."""
    if bias is None or fusable_bias(bias, x):
        return run(bias)
    return run(None).add_(bias)


def check_offsets_on_device(lib, expert_offsets: torch.Tensor, rows: int) -> None:
    """The expert offsets' values checked where they are (a device-side assertion on violation; one
    one-CTA launch, no synchronization, CUDA-graph safe): see csrc/expert_offsets.cu."""
    lib.call("check_expert_offsets", [ptr(expert_offsets), expert_offsets.shape[0] - 1, rows,
                                      stream_of(expert_offsets.device)])


