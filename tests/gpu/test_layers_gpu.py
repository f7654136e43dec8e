"""The GEMV epilogue kernels (lowbit.ops.kbit_gemv_epilogue on CUDA) against the op's fp32 definition, through
every dense GEMV kernel, and the fused decoder layer (lowbit.hf.layers) in a compiled decode against the
model's own layers.

Bound (the epilogue): relative norm error of y vs the fp64 definition (product, RMS factor, bias, residual)
<= 1e-3 fp16 / 8e-3 bf16 (kbit_check.BOUND: the output's own rounding dominates); yw is exactly
round(y * norm_weight) of the kernel's own y; NaN never passes. An all-zero residual changes nothing: y is
bit-identical to the plain GEMV's. SwiGLU (``swiglu=True``): silu(g) * u of the fp64 definition's halves, within
SWIGLU_BOUND: four units of the dtype's rounding. The op rounds g, u and the product (three roundings of <= one unit
each), and an error in g reaches silu(g) * u amplified by |g silu'(g) / silu(g)| <= 1.9 where silu(g) is not
negligible; at one token and 16 outputs a few elements carry the norm, and the plain BOUND is passed about once in a
few thousand draws (2026-11-28: 0.0076 of 0.008 in 3,000 CPU draws of the roundings alone)."""

import pytest
import torch

import lowbit
from lowbit import ops
from lowbit.formats.kbit import tiled as kbit_tiled

from .kbit_check import BOUND, DTYPES, rel
from .kbit_check import dtype_id as ids

pytestmark = pytest.mark.gpu

SWIGLU_BOUND = {torch.float16: 4 * 2.0**-11, torch.bfloat16: 4 * 2.0**-8}



def _case(gen, n, k, m, bits, dtype):
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = torch.randn(n, k, generator=gen)
    q = lowbit.nn.KbitLinear.from_linear(lin, bits=bits).cuda()
    t = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(dtype).cuda()
    return q, t(m, k), t(m, k, scale=3.0), t(m, n), (torch.rand(n, generator=gen) + 0.5).to(dtype).cuda(), t(n)


def _want(q, x, rms_x, residual, bias, eps):
    w = kbit_tiled.dequantize(q.qweight, q.qabsmax, q.codebook, q.scale, q.bits, q.out_features, q.in_features)
    x, w, bias = x.cpu(), w.cpu(), bias.cpu()
    rms_x, residual = (None if t is None else t.cpu() for t in (rms_x, residual))
    y = x.double() @ w.double().t()
    if rms_x is not None:
        y = y * torch.rsqrt(rms_x.double().pow(2).mean(-1, keepdim=True) + eps)
    y = y + bias.double()
    return y + residual.double() if residual is not None else y


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_epilogue_through_every_kernel(bits, m, dtype, dense_path, gen):
    for n, k in ((int(torch.randint(16, 400, (1,), generator=gen)), 32 * int(torch.randint(1, 40, (1,), generator=gen))),
                 (256, 4096)):
        q, x, rms_x, residual, nw, bias = _case(gen, n, k, m, bits, dtype)
        args = (x, q.qweight, q.qabsmax, q.codebook, q.scale, bits, n, k, bias)
        # the consumer side: the norm's factor
        y, yw = ops.kbit_gemv_epilogue(*args, rms_x, 1e-5)
        assert yw.numel() == 0 and rel(y, _want(q, x, rms_x, None, bias, 1e-5)) <= BOUND[dtype]
        # the producer side: residual add and the next norm's weight
        y, yw = ops.kbit_gemv_epilogue(*args, None, 1e-6, residual, nw)
        assert rel(y, _want(q, x, None, residual, bias, 0)) <= BOUND[dtype]
        assert torch.equal(yw, (y.float() * nw.float()).to(dtype))
        # a zero residual: the plain GEMV, bit for bit
        y, _ = ops.kbit_gemv_epilogue(*args, None, 1e-6, torch.zeros_like(residual))
        assert torch.equal(y, ops.kbit_gemv(x, q.qweight, q.qabsmax, q.codebook, q.scale, bits, n, k, bias))


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n", [4096, 4104, 200, 203])
def test_epilogue_staged_rows_give_the_direct_loads_bits(m, n, dense_path, gen):
    """The split kernel copies each tile's residual rows and norm weights to shared memory while its units decode
    (16-byte pieces: N % 8 == 0 and aligned rows); otherwise -- N = 203, or a residual one element into its buffer --
    it loads them where it writes. Both give the same bits, and the definition's y."""
    dtype = torch.bfloat16
    q, x, _, residual, nw, bias = _case(gen, n, 1024, m, 4, dtype)
    args = (x, q.qweight, q.qabsmax, q.codebook, q.scale, 4, n, 1024, bias)
    shifted = torch.full((m * n + 1,), float("nan"), dtype=dtype, device="cuda")[1:].view(m, n)
    shifted.copy_(residual)  # contiguous, 2 bytes past a 16-byte boundary
    y, yw = ops.kbit_gemv_epilogue(*args, None, 1e-6, residual, nw)
    y2, yw2 = ops.kbit_gemv_epilogue(*args, None, 1e-6, shifted, nw)
    assert torch.equal(y, y2) and torch.equal(yw, yw2)
    assert rel(y, _want(q, x, None, residual, bias, 0)) <= BOUND[dtype]
    assert torch.equal(yw, (y.float() * nw.float()).to(dtype))
    y3, yw3 = ops.kbit_gemv_epilogue(*args, None, 1e-6, None, nw)  # yw without a residual: staged weights alone
    assert torch.equal(yw3, (y3.float() * nw.float()).to(dtype))
    assert torch.equal(y3, ops.kbit_gemv(x, q.qweight, q.qabsmax, q.codebook, q.scale, 4, n, 1024, bias))


def _want_swiglu(want):
    g, u = want.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("path", ["auto", "bulk"])
def test_swiglu_epilogue(bits, m, dtype, path, gen, monkeypatch):
    """The SwiGLU epilogue (CTA-local over gate/up tile pairs; "bulk": the bulk-copy kernel's instance wherever its
    ring fits) against the definition, with and without the norm's factor and a bias; into a NaN-poisoned y; on shapes
    of one pair to many pairs per CTA."""
    from lowbit.kernels import tiled
    from lowbit.kernels.library import get_library

    monkeypatch.setattr(tiled, "DENSE_PATH", path)

    inter = 16 * int(torch.randint(1, 80, (1,), generator=gen))
    for half, k in ((inter, 32 * int(torch.randint(1, 40, (1,), generator=gen))), (16, 256), (2048, 4096),
                    (16 * 132 * 7 + 16, 512)):
        n = 2 * half
        q, x, rms_x, _, _, bias = _case(gen, n, k, m, bits, dtype)
        # without the norm's factor, x / 8: g and u of k = 4096 unit-variance products have std ~64, and silu(g) * u
        # then passes fp16's 65504 in a few percent of draws (the definition's own y overflows, seed 3607622558)
        for r, xr in ((rms_x, x), (None, x / 8)):
            args = (xr, q.qweight, q.qabsmax, q.codebook, q.scale, bits, n, k, bias)
            y, yw = ops.kbit_gemv_epilogue(*args, r, 1e-5, swiglu=True)
            assert y.shape == (m, half) and yw.numel() == 0
            assert rel(y, _want_swiglu(_want(q, xr, r, None, bias, 1e-5))) <= SWIGLU_BOUND[dtype], (n, k, r is None)
        launch = tiled.GemvLauncher(get_library(), q.qweight, q.qabsmax, q.codebook, q.scale, bits, n, k)
        assert launch.swiglu_ok(dtype, m)
        y = torch.full((m, half), float("nan"), dtype=dtype, device="cuda")
        launch(x, m, y.shape, bias, epilogue=tiled.epilogue(rms_x, 1e-5, swiglu=True), y=y)
        assert not y.isnan().any()
        assert rel(y, _want_swiglu(_want(q, x, rms_x, None, bias, 1e-5))) <= SWIGLU_BOUND[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_nvfp4_epilogue_through_every_kernel(m, dtype, dense_path, gen):
    """NVFP4's epilogue instances (the kbit kernels with FP4 = true): the norm's factor, the residual and yw, and
    SwiGLU against the fp64 definition on the dequantized weight, through each dense kernel."""
    from lowbit.formats import nvfp4

    for n, k in ((32 * int(torch.randint(1, 20, (1,), generator=gen)), 32 * int(torch.randint(1, 40, (1,), generator=gen))),
                 (512, 4096)):
        w = nvfp4.quantize(torch.randn(n, k, generator=gen)).to("cuda")
        qw, qs = w.tiled()
        t = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(dtype).cuda()
        x, rms_x, res, bias = t(m, k), t(m, k, scale=3.0), t(m, n), t(n)
        nw = (torch.rand(n, generator=gen) + 0.5).to(dtype).cuda()
        wd = nvfp4.dequantize_tiled(qw, qs, w.scale_2, n, k).double().cpu()
        prod = x.double().cpu() @ wd.t()
        args = (x, qw, qs, w.scale_2, n, k, bias)
        y, yw = ops.nvfp4_gemv_epilogue(*args, rms_x, 1e-5)
        want = prod * torch.rsqrt(rms_x.double().cpu().pow(2).mean(-1, keepdim=True) + 1e-5) + bias.double().cpu()
        assert yw.numel() == 0 and rel(y, want) <= BOUND[dtype], (n, k)
        s, _ = ops.nvfp4_gemv_epilogue(*args, rms_x, 1e-5, swiglu=True)
        assert s.shape == (m, n // 2) and rel(s, _want_swiglu(want)) <= SWIGLU_BOUND[dtype], (n, k)
        y, yw = ops.nvfp4_gemv_epilogue(*args, None, 1e-6, res, nw)
        assert rel(y, prod + bias.double().cpu() + res.double().cpu()) <= BOUND[dtype]
        assert torch.equal(yw, (y.float() * nw.float()).to(dtype))
        # a zero residual adds nothing: the epilogue without one, bit for bit (and no bias: the plain GEMV)
        y0, _ = ops.nvfp4_gemv_epilogue(*args, None, 1e-6, torch.zeros_like(res))
        assert torch.equal(y0, ops.nvfp4_gemv_epilogue(*args)[0]) and not y0.isnan().any()
        y0, _ = ops.nvfp4_gemv_epilogue(*args[:-1], None, None, 1e-6, torch.zeros_like(res))
        assert torch.equal(y0, ops.nvfp4_gemv(x, qw, qs, w.scale_2, n, k))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_nvfp4_swiglu_epilogue(m, dtype, gen):
    """NVFP4's SwiGLU instance (FP4 = true, CTA-local over gate/up tile pairs) against the fp64 definition on the
    dequantized weight, with and without the norm's factor; the kernel itself (not the op's fallback) into a
    NaN-poisoned y; one pair to many pairs per CTA."""
    from lowbit.formats import nvfp4
    from lowbit.kernels import nvfp4 as nvfp4_kernels
    from lowbit.kernels import tiled
    from lowbit.kernels.library import get_library

    inter = 16 * int(torch.randint(1, 80, (1,), generator=gen))
    for half, k in ((inter, 32 * int(torch.randint(1, 40, (1,), generator=gen))), (16, 256), (2048, 4096),
                    (16 * 132 * 7 + 16, 512)):
        n = 2 * half
        w = nvfp4.quantize(torch.randn(n, k, generator=gen)).to("cuda")
        qw, qs = w.tiled()
        t = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(dtype).cuda()
        x, rms_x, bias = t(m, k), t(m, k, scale=3.0), t(n)
        prod = x.double().cpu() @ nvfp4.dequantize_tiled(qw, qs, w.scale_2, n, k).double().cpu().t()
        # without the norm's factor, x / 8 (exact), so that silu(g) * u stays inside fp16 (as in test_swiglu_epilogue)
        want = {None: prod / 8 + bias.double().cpu(),
                "rms": prod * torch.rsqrt(rms_x.double().cpu().pow(2).mean(-1, keepdim=True) + 1e-5) + bias.double().cpu()}
        for r, key, xr in ((rms_x, "rms", x), (None, None, x / 8)):
            y, yw = ops.nvfp4_gemv_epilogue(xr, qw, qs, w.scale_2, n, k, bias, r, 1e-5, swiglu=True)
            assert y.shape == (m, half) and yw.numel() == 0
            assert rel(y, _want_swiglu(want[key])) <= SWIGLU_BOUND[dtype], (n, k, key)
        launch = nvfp4_kernels.gemv_launcher(get_library(), qw, qs, w.scale_2.reshape(()).contiguous(), n, k)
        assert launch.swiglu_ok(dtype, m)
        y = torch.full((m, half), float("nan"), dtype=dtype, device="cuda")
        launch(x, m, y.shape, bias, epilogue=tiled.epilogue(rms_x, 1e-5, swiglu=True), y=y)
        assert not y.isnan().any()
        assert rel(y, _want_swiglu(want["rms"])) <= SWIGLU_BOUND[dtype]


def test_swiglu_epilogue_where_pairs_do_not_fit(gen):
    """More tile pairs per CTA than shared memory holds: the op still computes silu(g) * u (the plain epilogue,
    then the product); the kernel itself refuses the call rather than write out of bounds."""
    from lowbit.kernels import tiled
    from lowbit.kernels.library import get_library

    dtype, m = torch.bfloat16, 2
    half = 16 * (tiled.SWIGLU_MAX_PAIRS + 1) * torch.cuda.get_device_properties(0).multi_processor_count
    q, x, rms_x, _, _, bias = _case(gen, 2 * half, 64, m, 4, dtype)
    launch = tiled.GemvLauncher(get_library(), q.qweight, q.qabsmax, q.codebook, q.scale, 4, 2 * half, 64)
    assert not launch.swiglu_ok(dtype, m)
    y, _ = ops.kbit_gemv_epilogue(x, q.qweight, q.qabsmax, q.codebook, q.scale, 4, 2 * half, 64, bias, rms_x, 1e-5,
                                  swiglu=True)
    assert rel(y, _want_swiglu(_want(q, x, rms_x, None, bias, 1e-5))) <= SWIGLU_BOUND[dtype]
    launch._plans[(dtype, m, True, True)] = launch._plan(dtype, m, epi=True)  # force the kernel: refused, not run
    with pytest.raises(RuntimeError):
        launch(x, m, (m, half), bias, epilogue=tiled.epilogue(rms_x, 1e-5, swiglu=True),
               y=torch.empty(m, half, dtype=dtype, device="cuda"))


@pytest.mark.parametrize("swiglu", [False, True], ids=["act-kernel", "swiglu"])
def test_epilogue_under_pdl_in_a_graph(swiglu, gen):
    """Three GEMVs chained as the fused layer chains them (producer -> consumer -> producer), launched with
    programmatic launch and replayed in a CUDA graph: each reads what the one before wrote."""
    dtype, d, inter = torch.bfloat16, 1024, 2048
    o, _, _, _, nw, _ = _case(gen, d, d, 1, 4, dtype)
    gu, *_ = _case(gen, 2 * inter, d, 1, 4, dtype)
    down, *_ = _case(gen, d, inter, 1, 4, dtype)
    a = torch.randn(1, d, generator=gen).to(dtype).cuda()
    h = torch.randn(1, d, generator=gen).to(dtype).cuda()
    from lowbit import dispatch

    def step():
        h2, hw = dispatch.gemv_epilogue_op(o, a, residual=h, norm_weight=nw)
        if swiglu:
            act = dispatch.gemv_epilogue_op(gu, hw, rms_x=h2, eps=1e-5, swiglu=True)[0]
        else:
            g_u, _ = dispatch.gemv_epilogue_op(gu, hw, rms_x=h2, eps=1e-5)
            act = torch.nn.functional.silu(g_u[:, :inter]) * g_u[:, inter:]
        return dispatch.gemv_epilogue_op(down, act.contiguous(), residual=h2)[0]

    with lowbit.programmatic_launch():
        want = step()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.cuda.graph(g):
            out = step()
        for _ in range(3):
            a.copy_(torch.randn(1, d, generator=gen).to(dtype))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, step())
    assert not want.isnan().any()


@pytest.mark.parametrize("fmt", ["kbit", "nvfp4"])
@pytest.mark.parametrize("swiglu", [True, False], ids=["swiglu", "act-kernel"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fused_layers_decode_as_the_model(compiled, swiglu, fmt, gen, monkeypatch):
    """A tiny kbit4 Llama (bf16) on the GPU decoding 3 steps: the fused layers' logits match the model's own
    layers within bf16 rounding of a few ops (2% of the logits' spread, as on CPU), with the activation in the
    gate|up GEMV (SWIGLU) or its own kernel."""
    from lowbit.hf import attention as hf_attention
    from lowbit.hf import layers as hf_layers

    from ..test_layers import _decode
    from ..tiny_models import build

    torch._dynamo.reset()
    model = build("llama", 0, hidden=256, inter=512)
    lowbit.quantize_model(model, bits=4, format=fmt)
    model = model.to(device="cuda", dtype=torch.bfloat16)
    model.set_attn_implementation("sdpa")
    hf_attention.use_gqa_sdpa(model)
    hf_attention.use_fused_decode_attention(model)
    ids_ = torch.randint(0, 320, (2, 7), generator=gen).cuda()
    steps = torch.randint(0, 320, (3, 2, 1), generator=gen).cuda()
    want = _decode(model, ids_, steps, compiled)
    assert hf_layers.use_fused_decode_layers(model) == 2
    monkeypatch.setattr(hf_layers, "SWIGLU", swiglu)
    calls = []
    name = f"{fmt}_gemv_epilogue"
    real = getattr(ops, name)
    monkeypatch.setattr(ops, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch._dynamo.reset()
    got = _decode(model, ids_, steps, compiled)
    assert not torch.isnan(got).any()
    assert (got - want).abs().max() <= 0.02 * (want.amax() - want.amin())
    if compiled:
        assert calls  # dynamo traced the op
