"""The GPU (tiled) layout: repack/unpack round trips, lane mapping, CPU fallbacks of the GEMV ops."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit import ops
from lowbit.formats import kbit
from lowbit.formats.kbit import tiled as kbit_tiled


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 3, 4, 5]), st.integers(1, 40), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_repack_unpack_roundtrip(bits, n, nblk, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (n, nblk, 32), generator=g, dtype=torch.int64).to(torch.uint8)
    planes = kbit.pack_planes(codes, bits)
    absmax = torch.randint(0, 256, (n, nblk), generator=g, dtype=torch.int64).to(torch.uint8)
    qw, qa = kbit_tiled.repack(planes, absmax, bits)
    t, grp = kbit_tiled.tiled_shape(n, nblk * 32)
    assert qw.shape == (t, grp, bits, 32, 4) and qa.shape == (t, grp, 128)
    p2, a2 = kbit_tiled.unpack(qw, qa, bits, n, nblk * 32)
    assert torch.equal(p2, planes) and torch.equal(a2, absmax)


def test_repack_stacked_experts(gen):
    ex = lowbit.quantize_kbit_experts(torch.randn(3, 20, 64, generator=gen), bits=3)
    qw, qa = ex.tiled()
    assert qw.shape[0] == 3
    for e in range(3):
        p, a = kbit_tiled.unpack(qw[e], qa[e], 3, 20, 64)
        assert torch.equal(p, ex.planes[e]) and torch.equal(a, ex.absmax[e])


@pytest.mark.parametrize("bits", [3, 4])
def test_packers_trace_under_compile_without_cache_warnings(bits, gen):
    """A model's first NVFP4 call may build its tiled layout inside a compiled step: the packers trace whole, with no
    dynamo warning (their field tables are built at import, not behind an lru_cache), to the eager result."""
    codes = torch.randint(0, 2**bits, (20, 9, 32), dtype=torch.uint8, generator=gen)
    amax = torch.randint(1, 255, (20, 9), dtype=torch.uint8, generator=gen)

    def roundtrip(c, a):
        qw, qa = kbit_tiled.pack_codes(c, a, bits)
        return qw, qa, kbit_tiled.unpack_codes(qw, bits, 20, 9 * 32)

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = torch.compile(roundtrip, backend="eager", fullgraph=True)(codes, amax)
    assert not [w for w in seen if "lru_cache" in str(w.message)]
    want = roundtrip(codes, amax)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert torch.equal(got[2], codes)


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("lane,j,p", [(6, 0, 1), (31, 7, 7), (0, 0, 5), (13, 3, 2), (22, 5, 6), (9, 3, 6), (17, 1, 4)])
def test_lane_mapping_matches_docstring(bits, lane, j, p, gen):
    """Lane (g, t), block j, pair p = 4m + 2q + h: row 8h + g, columns 32j + 8t + 4m + 2q + (0, 1).

    (17, 1, 4) is field 12: bits 120..129 for K=5, straddling words 3 and 4. K=3's fields lie in bytes; fields
    (j, p) = (1, 4), (3, 6) and (7, 7) are spare ones, their bits in the top two bits of three words' bytes.
    """
    q = lowbit.quantize_kbit(torch.randn(16, 256, generator=gen), bits=bits)
    codes = kbit.unpack_planes(q.planes, bits)
    qw, qa = kbit_tiled.repack(q.planes, q.absmax, bits)
    words = [int(v) & 0xFFFFFFFF for v in qw[0, 0].permute(1, 0, 2).reshape(32, -1)[lane]]
    f = 8 * j + p
    if bits == 3:  # the module docstring's byte layout, written out again
        r, i = divmod(f, 16)
        if i < 12:
            field = (words[3 * r + i // 4] >> (8 * (i % 4))) & 63
        else:
            field = sum(((words[3 * r + c] >> (8 * (i - 12) + 6)) & 3) << (2 * c) for c in range(3))
    else:
        stream = sum(wd << (32 * i) for i, wd in enumerate(words))
        field = (stream >> (2 * bits * f)) & ((1 << 2 * bits) - 1)
    c0, c1 = field & ((1 << bits) - 1), field >> bits
    g, t_ = lane // 4, lane % 4
    m_, q_, h = p // 4, (p // 2) % 2, p % 2
    row, col = 8 * h + g, 32 * j + 8 * t_ + 4 * m_ + 2 * q_
    assert (c0, c1) == (int(codes[row, col // 32, col % 32]), int(codes[row, col // 32, col % 32 + 1]))
    assert int(qa[0, 0, 16 * g + 8 * h + j]) == int(q.absmax[row, j])


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 4])
def test_gemv_op_cpu_is_reference(bits, m, gen):
    q = lowbit.quantize_kbit(torch.randn(37, 96, generator=gen), bits=bits)
    x = torch.randn(m, 96, generator=gen).half()
    qw, qa = q.tiled()
    y = ops.kbit_gemv(x, qw, qa, q.codebook, q.scale, bits, 37, 96)
    assert torch.equal(y, kbit.linear_reference(x, *q.tensors(), bits))


def test_grouped_op_cpu_matches_per_expert(gen):
    ex = lowbit.quantize_kbit_experts(torch.randn(5, 24, 64, generator=gen), bits=4)
    counts = torch.tensor([2, 0, 3, 0, 1])
    off = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    x = torch.randn(6, 64, generator=gen).half()
    y = lowbit.kbit_grouped_linear(x, off, ex)
    for e in range(5):
        lo, hi = int(off[e]), int(off[e + 1])
        if hi > lo:
            assert torch.equal(y[lo:hi], lowbit.kbit_linear(x[lo:hi], ex.expert(e)))


def test_gemv_and_grouped_bad_input(gen):
    q = lowbit.quantize_kbit(torch.randn(16, 64, generator=gen), bits=4)
    qw, qa = q.tiled()
    with pytest.raises(ValueError, match="M = 1..8"):
        ops.kbit_gemv(torch.randn(9, 64).half(), qw, qa, q.codebook, q.scale, 4, 16, 64)
    with pytest.raises(TypeError, match="x must have dtype"):
        ops.kbit_gemv(torch.randn(1, 64), qw, qa, q.codebook, q.scale, 4, 16, 64)
    with pytest.raises(ValueError, match="qweight must have shape"):
        ops.kbit_gemv(torch.randn(1, 64).half(), qw, qa, q.codebook, q.scale, 4, 32, 64)
    ex = lowbit.quantize_kbit_experts(torch.randn(2, 16, 64, generator=gen), bits=4)
    x = torch.randn(3, 64).half()
    with pytest.raises(ValueError, match="E \\+ 1 = 3 entries"):
        lowbit.kbit_grouped_linear(x, torch.tensor([0, 3]), ex)
    with pytest.raises(ValueError, match="must rise from 0"):
        lowbit.kbit_grouped_linear(x, torch.tensor([0, 2, 1]), ex)
    with pytest.raises(TypeError, match="expert_offsets must have dtype"):
        lowbit.kbit_grouped_linear(x, torch.tensor([0, 1, 3], dtype=torch.int32), ex)
    with pytest.raises(TypeError, match="KbitExperts"):
        lowbit.kbit_grouped_linear(x, torch.tensor([0, 1, 3]), q)


def test_opcheck_tiled_ops(gen):
    q = lowbit.quantize_kbit(torch.randn(16, 64, generator=gen), bits=3)
    torch.library.opcheck(torch.ops.lowbit.kbit_repack.default, (q.planes, q.absmax, 3))
    qw, qa = q.tiled()
    x = torch.randn(2, 64, generator=gen).half()
    torch.library.opcheck(torch.ops.lowbit.kbit_gemv.default, (x, qw, qa, q.codebook, q.scale, 3, 16, 64))


def test_split_items_mirror_kernel_rule():
    """split_items (host) mirrors split_for in csrc/tiled/gemv.cuh: S = min(8, groups) warps per tile,
    8 // S tiles per CTA item."""
    from lowbit.kernels.tiled import split_items

    assert split_items(16, 256) == 1        # 1 tile, 1 group: S=1, 8 tiles per item
    assert split_items(16 * 9, 256) == 2    # 9 tiles at 8 per item
    assert split_items(512, 2048) == 32     # 32 tiles, 8 groups: S=8, one tile per item
    assert split_items(2048, 512) == 32     # 128 tiles, 2 groups: S=2, 4 tiles per item
    assert split_items(1024, 1024) == 32    # 64 tiles, 4 groups: S=4, 2 tiles per item
    assert split_items(64, 256 * 3) == 2    # 4 tiles, 3 groups: S=3 (2 warps idle), 2 tiles per item
    assert split_items(576, 576) == 18      # SmolLM2: 36 tiles, 3 groups (576 pads to 768)
    assert split_items(2048, 1536) == 128   # 6 groups: S=6, one tile per item
    assert split_items(2048, 8192) == 128   # 32 groups: S=8, one tile per item
    assert split_items(64 * 7, 256 * 7 - 32) == 28  # 7 groups (last partial): S=7, 1 warp idle


@settings(max_examples=300, deadline=None)
@given(tiles=st.integers(1, 20000), groups=st.integers(1, 400), resident=st.integers(1, 5000))
def test_stream_k_warps_rule(tiles, groups, resident):
    """The stream-K warp count never exceeds a wave or the units, and when it is not the whole wave
    it cuts the units into equal tile-aligned ranges (whole tiles, or an equal share of each tile)."""
    from lowbit.kernels.tiled import ALIGNED_MIN_FILL, prefer_stream_k, stream_k_warps

    units = tiles * groups
    w = stream_k_warps(tiles, groups, resident)
    assert 1 <= w <= max(1, min(units, resident))
    if w not in (units, resident):
        assert units % w == 0 and w >= ALIGNED_MIN_FILL * resident
        per = units // w
        assert groups % per == 0 or per % groups == 0
    if prefer_stream_k(tiles, groups, w):
        assert units % w == 0 and units // w >= 16


def test_stream_k_warps_examples():
    from lowbit.kernels.tiled import prefer_stream_k, stream_k_warps

    # H100, 2,112 resident warps (16 per SM): the shapes the rule was measured on
    assert stream_k_warps(1792, 32, 2112) == 1792           # 8192x28672: one tile per warp
    assert stream_k_warps(512, 112, 2112) == 2048            # 28672x8192: a quarter tile per warp
    assert prefer_stream_k(512, 112, 2048)                   # ... 28 units each: stream-K over split
    assert not prefer_stream_k(512, 32, stream_k_warps(512, 32, 2112))  # 8192x8192: 8 each, split
    assert stream_k_warps(896, 16, 2112) == 1792             # 4096x14336: half a tile per warp
    assert stream_k_warps(640, 8, 2112) == 2112              # 2048x10240: 1,280 aligned is < 75%
    assert stream_k_warps(8016, 16, 2112) == 2004            # lm_head 4096x128256: 4 tiles per warp
    assert stream_k_warps(3, 2, 2112) == 6                   # fewer units than warps: one each


def test_tiled_dequantize_op_on_cpu_is_the_reference():
    from lowbit import ops

    g = torch.Generator().manual_seed(5)
    w = torch.randn(37, 800, generator=g)
    codes, absmax, codebook, scale = kbit.quantize_codes(w, 3)
    qw, qa = kbit_tiled.pack_codes(codes, absmax, 3)
    for dtype in (torch.float32, torch.bfloat16):
        got = ops.kbit_tiled_dequantize(qw, qa, codebook, scale, 3, 37, 800, dtype)
        assert torch.equal(got, kbit_tiled.dequantize(qw, qa, codebook, scale, 3, 37, 800, dtype))
    with pytest.raises(TypeError, match="dtype"):
        ops.kbit_tiled_dequantize(qw, qa, codebook, scale, 3, 37, 800, torch.int8)
    with pytest.raises(ValueError, match="qweight must have shape"):
        ops.kbit_tiled_dequantize(qw, qa, codebook, scale, 3, 70, 800, torch.float32)
