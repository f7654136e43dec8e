"""CUDA implementations of ``lowbit::decode_attention``: on tensor cores (csrc/attention/decode_mma.cu, head dims 64 and
128) and on CUDA cores (csrc/attention/decode.cu, every compiled shape); :func:`use_mma` picks one per call."""

from __future__ import annotations

import ctypes

import torch

from .. import ops
from .library import library_or_none, ptr, register_signatures, stream_of
from .tiled import _pdl_arg, counters
from .device import pdl_supported

_P, _I64, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
register_signatures({
    # q, k, v, k_sb, k_sh, v_sb, v_sh, mask, mask_sb, out, ws, counters, batch, head groups, kv_div, L, chunk,
    # scale, flags, then (append mode) k_new, v_new, cos, sin, q_sb, kn_sb, vn_sb, cs_sb, position, q_norm, k_norm,
    # norm_eps; stream
    "decode_attention": [_P, _P, _P, _I64, _I64, _I64, _I64, _P, _I64, _P, _P, _P, _I, _I, _I, _I, _I, _F, _I,
                         _P, _P, _P, _P, _I64, _I64, _I64, _I64, _P, _P, _P, _F, _P],
    # append mode (0/1) -> CTAs of that instance per SM (0: the runtime could not say)
    "decode_attention_occupancy": [_I],
    # the tensor-core kernel: decode_attention's arguments with the query heads per CTA after kv_div
    "decode_attention_mma": [_P, _P, _P, _I64, _I64, _I64, _I64, _P, _I64, _P, _P, _P, _I, _I, _I, _I, _I, _I, _F,
                             _I, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _P, _P, _P, _F, _P],
    "decode_attention_mma_occupancy": [_I],
})

#: head dims the tensor-core kernel is compiled for (csrc/attention/decode_mma.cu), and its query heads per CTA at most
MMA_HEAD_DIMS = (64, 128)
MMA_MAX_GROUP = 8

#: which kernel runs: "mma" (tensor cores), "simt" (CUDA cores), None: :func:`use_mma` decides (benchmarks and tests
#: set it)
KERNEL: str | None = None

#: warps per CTA of the tensor-core kernel, 4 or 8 (None: :func:`mma_plan` decides; benchmarks set it)
MMA_WARPS: int | None = None


#: positions per CTA, a multiple of 64 (None: :func:`chunk_size` decides; benchmarks set it)
CHUNK: int | None = None

#: query heads of a KV head split over this many CTAs (None: :func:`head_splits` decides; benchmarks set it)
HEAD_SPLITS: int | None = None

#: query heads per CTA the grid plan aims for: the kernel is bound by each warp's serial instruction latency per
#: head (IPC 0.8), so while the grid's waves stay as many, two CTAs of 2 heads beat one of 4. Batch 4, a
#: 590-position cache, Llama-3-8B heads: 4 heads per CTA (153 registers: one CTA per SM) in 160 CTAs 21.0 us,
#: 2 heads (128 registers: two per SM) in 256 CTAs 13.1 us (H100,
#: benchmarks/journal/2026-11-25_attention_grid_at_batch_4.md)
TARGET_GROUP = 2


def _waves(ctas: int, per_sm: int, sms: int) -> int:
    return -(-ctas // (max(1, per_sm) * sms))


def head_splits(batch: int, kv_heads: int, group: int, head_dim: int, sms: int, ctas_per_sm) -> int:
    """CTAs sharing one KV head's query heads: each takes ``group / splits`` of them and reads the K/V rows
    itself (the second reader mostly from L2). The heads are halved down to :data:`TARGET_GROUP` per CTA as
    long as one chunk per (sequence, head group) needs no more waves of the GPU than before
    (``ctas_per_sm(g)``: resident CTAs per SM of the instance with g heads per CTA); a power of two that divides
    the group and leaves a compiled group size."""
    if HEAD_SPLITS is not None:
        splits = HEAD_SPLITS
    else:
        splits = 1
        while group // splits > TARGET_GROUP and group % (2 * splits) == 0:
            g2 = group // (2 * splits)
            if (head_dim, g2) not in ops.DECODE_ATTENTION_SHAPES:
                break
            rows = batch * kv_heads
            now = _waves(rows * splits, ctas_per_sm(group // splits), sms)
            if _waves(rows * 2 * splits, ctas_per_sm(g2), sms) > now:
                break
            splits *= 2
    if group % splits or (head_dim, group // splits) not in ops.DECODE_ATTENTION_SHAPES:
        return 1
    return splits


def chunk_size(batch: int, groups: int, length: int, head_dim: int, sms: int, ctas_per_sm: int) -> int:
    """Positions per CTA for ``groups`` CTA head groups per sequence: a multiple of 64 (8 warps x 8 positions per
    step), the smallest whose grid fits one wave (``ctas_per_sm`` resident CTAs per SM), at most 2 x head_dim
    chunks (the merge's shared memory): a short cache still spreads over the GPU, a long one does not make
    thousands of partial states, and no CTA waits for a second wave."""
    want_chunks = min(max(1, max(1, ctas_per_sm) * sms // (batch * groups)), 2 * head_dim)
    chunk = -(-max(64, -(-length // want_chunks)) // 64) * 64
    while -(-length // chunk) > 2 * head_dim:
        chunk += 64
    return chunk


def mma_head_splits(group: int) -> int | None:
    """CTAs sharing a KV head's query heads in the tensor-core kernel: the fewest (a power of two dividing the
    group) that leave at most :data:`MMA_MAX_GROUP` heads per CTA; None if there is no such split."""
    splits = 1
    while group // splits > MMA_MAX_GROUP:
        if group % (2 * splits):
            return None
        splits *= 2
    return splits


def mma_supported(head_dim: int, group: int) -> bool:
    """Whether the tensor-core kernel takes this head dim and grouping."""
    return head_dim in MMA_HEAD_DIMS and mma_head_splits(group) is not None


def mma_plan(batch: int, groups: int, length: int, sms: int) -> tuple[int, int]:
    """(warps per CTA, positions per CTA) of the tensor-core kernel for ``groups`` CTA head groups per sequence.

    A warp takes 16 positions per step with the next step's rows in flight; a CTA of 8 warps streams ~50 GB/s, so
    it takes over half the SMs to pull K/V at HBM's rate, and every extra chunk costs a partial state and a merge.
    So: one chunk per (sequence, head group) once those CTAs fill a quarter of the SMs, else as many chunks of at
    least 256 positions as keep the grid within one CTA per SM; 8 warps per CTA (one CTA per SM: 230 registers),
    4 once the grid outnumbers the SMs (two per SM). H100, cold, us per Llama-3-8B layer, 8 warps: batch 16 / 590
    positions one chunk 17.5, chunks of 256 25.9; batch 4 / 4096: one chunk 41.4, 256 37.2; batch 1 / 4096: 38.5 /
    13.2; batch 32 / 590 one chunk: 4 warps 30.5, 8 warps 32.6
    (benchmarks/journal/2026-11-28_tensor_core_decode_attention.md)."""
    ctas = batch * groups
    warps = MMA_WARPS or (4 if ctas > sms else 8)
    chunks = 1 if 4 * ctas >= sms else min(max(1, sms // ctas), 2 * min(MMA_HEAD_DIMS))  # the kernel's cap: 2 D
    chunk = -(-max(256, -(-length // chunks)) // 64) * 64
    return warps, chunk


#: K/V rows per layer (sequences x KV heads x cache positions) from which the plan takes the tensor-core kernel:
#: below, the CUDA-core kernel's many small CTAs finish first. H100, Llama-3-8B heads (8 KV heads), us per layer, CUDA
#: cores / tensor cores: batch 1, 590 positions (4,720 rows) 7.0 / 7.9; batch 1, 1,100 (8,800) 9.5-9.6 / 9.6-9.9;
#: batch 2, 590 (9,440) 9.4-9.5 / 9.7-9.8; batch 1, 2,048 (16,384) 10.4-10.9 / 10.6-10.9; batch 4, 590 (18,880)
#: 12.1-12.4 / 10.8-11.1; batch 1, 4,096 (32,768) 15.3-16.0 / 13.2-13.8
#: (benchmarks/journal/2026-11-28_attention_crossover_and_cluster_merge.md)
MMA_MIN_ROWS = 17_000


def use_mma(batch: int, kv_heads: int, length: int, head_dim: int, group: int) -> bool:
    """Whether :func:`_launch` runs the tensor-core kernel: :data:`KERNEL`, else where it is compiled and the cache
    has at least :data:`MMA_MIN_ROWS` rows (or the CUDA-core kernel has no instance)."""
    if KERNEL not in (None, "mma", "simt"):
        raise ValueError(f"lowbit: attention KERNEL must be 'mma', 'simt' or None, got {KERNEL!r}")
    if KERNEL == "simt" or not mma_supported(head_dim, group):
        return False
    simt = (head_dim, group) in ops.DECODE_ATTENTION_SHAPES
    return KERNEL == "mma" or not simt or batch * kv_heads * length >= MMA_MIN_ROWS


_resident: dict[tuple, int] = {}


def resident_ctas(lib, device: torch.device, dtype: torch.dtype, d: int, g: int, append: bool) -> int:
    """Resident CTAs per SM of the kernel instance (its registers decide), asked of the CUDA runtime once."""
    key = (device.index, dtype, d, g, append)
    n = _resident.get(key)
    if n is None:
        with torch.cuda.device(device):
            n = lib.symbol("decode_attention_occupancy", dtype=dtype, d=d, g=g)(int(append))
        if n < 1:
            raise RuntimeError(f"lowbit: decode attention (d={d}, g={g}, {dtype}) does not fit an SM")
        _resident[key] = n
    return n


def supported_shape(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether a CUDA kernel (:data:`KERNEL`'s, else either) is compiled for this dtype, head grouping and head dim."""
    if dtype not in (torch.float16, torch.bfloat16) or heads % kv_heads:
        return False
    simt = (head_dim, heads // kv_heads) in ops.DECODE_ATTENTION_SHAPES
    mma = mma_supported(head_dim, heads // kv_heads)
    return {"simt": simt, "mma": mma}.get(KERNEL, simt or mma)


def supported(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the CUDA kernel is compiled for these shapes and dtypes (traceable: no data pointers)."""
    return q.is_cuda and supported_shape(q.dtype, q.shape[1], k.shape[1], q.shape[-1])


#: launch flag of the rotary embedding + cache append mode (csrc/attention/decode.cu)
FLAG_APPEND = 2
#: launch flag: the append mode under PDL loads the first K/V rows and the position before waiting for the
#: previous kernel (csrc/attention/decode.cu, EARLY)
FLAG_EARLY = 4
#: lowbit's fused decode step asks for FLAG_EARLY (``decode_attention_append(..., early_kv=True)``): there the kernel
#: launched right before the op is the q|k|v projection, which writes neither the caches nor the position (only
#: this op does). Llama-3-8B batch 1: +2.0% tokens/s on an H100, +1.3% and +1.1% in one-process A/B rows on an H200
#: (benchmarks/journal/2026-11-25_attention_grid_at_batch_4.md); benchmarks turn it off to compare
EARLY_KV = True
#: launch flag: each score reduced on its own (5 shuffles each), as before warp_sum8 -- for A/B timing only
FLAG_REDUCE_EACH = 8
#: use FLAG_REDUCE_EACH (benchmarks set it; the results are bit-identical either way)
REDUCE_EACH = False


def _launch(lib, q, k, v, mask, scale, append=None, early_kv=False):
    """Run a kernel; ``append``: (k_new, v_new, cos, sin, position, q_norm, k_norm, norm_eps) for the append
    mode."""
    b, hq, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    g = hq // hkv
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    mma = use_mma(b, hkv, length, d, g)
    if mma:
        splits = HEAD_SPLITS or mma_head_splits(g)
        if g % splits or g // splits > MMA_MAX_GROUP:
            raise ValueError(f"lowbit: {splits} head splits of {g} query heads per KV head")
        warps, chunk = mma_plan(b, hkv * splits, length, sms)
        chunk = CHUNK or chunk
    else:
        def per_sm(g_):  # CTAs per SM of the instance with g_ heads per CTA
            return resident_ctas(lib, q.device, q.dtype, d, g_, append is not None)

        splits = head_splits(b, hkv, g, d, sms, per_sm)
        chunk = CHUNK or chunk_size(b, hkv * splits, length, d, sms, per_sm(g // splits))
    chunks = -(-length // chunk)
    groups, g = hkv * splits, g // splits  # CTA head groups of g query heads (q's heads in order)
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    ws = torch.empty((b, groups, chunks, g, d + 2) if chunks > 1 else (1,), dtype=torch.float32, device=q.device)
    # the tiled GEMVs' counters: every user resets what it takes, and under PDL each touches them only after
    # waiting for its predecessor, so a GEMV and this kernel never hold them at once
    cnt = counters(q.device, b * groups + 1)  # + the append mode's grid-wide arrivals
    if append is None:
        extra, flags = [None, None, None, None, 0, 0, 0, 0, None, None, None, 0.0], 0
    else:
        k_new, v_new, cos, sin, position, q_norm, k_norm, norm_eps = append
        extra = [ptr(k_new), ptr(v_new), ptr(cos), ptr(sin), q.stride(0), k_new.stride(0), v_new.stride(0),
                 cos.stride(0), ptr(position), ptr(q_norm), ptr(k_norm), norm_eps]
        flags = FLAG_APPEND | (FLAG_EARLY if early_kv else 0)
    head = [ptr(q), ptr(k), ptr(v), k.stride(0), k.stride(1), v.stride(0), v.stride(1), ptr(mask),
            0 if mask is None or mask.shape[0] == 1 else mask.stride(0), ptr(out), ptr(ws), ptr(cnt), b, groups, splits]
    if mma:
        lib.call("decode_attention_mma", [*head, g, length, chunk, scale, _pdl_arg(pdl_supported(q.device), flags),
                                          *extra, stream_of(q.device)], dtype=q.dtype, d=d, w=warps)
    else:
        flags |= FLAG_REDUCE_EACH if REDUCE_EACH else 0
        lib.call("decode_attention", [*head, length, chunk, scale, _pdl_arg(pdl_supported(q.device), flags), *extra,
                                      stream_of(q.device)], dtype=q.dtype, d=d, g=g)
    return out


@ops.decode_attention.register_kernel("cuda")
def _(q, k, v, mask, scale):
    ops.check_decode_attention_args(q, k, v, mask, scale)
    lib = library_or_none(q.device)
    if lib is None or not supported(q, k) or any(t.data_ptr() % 16 for t in (q, k, v)):  # 16-byte row loads
        return ops.decode_attention_reference(q, k, v, mask, scale)
    return _launch(lib, q.contiguous(), k, v, mask, scale)


def _aligned(t: torch.Tensor) -> bool:
    """Row starts 16-byte aligned (the kernel's vector loads): the pointer and every row stride."""
    return t.data_ptr() % 16 == 0 and all(st * t.element_size() % 16 == 0 for st in t.stride()[:-1] if st)


@ops.decode_attention_append.register_kernel("cuda")
def _(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale, early_kv=False, q_norm=None, k_norm=None,
      norm_eps=0.0):
    ops.check_decode_append_args(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale, q_norm, k_norm,
                                 norm_eps)
    lib = library_or_none(q.device)
    norms = [w.contiguous() if w is not None else None for w in (q_norm, k_norm)]
    rows = (q, k_new, v_new, cos, sin, k_cache, v_cache, *[w for w in norms if w is not None])
    if lib is None or not supported(q, k_cache) or not all(_aligned(t) for t in rows):
        return ops.decode_attention_append_reference(q, k_new, v_new, cos, sin, k_cache, v_cache, position, mask, scale,
                                                     q_norm, k_norm, norm_eps)
    return _launch(lib, q, k_cache, v_cache, mask, scale, (k_new, v_new, cos, sin, position, *norms, norm_eps),
                   early_kv)
