"""NVFP4 reference (lowbit/formats/nvfp4.py): every code and scale decoded exactly, the rounding and
saturation rules, round trips, the swizzled scale layout, both global-scale conventions, the two
checkpoint layouts (verified against compressed-tensors' own compressor), and bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit.formats import nvfp4

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_every_e2m1_code_decodes_exactly_and_encodes_back():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = nvfp4.decode_e2m1(codes)
    for c in range(16):
        mag = E2M1[c & 7]
        assert vals[c].item() == (-mag if c & 8 else mag)
        assert math.copysign(1.0, vals[c].item()) == (-1.0 if c & 8 else 1.0)  # code 8 is -0
    assert torch.equal(nvfp4.encode_e2m1(vals), codes)


@pytest.mark.parametrize("x, code", [
    (0.0, 0), (0.24, 0), (0.25, 0), (0.26, 1), (0.5, 1), (0.75, 2), (1.0, 2), (1.25, 2), (1.26, 3),
    (1.75, 4), (2.5, 4), (2.51, 5), (3.0, 5), (3.5, 6), (4.99, 6), (5.0, 6), (5.01, 7), (6.0, 7),
    (6.5, 7), (1e30, 7), (-0.0, 8), (-0.1, 8), (-0.25, 8), (-0.75, 10), (-5.0, 14), (-7.0, 15),
])
def test_e2m1_round_to_nearest_even_and_saturate(x, code):
    """Ties go to the even code (the even mantissa), |x| > 6 saturates to +-6, the sign is the sign bit."""
    assert nvfp4.encode_e2m1(torch.tensor([x])).item() == code


def _e4m3_value(code: int) -> float:
    e, m = (code >> 3) & 0xF, code & 7
    return 2.0 ** -6 * m / 8 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8)


def test_every_e4m3_scale_code_decodes_exactly_and_rounding_is_nearest_even():
    codes = torch.arange(0, 127, dtype=torch.uint8)  # every non-negative finite code (127 is NaN)
    vals = codes.view(torch.float8_e4m3fn).to(torch.float32)
    want = torch.tensor([_e4m3_value(c) for c in range(127)])
    assert torch.equal(vals, want)
    assert vals[-1].item() == nvfp4.E4M3_MAX
    assert torch.equal(nvfp4.encode_e4m3(want).view(torch.uint8), codes)
    mids = (want[:-1] + want[1:]) / 2  # exact in fp32: ties go to the even code
    got = nvfp4.encode_e4m3(mids).view(torch.uint8).long()
    lower = torch.arange(126)
    assert torch.equal(got, torch.where(lower % 2 == 0, lower, lower + 1))
    assert nvfp4.encode_e4m3(torch.tensor([1e6, 449.0, 2.0 ** -11])).to(torch.float32).tolist() == [448.0, 448.0, 0.0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 12), st.integers(0, 2 ** 31 - 1))
def test_pack_unpack_round_trip(rows, half, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, 2 * half), generator=g, dtype=torch.uint8)
    packed = nvfp4.pack(codes)
    assert packed.shape == (rows, half) and packed.dtype == torch.uint8
    assert torch.equal(packed[:, 0] & 0xF, codes[:, 0])  # element 0 in the low nibble
    assert torch.equal(nvfp4.unpack(packed), codes)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 11), st.integers(0, 2 ** 31 - 1))
def test_blocked_scale_layout_round_trip(n, cols, seed):
    g = torch.Generator().manual_seed(seed)
    plain = torch.randint(0, 127, (n, cols), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    blocked = nvfp4.to_blocked(plain)
    assert blocked.numel() == -(-n // 128) * 128 * -(-cols // 4) * 4
    assert torch.equal(nvfp4.from_blocked(blocked, n, cols).view(torch.uint8), plain.view(torch.uint8))


def test_blocked_scale_layout_positions():
    """Scale (r, c) of a 128x4 tile, r = 32 i + j, is byte 16 j + 4 i + c of the tile; tiles in
    row-block-major order; padding is zero."""
    n, cols = 130, 6
    plain = torch.arange(n * cols, dtype=torch.int32).reshape(n, cols)
    b = nvfp4.to_blocked(plain)
    assert b.numel() == 2 * 128 * 2 * 4
    assert b[16 * 1 + 4 * 1 + 2].item() == plain[33, 2].item()   # tile (0, 0), r = 33 = 32 + 1
    assert b[512 + 16 * 5 + 4 * 0 + 1].item() == plain[5, 5].item()  # tile (0, 1), c = 5 = 4 + 1
    assert b[1024 + 16 * 1].item() == plain[129, 0].item()        # tile (1, 0), r = 129 = 128 + 1
    assert b[512 + 16 * 5 + 4 * 0 + 2].item() == 0                # column 6 is padding


def test_quantize_round_trip_exact_on_representable_weights(gen):
    """A weight built from E2M1 codes, E4M3 scales and a power-of-two scale_2 (so amax / (6 * 448)
    gives it back exactly), every block's amax 6 * scale, re-quantizes to the same bytes."""
    n, k = 24, 64
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    codes[:, ::16] = 7  # every block holds a +6: its amax is 6 * scale exactly
    scales = torch.randint(40, 120, (n, k // 16), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scales[0, 0] = torch.tensor(448.0).to(torch.float8_e4m3fn)  # the global amax block: scale_2 exact
    scale_2 = torch.tensor(2.0 ** -7)
    codes[codes == 8] = 0  # -0 and +0 dequantize alike; the requantized sign of an exact 0 is +
    w = nvfp4.dequantize_reference(nvfp4.pack(codes), scales, scale_2)
    q = lowbit.quantize_nvfp4(w)
    assert q.scale_2.item() == 2.0 ** -7
    assert torch.equal(q.scales.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(q.packed, nvfp4.pack(codes))
    assert torch.equal(q.dequantize(), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_error_bound(dtype, gen):
    """Gaussian weights (with outliers): every element within half an E2M1 step of its block's grid
    (<= 1 * step for |w| in (4, 6], the widest gap) -- i.e. |w - w_hat| <= scale * 1.0 -- and the
    relative norm error < 0.12."""
    w = (torch.randn(64, 512, generator=gen) * 0.02).to(dtype)
    w[3, 17] = 0.5  # an outlier sets the global scale
    q = lowbit.quantize_nvfp4(w)
    wf = w.float()
    w_hat = lowbit.dequantize_nvfp4(q, torch.float32)
    step = (q.scales.float() * q.scale_2).repeat_interleave(16, dim=1)
    assert ((wf - w_hat).abs() <= step * 1.0 + 1e-12).all()
    assert ((wf - w_hat).norm() / wf.norm()).item() < 0.12
    assert q.scales.float().max().item() == 448.0  # the block with the global amax uses the top scale


def test_zero_weight_and_zero_blocks():
    w = torch.zeros(16, 32)
    q = lowbit.quantize_nvfp4(w)
    assert q.scale_2.item() == 1.0 and torch.equal(q.dequantize(), w)
    w[0, 0] = 1.0  # one non-zero block: the others get scale 0 and decode to zeros
    q = lowbit.quantize_nvfp4(w)
    assert q.dequantize()[0, 0].item() == 1.0 and q.dequantize()[1:].abs().sum().item() == 0


def test_conventions_are_explicit():
    q = lowbit.quantize_nvfp4(torch.randn(16, 64))
    inv = q.global_scale("inverse")
    assert torch.allclose(inv * q.scale_2, torch.tensor(1.0), rtol=1e-6)
    a = nvfp4.NvFp4Weight.from_tensors(q.packed, q.scales, q.scale_2, convention="modelopt")
    b = nvfp4.NvFp4Weight.from_tensors(q.packed, q.scales, inv, convention="inverse")
    assert torch.allclose(a.dequantize(), b.dequantize(), rtol=2e-7, atol=0)
    with pytest.raises(TypeError):
        nvfp4.NvFp4Weight.from_tensors(q.packed, q.scales, q.scale_2)  # no default convention
    with pytest.raises(ValueError, match="convention"):
        nvfp4.NvFp4Weight.from_tensors(q.packed, q.scales, q.scale_2, convention="vllm")
    blocked = nvfp4.NvFp4Weight.from_tensors(q.packed, q.blocked_scales(), q.scale_2, convention="modelopt",
                                              scale_layout="blocked", k=64)
    assert torch.equal(blocked.scales.view(torch.uint8), q.scales.view(torch.uint8))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_bad_global_scale(bad):
    q = lowbit.quantize_nvfp4(torch.randn(16, 32))
    for conv in nvfp4.CONVENTIONS:
        with pytest.raises(ValueError, match="global scale"):
            nvfp4.NvFp4Weight.from_tensors(q.packed, q.scales, torch.tensor(bad), convention=conv)


def test_bad_tensors():
    q = lowbit.quantize_nvfp4(torch.randn(16, 64))
    with pytest.raises(ValueError, match="multiple of 16"):
        lowbit.quantize_nvfp4(torch.randn(16, 40))
    with pytest.raises(ValueError, match="finite"):
        lowbit.quantize_nvfp4(torch.full((16, 32), float("nan")))
    with pytest.raises(TypeError):
        lowbit.quantize_nvfp4(torch.zeros(16, 32, dtype=torch.int32))
    with pytest.raises(TypeError):
        nvfp4.NvFp4Weight(q.packed.to(torch.int8), q.scales, q.scale_2)  # wrong packing dtype
    with pytest.raises(ValueError, match="K/16"):
        nvfp4.NvFp4Weight(q.packed, q.scales[:, :3].contiguous(), q.scale_2)
    with pytest.raises(ValueError, match="K/2"):
        nvfp4.NvFp4Weight(q.packed[:, :7].contiguous(), q.scales, q.scale_2)
    with pytest.raises(ValueError, match="contiguous"):
        nvfp4.NvFp4Weight(q.packed.t().contiguous().t(), q.scales, q.scale_2)
    with pytest.raises(TypeError):
        nvfp4.NvFp4Weight(q.packed, q.scales.to(torch.float32), q.scale_2)
    with pytest.raises(ValueError, match="blocked"):
        nvfp4.from_blocked(q.blocked_scales()[:-1], 16, 4)
    for bad_code in (0x7F, 0x80, 0xC0):  # NaN, -0, negative: NVFP4 block scales are UE4M3
        raw = q.scales.view(torch.uint8).clone()
        raw[3, 1] = bad_code
        with pytest.raises(ValueError, match="UE4M3"):
            nvfp4.NvFp4Weight(q.packed, raw.view(torch.float8_e4m3fn), q.scale_2)


def test_linear_matches_dequantized_matmul(gen):
    q = lowbit.quantize_nvfp4(torch.randn(48, 128, generator=gen))
    x = torch.randn(5, 128, generator=gen)
    ref = x.double() @ q.dequantize().double().t()
    y = lowbit.nvfp4_linear(x, q)
    assert y.shape == (5, 48) and ((y.double() - ref).norm() / ref.norm()).item() < 1e-6
    xh = x.to(torch.bfloat16)
    assert lowbit.nvfp4_linear(xh, q).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="K"):
        lowbit.nvfp4_linear(torch.randn(5, 64), q)


def test_checkpoint_layouts_round_trip(gen):
    q = lowbit.quantize_nvfp4(torch.randn(32, 96, generator=gen))
    for layout, conv in (("modelopt", "modelopt"), ("compressed-tensors", "inverse")):
        sd = nvfp4.to_state_dict(q, layout, prefix="model.layers.0.mlp.up_proj.")
        back = nvfp4.from_state_dict(sd, prefix="model.layers.0.mlp.up_proj.")
        assert torch.equal(back.packed, q.packed)
        assert torch.allclose(back.dequantize(), q.dequantize(), rtol=2e-7, atol=0)
    mo = nvfp4.to_state_dict(q, "modelopt")
    assert mo["weight"].dtype == torch.uint8 and mo["weight_scale"].dtype == torch.float8_e4m3fn
    assert mo["weight_scale_2"].dtype == torch.float32 and mo["weight_scale_2"].dim() == 0
    ct = nvfp4.to_state_dict(q, "compressed-tensors")
    assert ct["weight_global_scale"].shape == (1,)
    with pytest.raises(ValueError, match="exactly one"):
        nvfp4.from_state_dict({**mo, **ct})
    with pytest.raises(ValueError, match="exactly one"):
        nvfp4.from_state_dict({"weight": q.packed})


def test_compressed_tensors_checkpoint_interop(gen):
    """A layer compressed by compressed-tensors' own NVFP4 compressor (its scales and global scale
    computed by its helpers) loads here and dequantizes as its decompressor does; and what lowbit
    writes in that layout, it decompresses to lowbit's values."""
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import generate_gparam

    del ct
    w = torch.randn(64, 128, generator=gen) * 0.05
    scheme: QuantizationScheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    gscale = generate_gparam(w.min(), w.max())  # 448 * 6 / amax, shape [1]
    blocks = w.reshape(64, 8, 16)
    scale = (gscale * blocks.abs().amax(-1) / 6.0).to(torch.float8_e4m3fn).to(torch.float32)
    state = {"weight": w, "weight_scale": scale, "weight_global_scale": gscale}
    comp = NVFP4PackedCompressor.compress(state, scheme)
    mine = nvfp4.from_state_dict(comp)
    theirs = NVFP4PackedCompressor.decompress(comp, scheme)["weight"]
    # compressed-tensors decodes in bf16 (two bf16 roundings: scale / global_scale, then the product);
    # a swapped nibble, a sign or a convention error would be off by far more than 2^-7
    _close_bf16(mine.dequantize(), theirs)
    assert (mine.dequantize() != 0).float().mean() > 0.5
    # the other way: lowbit's quantization in compressed-tensors' layout
    q = lowbit.quantize_nvfp4(w)
    back = NVFP4PackedCompressor.decompress(nvfp4.to_state_dict(q, "compressed-tensors"), scheme)["weight"]
    _close_bf16(q.dequantize(), back)


def _close_bf16(exact, bf16):
    assert bf16.dtype == torch.bfloat16
    diff = (exact - bf16.to(torch.float32)).abs()
    assert (diff <= exact.abs() * 2.0 ** -7).all(), f"max rel diff {(diff / exact.abs().clamp(min=1e-30)).max():.3g}"


# ------------------------------------------------------------------ W4A4 GEMV semantics (GPU MODE nvfp4_gemv)
def _w4a4_naive(a, b, sfa, sfb):
    """Element by element in fp64 from the code tables (independent of decode_blocks)."""
    m, half, l_ = a.shape
    vals = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
    out = torch.empty(m, 1, l_, dtype=torch.float64)
    for l in range(l_):
        ca = torch.stack((a[:, :, l] & 0xF, a[:, :, l] >> 4), -1).reshape(m, -1).long()
        cb = torch.stack((b[:, :, l] & 0xF, b[:, :, l] >> 4), -1).reshape(1, -1).long()
        A = vals[ca] * sfa[:, :, l].double().repeat_interleave(16, dim=1)
        B = vals[cb] * sfb[:, :, l].double().repeat_interleave(16, dim=1)
        out[:, 0, l] = A @ B[0]
    return out


@pytest.mark.parametrize("m, k, l_", [(7, 64, 1), (40, 256, 3), (16, 1024, 2)])
def test_w4a4_gemv_reference_full_range(m, k, l_, gen):
    """Full-range data (every code incl. negatives and high nibbles, scales across the E4M3 range),
    unlike GPU MODE's generator; K-major operands as non-contiguous permuted views."""
    a = torch.randint(0, 256, (l_, m, k // 2), generator=gen, dtype=torch.uint8).permute(1, 2, 0)
    b = torch.randint(0, 256, (l_, 1, k // 2), generator=gen, dtype=torch.uint8).permute(1, 2, 0)
    sfa = torch.randint(0, 127, (m, k // 16, l_), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    sfb = torch.randint(20, 60, (1, k // 16, l_), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    c = nvfp4.w4a4_gemv_reference(a, b, sfa, sfb)
    assert c.shape == (m, 1, l_) and c.dtype == torch.float16
    want = _w4a4_naive(a, b, sfa, sfb)
    finite = want.abs() < 65504
    assert torch.allclose(c.double()[finite], want[finite].to(torch.float16).double(), rtol=2e-3, atol=1e-6)


def test_w4a4_gemv_reference_rejects_bad_shapes():
    a = torch.zeros(4, 8, 1, dtype=torch.uint8)
    b = torch.zeros(1, 8, 1, dtype=torch.uint8)
    sfa = torch.zeros(4, 1, 1).to(torch.float8_e4m3fn)
    sfb = torch.zeros(1, 1, 1).to(torch.float8_e4m3fn)
    assert nvfp4.w4a4_gemv_reference(a, b, sfa, sfb).shape == (4, 1, 1)
    with pytest.raises(ValueError, match="b must be"):
        nvfp4.w4a4_gemv_reference(a, b[:, :4], sfa, sfb)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.w4a4_gemv_reference(a[:, :4], b[:, :4], sfa, sfb)
    with pytest.raises(TypeError):
        nvfp4.w4a4_gemv_reference(a, b, sfa.float(), sfb)


def test_activation_quantize_and_w4a4_against_dense(gen):
    """x and W quantized block-wise (activation side: no tensor scale, and with one) -> the W4A4 GEMV
    equals the product of the decoded operands, and stays near the fp32 product."""
    m, k = 64, 512
    w = torch.randn(m, k, generator=gen)
    x = torch.randn(k, generator=gen) * 3
    pa, sa = nvfp4.quantize_blocks(w)
    pb, sb = nvfp4.quantize_blocks(x[None])
    c = nvfp4.w4a4_gemv_reference(pa[..., None], pb[..., None], sa[..., None], sb[..., None])[:, 0, 0]
    decoded = nvfp4.decode_blocks(pa, sa) @ nvfp4.decode_blocks(pb, sb)[0]
    assert torch.allclose(c.float(), decoded.to(torch.float16).float(), rtol=1e-3, atol=1e-3)
    exact = w @ x
    assert ((c.float() - exact).norm() / exact.norm()).item() < 0.2
    p2, s2 = nvfp4.quantize_blocks(x[None] * 1e-4, scale_2=1e-4 / 1.0)  # tiny activations: a tensor scale keeps them
    assert torch.allclose(nvfp4.decode_blocks(p2, s2) * 1e-4, nvfp4.decode_blocks(pb, sb) * 1e-4, rtol=1e-6)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.quantize_blocks(torch.randn(3, 20))
    with pytest.raises(ValueError, match="scale_2"):
        nvfp4.quantize_blocks(torch.randn(3, 32), scale_2=0.0)


# ------------------------------------------------------------------ tiled GPU layout
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.integers(0, 2 ** 31 - 1))
def test_tiled_round_trip(n, k32, seed):
    """pack -> unpack gives back the bytes, for N not a multiple of 16 and K not a multiple of 256."""
    from lowbit.formats.nvfp4 import tiled as nvfp4_tiled

    g = torch.Generator().manual_seed(seed)
    k = 32 * k32
    q = lowbit.quantize_nvfp4(torch.randn(n, k, generator=g))
    qw, qs = nvfp4_tiled.pack(q)
    t, gr = nvfp4_tiled.tiled_shape(n, k)
    assert qw.shape == (t, gr, 4, 32, 4) and qs.shape == (t, gr, 256)
    back = nvfp4.from_tiled(qw, qs, q.scale_2, n, k)
    assert torch.equal(back.packed, q.packed)
    assert torch.equal(back.scales.view(torch.uint8), q.scales.view(torch.uint8))
    assert torch.equal(nvfp4.dequantize_tiled(qw, qs, q.scale_2, n, k), q.dequantize())


def test_tiled_scale_positions():
    """Lane (g, t) of block j reads the scale of 16-column block 2 j + t // 2 for rows g and g + 8 at
    bytes 32 g + 16 (t // 2) + j and + 8 (what the kernels assume)."""
    from lowbit.formats.nvfp4 import tiled as nvfp4_tiled

    n, k = 16, 256
    q = lowbit.quantize_nvfp4(torch.randn(n, k))
    raw = torch.arange(n * k // 16, dtype=torch.uint8).reshape(n, k // 16) % 120
    q = nvfp4.NvFp4Weight(q.packed, raw.view(torch.float8_e4m3fn), q.scale_2)
    _, qs = nvfp4_tiled.pack(q)
    for g in range(8):
        for s in range(2):
            for j in range(8):
                base = 32 * g + 16 * s
                assert qs[0, 0, base + j].item() == raw[g, 2 * j + s].item()
                assert qs[0, 0, base + 8 + j].item() == raw[g + 8, 2 * j + s].item()
    with pytest.raises(ValueError, match="K % 32"):
        nvfp4_tiled.pack(lowbit.quantize_nvfp4(torch.randn(16, 48)))


def test_nvfp4_gemm_op_cpu_reference_and_checks(gen):
    q = lowbit.quantize_nvfp4(torch.randn(40, 288, generator=gen))
    qw, qs = q.tiled()
    assert q.tiled()[0] is qw  # kept
    x = torch.randn(5, 288, generator=gen)
    y = lowbit.ops.nvfp4_gemm(x, qw, qs, q.scale_2, 40, 288)
    assert torch.allclose(y, x @ q.dequantize().t(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of 32"):
        lowbit.ops.nvfp4_gemm(x, qw, qs, q.scale_2, 40, 280)
    with pytest.raises(ValueError, match="qweight / qscales"):
        lowbit.ops.nvfp4_gemm(x, qw, qs, q.scale_2, 60, 288)
    with pytest.raises(ValueError, match="K=288"):
        lowbit.ops.nvfp4_gemm(x[:, :256].contiguous(), qw, qs, q.scale_2, 40, 288)
