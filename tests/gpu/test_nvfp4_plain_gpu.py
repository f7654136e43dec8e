"""NVFP4 kernels on the checkpoint layout (csrc/nvfp4/gemv.cu, csrc/nvfp4/quantize.cu) against the format
reference: the W4A16 GEMV (no repack), GPU MODE's W4A4 batched GEMV, and the activation quantizer.

W4A16 / W4A4: fp64 references of the exactly decoded operands; the kernels' fragments are exact
(E2M1 x E4M3 / 256 fits fp16 and bf16), so only fp32 sums and the output rounding differ: bounds as
kbit_check.BOUND (fp16 1e-3, bf16 8e-3), and GPU MODE's own check (rtol = atol = 1e-3) for W4A4.
Quantizer: bit-identical codes and scales. NaN never passes (the relative error is NaN then).
"""

import pytest
import torch

import lowbit
from lowbit import ops
from lowbit.formats import nvfp4

from .kbit_check import BOUND, DTYPES, capture
from .kbit_check import dtype_id as ids
from .kbit_check import rel as _rel

pytestmark = pytest.mark.gpu


def _ref(x, q):
    return x.cpu().double() @ q.to("cpu").dequantize(torch.float64).t()


def _weight(n, k, gen):
    """Rows e^+-3 apart: block scales across the E4M3 range, outputs within fp16."""
    w = torch.randn(n, k, generator=gen) * 0.02 * torch.exp(torch.randn(n, 1, generator=gen))
    return lowbit.quantize_nvfp4(w).to("cuda")


# K: one lane chunk, not a multiple of the 1024-value step, one warp, 16 warps, > 16 steps (warps with
# two steps); N: odd, one row, a few CTAs' worth and more
SHAPES = [(1, 32), (37, 32 * 33), (513, 1024), (255, 4096 + 96), (2049, 16384), (64, 20480 + 32)]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 11])
def test_plain_gemv_matches_reference(dtype, m, gen):
    for n, k in SHAPES:
        q = _weight(n, k, gen)
        x = torch.randn(m, k, generator=gen).to(dtype).cuda()
        y = ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2)
        assert y.shape == (m, n) and y.dtype == dtype
        err = _rel(y, _ref(x, q))
        assert err <= BOUND[dtype], f"N={n} K={k} M={m}: rel err {err:.2e}"
        assert torch.equal(y, ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2))  # deterministic


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_plain_gemv_every_code_and_scale_extremes(dtype, gen):
    """Every E2M1 code (incl. -0 and the subnormal +-0.5) in every position, E4M3 scales 448, the smallest
    subnormal (2^-9) and 0; each extreme row checked on its own norm."""
    n, k = 64, 2048
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    codes[3] = torch.arange(k) % 16
    raw = torch.randint(0, 127, (n, k // 16), generator=gen, dtype=torch.uint8)
    raw[0], raw[1], raw[2] = 126, 1, 0
    q = nvfp4.NvFp4Weight(nvfp4.pack(codes), raw.view(torch.float8_e4m3fn), torch.tensor(1 / 16)).to("cuda")
    x = torch.randn(1, k, generator=gen).to(dtype).cuda()
    y, ref = ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2), _ref(x, q)
    assert _rel(y, ref) <= BOUND[dtype]
    for row in (1, 3):
        assert _rel(y[:, row], ref[:, row]) <= BOUND[dtype], f"row {row}"
    assert (y[:, 2] == 0).all()


def test_plain_gemv_in_cuda_graph(gen):
    q = _weight(1000, 8192, gen)
    x = torch.randn(1, 8192, generator=gen).half().cuda()
    run = lambda: ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2)  # noqa: E731
    y0 = run()
    g, y = capture(run)
    x.copy_(torch.randn(1, 8192, generator=gen).half())
    g.replay()
    torch.cuda.synchronize()
    assert _rel(y, _ref(x, q)) <= BOUND[torch.float16] and not torch.equal(y, y0)


def test_plain_gemv_bad_input():
    q = lowbit.quantize_nvfp4(torch.randn(8, 48)).to("cuda")
    x = torch.randn(1, 48).half().cuda()
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2)
    q = lowbit.quantize_nvfp4(torch.randn(8, 64)).to("cuda")
    with pytest.raises(ValueError, match="x must have shape"):
        ops.nvfp4_plain_gemv(torch.randn(1, 32).half().cuda(), q.packed, q.scales, q.scale_2)
    with pytest.raises(ValueError, match="scales must be"):
        ops.nvfp4_plain_gemv(torch.randn(1, 64).half().cuda(), q.packed, q.scales[:, :2].contiguous(), q.scale_2)


# ------------------------------------------------------------------ W4A4 (GPU MODE nvfp4_gemv)
def _gpumode_operands(m, k, l_, gen, full_range):
    """GPU MODE's layout: tensors allocated [L, M, K/2] and permuted to [M, K/2, L]. full_range: every
    code (negatives, high nibbles) and scales across E4M3; otherwise small positive codes and scales
    as its reference generator draws them."""
    def codes(rows):
        if full_range:
            return torch.randint(0, 256, (l_, rows, k // 2), generator=gen, dtype=torch.uint8)
        lo = torch.randint(0, 4, (l_, rows, k // 2), generator=gen, dtype=torch.uint8)
        return lo | (torch.randint(0, 4, lo.shape, generator=gen, dtype=torch.uint8) << 4)

    def scales(rows):
        hi = 0x3c if full_range else 0x40  # full range: 2^-6 .. 1.5, so |c| stays inside fp16 for K <= 20480
        lo = 0x08 if full_range else 0x30
        return torch.randint(lo, hi, (l_, rows, k // 16), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)

    a, b, sfa, sfb = codes(m), codes(1), scales(m), scales(1)
    return tuple(t.cuda().permute(1, 2, 0) for t in (a, b, sfa, sfb))


@pytest.mark.parametrize("full_range", [False, True], ids=["gpumode-data", "full-range"])
@pytest.mark.parametrize("mkl", [(7168 // 16, 16384, 1), (4096 // 16, 7168, 8), (7168 // 16, 2048, 4), (33, 32, 3),
                                 (1, 1024 + 64, 2), (301, 20480, 1)])
def test_w4a4_gemv_matches_reference(mkl, full_range, gen):
    m, k, l_ = mkl
    a, b, sfa, sfb = _gpumode_operands(m, k, l_, gen, full_range)
    c = ops.nvfp4_w4a4_gemv(a, b, sfa, sfb)
    assert c.shape == (m, 1, l_) and c.dtype == torch.float16
    ref = nvfp4.w4a4_gemv_reference(a.cpu(), b.cpu(), sfa.cpu(), sfb.cpu())
    if not full_range:  # GPU MODE's check (its data: positive terms, no cancellation)
        torch.testing.assert_close(c.cpu(), ref, rtol=1e-3, atol=1e-3)
    exact = torch.bmm(nvfp4.decode_blocks(a.cpu().permute(2, 0, 1).contiguous(), sfa.cpu().permute(2, 0, 1).contiguous()).double(),
                      nvfp4.decode_blocks(b.cpu().permute(2, 0, 1).contiguous(), sfb.cpu().permute(2, 0, 1).contiguous()).double().transpose(1, 2))
    assert _rel(c.cpu().permute(2, 0, 1), exact) <= 1e-3
    # elementwise: fp16 rounding of the output plus fp32 sums of |terms| (cancellation)
    mag = torch.bmm(nvfp4.decode_blocks(a.cpu().permute(2, 0, 1).contiguous(), sfa.cpu().permute(2, 0, 1).contiguous()).double().abs(),
                    nvfp4.decode_blocks(b.cpu().permute(2, 0, 1).contiguous(), sfb.cpu().permute(2, 0, 1).contiguous()).double().abs().transpose(1, 2))
    err = (c.cpu().permute(2, 0, 1).double() - exact).abs()
    assert (err <= exact.abs() * 2**-11 + mag * 2**-16 + 2**-24).all()
    assert torch.equal(c, ops.nvfp4_w4a4_gemv(a, b, sfa, sfb))  # deterministic


def test_w4a4_gemv_other_layouts(gen):
    """Contiguous [M, K/2, L] operands (L innermost: copied into K-major) and float4_e2m1fn_x2 codes."""
    m, k, l_ = 100, 2048, 3
    a, b, sfa, sfb = _gpumode_operands(m, k, l_, gen, True)
    want = ops.nvfp4_w4a4_gemv(a, b, sfa, sfb)
    got = ops.nvfp4_w4a4_gemv(a.contiguous(), b.contiguous(), sfa.contiguous(), sfb.contiguous())
    assert torch.equal(got, want)
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4 is not None:
        assert torch.equal(ops.nvfp4_w4a4_gemv(a.view(fp4), b.view(fp4), sfa, sfb), want)


def test_w4a4_gemv_in_cuda_graph(gen):
    a, b, sfa, sfb = _gpumode_operands(512, 4096, 2, gen, True)
    run = lambda: ops.nvfp4_w4a4_gemv(a, b, sfa, sfb)  # noqa: E731
    c0 = run()
    g, c = capture(run)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(c, c0)


def test_w4a4_bad_input(gen):
    a, b, sfa, sfb = _gpumode_operands(8, 64, 1, gen, True)
    with pytest.raises(ValueError, match="b must be"):
        ops.nvfp4_w4a4_gemv(a, a, sfa, sfb)
    with pytest.raises(ValueError, match="sfa / sfb"):
        ops.nvfp4_w4a4_gemv(a, b, sfb, sfb)
    with pytest.raises(TypeError, match="dtype"):
        ops.nvfp4_w4a4_gemv(a.to(torch.int8), b, sfa, sfb)


# ------------------------------------------------------------------ activation quantizer
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_quantize_act_bit_identical(dtype, gen):
    """Random rows at every magnitude, exact midpoints (ties), zero and all-equal blocks, a saturating
    tensor scale (block scales > 448) and one that sends small blocks to the subnormal scales."""
    rows, k = 7, 4096
    # row scales e^(3 N(0,1)), capped at e^8 so that fp16 holds every value (a row scaled past ~1e4 overflowed)
    x = torch.randn(rows, k, generator=gen) * torch.exp((3 * torch.randn(rows, 1, generator=gen)).clamp(max=8.0))
    x[1, :16] = 0
    x[1, 16:32] = -3.0
    mids = torch.tensor(nvfp4._MIDPOINTS)
    x[2, :] = mids[torch.randint(0, 7, (k,), generator=gen)] * torch.sign(torch.randn(k, generator=gen))
    x[2, ::16] = 6.0  # amax 6 -> block scale 1: the midpoints land exactly on ties
    x = x.to(dtype).cuda()
    for s2 in (1.0, 1e-3, 5.0, 448.0):
        scale_2 = torch.tensor(s2, device="cuda")
        codes, scales = ops.nvfp4_quantize_act(x, scale_2)
        ref_codes, ref_scales = nvfp4.quantize_blocks(x.cpu(), torch.tensor(s2))
        assert torch.equal(codes.cpu(), ref_codes), f"scale_2={s2}"
        assert torch.equal(scales.cpu().view(torch.uint8), ref_scales.view(torch.uint8)), f"scale_2={s2}"


def test_quantize_then_w4a4_matches_fp16_product(gen):
    """The W4A4 pipeline: weights and activations both quantized (block scales only, as GPU MODE's
    operands) -- the activations on the fly -- vs the fp32 product of the unquantized operands."""
    n, k = 1024, 4096
    w = torch.randn(n, k, generator=gen).cuda()
    wc, ws = ops.nvfp4_quantize_act(w.half(), torch.ones((), device="cuda"))  # the same quantizer, rows of W
    x = torch.randn(1, k, generator=gen).half().cuda()
    xc, xs = ops.nvfp4_quantize_act(x, torch.ones((), device="cuda"))
    c = ops.nvfp4_w4a4_gemv(wc[:, :, None], xc[:, :, None], ws[:, :, None], xs[:, :, None])
    exact = nvfp4.decode_blocks(wc.cpu(), ws.cpu()).double() @ nvfp4.decode_blocks(xc.cpu(), xs.cpu()).double()[0]
    assert _rel(c[:, 0, 0].cpu(), exact) <= 1e-3  # the kernel, on the quantized operands
    ref = (x.float() @ w.half().float().t())[0]
    assert _rel(c[:, 0, 0].float().cpu(), ref.cpu()) < 0.2  # 4-bit weights and activations vs fp32 (~0.13 expected)


# ------------------------------------------------------------------ dequantize (for dequantize + cuBLAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_dequant_bit_identical(dtype, gen):
    for n, k in [(1, 32), (37, 1056), (513, 4096)]:
        q = _weight(n, k, gen)
        out = ops.nvfp4_dequantize(q.packed, q.scales, q.scale_2, dtype)
        assert torch.equal(out.cpu(), q.to("cpu").dequantize(dtype)), f"N={n} K={k}"


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_nvfp4_linear_every_path(dtype, gen):
    """lowbit.nvfp4_linear through the dispatcher: the GEMV (M <= 8), the GEMM, dequantize + cuBLAS, and
    K % 32 != 0 (dequantize in torch), each against the fp64 reference."""
    from lowbit import dispatch

    for n, k in [(300, 2048), (64, 16 * 33)]:
        q = _weight(n, k, gen)
        for m in (1, 8, 16, 300):
            x = torch.randn(m, k, generator=gen).to(dtype).cuda()
            path = dispatch.nvfp4_path(x, n, k)
            y = lowbit.nvfp4_linear(x, q)
            assert _rel(y, _ref(x, q)) <= BOUND[dtype], f"N={n} K={k} M={m} path={path}"
        for forced in ("gemm", "dequant_matmul"):
            with dispatch.forced_path(forced):
                x = torch.randn(5, k, generator=gen).to(dtype).cuda()
                assert _rel(lowbit.nvfp4_linear(x, q), _ref(x, q)) <= BOUND[dtype], f"forced {forced}"


# ------------------------------------------------------------------ grouped (MoE) NVFP4 GEMV
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_nvfp4_grouped_gemv(dtype, gen):
    """Empty first/last experts, a 1-row expert, one with 19 rows (3 passes of 8), odd N, K % 256 != 0."""
    e, n, k = 6, 16 * 9 - 5, 32 * 27
    w = torch.randn(e, n, k, generator=gen) * 0.02 * torch.exp(torch.randn(e, n, 1, generator=gen))
    experts = lowbit.quantize_nvfp4_experts(w).to("cuda")
    counts = [0, 1, 19, 4, 7, 0]
    off = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), device="cuda")
    x = torch.randn(sum(counts), k, generator=gen).to(dtype).cuda()
    y = lowbit.nvfp4_grouped_linear(x, off, experts)
    ref = torch.cat([_ref(x[a:b], experts.weight(i)) for i, (a, b) in enumerate(zip(off[:-1].tolist(), off[1:].tolist()))])
    assert _rel(y, ref) <= BOUND[dtype]
    assert torch.equal(y, lowbit.nvfp4_grouped_linear(x, off, experts))  # deterministic


# ------------------------------------------------------------------ grouped (MoE) NVFP4 GEMM
def _experts(e, n, k, gen):
    w = torch.randn(e, n, k, generator=gen) * 0.02 * torch.exp(torch.randn(e, n, 1, generator=gen))
    return lowbit.quantize_nvfp4_experts(w).to("cuda")


def _grouped_ref(x, off, experts):
    return torch.cat([_ref(x[a:b], experts.weight(i)) for i, (a, b) in enumerate(zip(off[:-1], off[1:]))])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("nt", [2, 4, 8])
def test_nvfp4_grouped_gemm_every_instance(dtype, nt, gen):
    """The grouped GEMM's NVFP4 instances, called directly with nt token tiles: empty first/last experts, a 1-row
    expert, one over three chunks of 8 nt rows, odd N (a partial row block), K % 256 != 0; into a NaN-poisoned
    output with a guard tail (every row written, nothing past it)."""
    from lowbit.kernels import tiled
    from lowbit.kernels.library import get_library, ptr, stream_of
    from lowbit.kernels.nvfp4 import e2m1_codebook

    e, n, k = 7, 16 * 9 - 5, 32 * 27
    experts = _experts(e, n, k, gen)
    counts = torch.randint(0, 30, (e,), generator=gen)
    counts[0], counts[2], counts[3], counts[e - 1] = 0, 1, 8 * nt * 2 + 3, 0
    off = [0] + counts.cumsum(0).tolist()
    x = torch.randn(off[-1], k, generator=gen).to(dtype).cuda()
    lib = get_library()
    cb, s2 = e2m1_codebook(x.device), experts.scale_2.contiguous()
    launch = tiled.GroupedGemmLauncher(lib, experts.qweight, experts.qscales, cb, s2, tiled.NVFP4, n, k)
    _, ctas = launch.plan(dtype, nt)
    rows = x.shape[0]
    buf = torch.full((rows * n + 64,), float("nan"), dtype=dtype, device="cuda")
    offsets = torch.tensor(off, device="cuda")
    lib.call("nvfp4_grouped_gemm", [ptr(x), ptr(offsets), ptr(experts.qweight), ptr(experts.qscales), ptr(cb), ptr(s2),
                                    ptr(buf), ptr(None), e, n, k, ctas, stream_of(x.device)], dtype=dtype, nt=nt)
    torch.cuda.synchronize()
    assert buf[rows * n:].isnan().all(), "wrote past the output"
    assert _rel(buf[: rows * n].view(rows, n), _grouped_ref(x, off, experts)) <= BOUND[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_nvfp4_grouped_linear_takes_the_gemm_from_the_crossover(dtype, gen):
    """lowbit.nvfp4_grouped_linear at and above the grouped crossover runs the grouped GEMM (and below it the GEMV),
    each against the fp64 reference; reruns are bit-identical, and the op agrees with the GEMV on the same rows
    within the bound (two kernels, one definition)."""
    from lowbit import dispatch

    e, n, k = 16, 200, 1024
    experts = _experts(e, n, k, gen)
    min_rows = dispatch.grouped_gemm_min_rows(torch.device("cuda"))
    for rows in (int(max(min_rows, 4) * e) + 3, 300):
        cut = torch.sort(torch.randint(0, rows + 1, (e - 1,), generator=gen)).values.tolist()
        off = [0] + cut + [rows]
        x = torch.randn(rows, k, generator=gen).to(dtype).cuda()
        assert dispatch.grouped_path(x, e) == "grouped_gemm"
        offsets = torch.tensor(off, device="cuda")
        y = lowbit.nvfp4_grouped_linear(x, offsets, experts)
        ref = _grouped_ref(x, off, experts)
        assert _rel(y, ref) <= BOUND[dtype], rows
        assert torch.equal(y, lowbit.nvfp4_grouped_linear(x, offsets, experts))
        gemv = ops.nvfp4_grouped_gemv(x, offsets, experts.qweight, experts.qscales, experts.scale_2, n, k)
        assert _rel(gemv, ref) <= BOUND[dtype]
    few = x[: max(1, int(min_rows * e) - 1)]
    assert dispatch.grouped_path(few, e) == "grouped_gemv"


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_nvfp4_linear_module_on_cuda(dtype, gen):
    """lowbit.nn.NvFp4Linear on the GPU: the checkpoint-layout GEMV at M = 1, the tiled kernels above it."""
    from torch import nn

    from lowbit.nn import NvFp4Linear

    lin = nn.Linear(2048, 300).to(dtype)
    mod = NvFp4Linear.from_linear(lin).cuda()
    q = mod.nvfp4_weight()
    for m in (1, 4, 40):
        x = torch.randn(m, 2048, generator=gen).to(dtype).cuda()
        ref = _ref(x, q) + lin.bias.detach().double()
        assert _rel(mod(x), ref) <= BOUND[dtype], f"M={m}"


# ------------------------------------------------------------------ routed (MoE, unsorted rows) NVFP4 GEMV
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_nvfp4_experts_module_routed_equals_sorted(dtype, gen, monkeypatch):
    """NvFp4MoeExperts at decode sizes runs the routed GEMV's NVFP4 instance (no sort): bit-equal to the sorted block
    for 1-8 tokens with shared experts and a sentinel id when the activation is its own step (ROUTED_SWIGLU off),
    within the bound when the down GEMV computes it; the op (what torch.compile traces) agrees with the launcher, and
    with the reference within the bound."""
    from lowbit import dispatch
    from lowbit.nn import experts as nn_experts

    e_count, h, inter = 32, 256, 160
    src = torch.nn.Module()
    src.gate_up_proj = torch.nn.Parameter(torch.randn(e_count, 2 * inter, h, generator=gen) * 0.1)
    src.down_proj = torch.nn.Parameter(torch.randn(e_count, h, inter, generator=gen) * 0.1)
    src.act_fn = torch.nn.SiLU()
    ex = lowbit.nn.NvFp4MoeExperts.from_experts(src).to(dtype).cuda()
    with torch.no_grad():
        for tokens in (1, 3, 8):
            hs = torch.randn(tokens, h, generator=gen).to(dtype).cuda()
            idx = torch.randint(0, e_count, (tokens, 4), generator=gen)
            idx[0, 1] = idx[-1, 0]  # two routes share an expert
            idx[-1, -1] = e_count  # a sentinel: a zero row of weight 0
            idx = idx.cuda()
            w = torch.rand(tokens, 4, generator=gen).to(dtype).cuda()
            assert dispatch.moe_routed(hs, idx.numel(), e_count)
            monkeypatch.setattr(dispatch, "MOE_ROUTED", False)
            sorted_ = ex(hs, idx, w)
            monkeypatch.setattr(dispatch, "MOE_ROUTED", True)
            monkeypatch.setattr(nn_experts, "ROUTED_SWIGLU", False)
            got = ex(hs, idx, w)
            assert torch.isfinite(got).all() and torch.equal(got, sorted_), f"{tokens} tokens"
            monkeypatch.setattr(nn_experts, "ROUTED_SWIGLU", True)
            got = ex(hs, idx, w)
            assert torch.isfinite(got).all() and _rel(got, sorted_.cpu().double()) <= BOUND[dtype], f"{tokens} tokens"
            gu = ex.experts("gate_up")
            ids = idx.reshape(-1).contiguous()
            args = (gu.qweight, gu.qscales, gu.scale_2, gu.n, gu.k, 4)
            launched = ex._routed("gate_up", hs, ids, 4)
            assert torch.equal(ops.nvfp4_routed_gemv(hs, ids, *args), launched)
            want = ops.nvfp4_routed_reference(hs.float().cpu(), ids.cpu(), *(t.cpu() for t in args[:3]), *args[3:])
            assert _rel(launched, want.double()) <= BOUND[dtype]
            assert torch.equal(launched[-1], torch.zeros_like(launched[-1]))  # the sentinel's row
