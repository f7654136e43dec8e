"""SBVR on CUDA: the encoder runs where the weight is; the kernels (activation encoder, popcount GEMV,
dequantize) against the references -- bit for bit where the arithmetic allows, poisoned outputs, odd N, every
M and group kind, determinism; the module's forward captures in a CUDA graph (nothing in it reads values back)."""

import pytest
import torch

import lowbit
from lowbit.formats import sbvr

from ..tiny_models import build, rel_err
from .kbit_check import capture

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sbvr_module_on_cuda_matches_reference_and_captures(dtype, gen):
    lin = torch.nn.Linear(512, 300)
    lin.weight.data = torch.randn(300, 512, generator=gen) * 0.05
    q = lowbit.quantize_sbvr(lin.weight.detach().cuda(), num_sums=4)   # encoded on the GPU
    assert q.device.type == "cuda" and rel_err(q.dequantize().cpu(), lin.weight.detach()) < 0.13
    mod = lowbit.nn.SbvrLinear.from_weight(q, lin.bias.detach().cuda()).to(dtype=dtype)
    x = torch.randn(3, 512, generator=gen).to(dtype).cuda()
    want = sbvr.linear_bitplane_reference(x.float().cpu(), *(t.cpu() for t in q.tensors()), 128, act_bits=8) + lin.bias.detach()
    y = mod(x)
    assert y.dtype == dtype and rel_err(y.float().cpu(), want) < 1e-2
    g, out = capture(lambda: mod(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)


def test_sbvr_model_on_cuda(gen):
    m = build("llama", int(torch.randint(0, 2**31 - 1, (1,), generator=gen)), dtype=torch.bfloat16, device="cuda")
    report = lowbit.quantize_model(m, format="sbvr", bits=3, progress=False)
    assert report.device.startswith("cuda")
    with torch.no_grad():
        out = m(torch.randint(0, 320, (2, 16), generator=gen).cuda()).logits
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------- the kernels (csrc/sbvr/gemv.cu)
def _weight(n, k, ns, group, gen, device="cuda"):
    w = torch.randn(n, k, generator=gen) * 0.05
    q = lowbit.quantize_sbvr(w.to(device), num_sums=ns, group=group)
    return q, q.tiled()  # (qbits, qidx, cache8)


@pytest.mark.parametrize("ns", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("n,k,group", [(300, 512, 128), (37, 96, 32), (1000, 192, 64), (64, 1024, 256), (17, 4096, 128)])
def test_tiled_dequantize_is_the_decode_bit_for_bit(ns, n, k, group, gen):
    q, t = _weight(n, k, ns, group, gen)
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(lowbit.ops.sbvr_tiled_dequantize(*t, n, k, group, dtype), q.dequantize(dtype))


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_activation_encoder_is_the_reference_bit_for_bit(group, dtype, gen):
    from lowbit.formats.sbvr import tiled

    for m, k in ((1, 4096), (5, 768), (8, 256 * 3)):
        if k % sbvr.act_group(group):
            continue
        x = (torch.randn(m, k, generator=gen) * 3).to(dtype).cuda()
        x[0, :64] = 0.5  # a constant group (s = 1, q = 0)
        xq, xs = lowbit.ops.sbvr_encode_x(x, group)
        rq, rs = tiled.encode_activations_tiled(x, group)
        assert torch.equal(xq, rq) and torch.equal(xs, rs)


@pytest.mark.parametrize("ns", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_popcount_gemv_matches_the_bitplane_reference(ns, dtype, gen):
    """Every M = 1..8, odd N, every group kind; the output is poisoned first (NaN must not survive) and the
    bound is the fp32 reference's (one rounding to dtype + fp32 summation order)."""
    for n, k, group in ((300, 512, 128), (37, 96, 32), (1001, 192, 64), (64, 1024, 256), (4099, 2048, 128)):
        q, t = _weight(n, k, ns, group, gen)
        bias = (torch.randn(n, generator=gen) * 0.1).to(dtype).cuda()
        for m in range(1, 9):
            x = torch.randn(m, k, generator=gen).to(dtype).cuda()
            want = sbvr.linear_bitplane_reference(x.float().cpu(), *(u.cpu() for u in q.tensors()), group, act_bits=8)
            want = want + bias.float().cpu()
            y = lowbit.ops.sbvr_gemv(x, *t, n, k, group, bias)
            assert y.dtype == dtype and torch.isfinite(y).all()
            assert rel_err(y.float().cpu(), want) < 8e-3, (n, k, group, m)


@pytest.mark.parametrize("ns", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lookup_gemv_matches_the_weight_only_reference(ns, dtype, gen):
    """Every M = 1..8, odd N, partial and multi-chunk groups; fp32 reference of the decoded weight, bound: the
    one rounding to dtype plus W rounded to dtype (bf16 points: 2^-8 each) over random-sign sums."""
    bound = 8e-3 if dtype == torch.bfloat16 else 2e-3
    for n, k, group in ((300, 512, 128), (1001, 384, 128), (64, 1024, 256), (4099, 2048, 128), (5, 128, 128)):
        q = lowbit.quantize_sbvr((torch.randn(n, k, generator=gen) * 0.05).cuda(), num_sums=ns, group=group)
        qbits, qcodes, qidx, cache8 = q.layouts()
        bias = (torch.randn(n, generator=gen) * 0.1).to(dtype).cuda()
        w = q.dequantize().cpu()
        for m in range(1, 9):
            x = torch.randn(m, k, generator=gen).to(dtype).cuda()
            want = x.float().cpu() @ w.t() + bias.float().cpu()
            y = lowbit.ops.sbvr_lookup_gemv(x, qcodes, qidx, cache8, n, k, group, bias)
            assert y.dtype == dtype and torch.isfinite(y).all()
            assert rel_err(y.float().cpu(), want) < bound, (n, k, group, m)
            assert torch.equal(y, lowbit.ops.sbvr_lookup_gemv(x, qcodes, qidx, cache8, n, k, group, bias))


def test_popcount_gemv_writes_every_output_and_is_deterministic(gen):
    from lowbit.kernels import sbvr as sbvr_kernels
    from lowbit.kernels.library import get_library, ptr, stream_of

    n, k, group = 777, 2048, 128
    q, (qbits, qidx, cache8) = _weight(n, k, 4, group, gen)
    x = torch.randn(4, k, generator=gen).half().cuda()
    lib = get_library(x.device)
    xq, xs = sbvr_kernels.encode_x(lib, x, group)
    outs = []
    for _ in range(3):
        y = torch.full((4, n), float("nan"), dtype=torch.float16, device="cuda")
        lib.call("sbvr_gemv", [ptr(qbits), ptr(qidx), ptr(cache8), ptr(xq), ptr(xs), ptr(None), ptr(y), n, k, group, 0,
                               stream_of(x.device)], bits=4, dtype=torch.float16, m=4)
        outs.append(y)
    assert torch.isfinite(outs[0]).all()
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_popcount_module_path_captures_in_a_cuda_graph(gen):
    lin = torch.nn.Linear(1024, 520)
    lin.weight.data = torch.randn(520, 1024, generator=gen) * 0.05
    mod = lowbit.nn.SbvrLinear.from_linear(lin.cuda(), bits=4).half()
    x = torch.randn(2, 1024, generator=gen).half().cuda()
    y = mod(x)
    w = mod.sbvr_weight()
    want = sbvr.linear_bitplane_reference(x.float().cpu(), *(u.cpu() for u in w.tensors()), 128, act_bits=8) + lin.bias.detach().cpu()
    assert rel_err(y.float().cpu(), want) < 8e-3
    g, out = capture(lambda: mod(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)
    # weight-only (act_bits=None) and > 8 rows: the dequantize + cuBLAS path, the exact product
    mod.act_bits = None
    want_exact = x.float().cpu() @ w.dequantize().cpu().t() + lin.bias.detach().cpu()
    assert rel_err(mod(x).float().cpu(), want_exact) < 5e-3


@pytest.mark.parametrize("ns", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_grouped_popcount_gemv_matches_the_reference(ns, dtype, gen):
    """Experts with 0, 1, 4 and 11 rows (blocks of 4 per pass), odd N, two groups; poisoned output; the same
    bound as the dense GEMV; repeated calls equal (deterministic); a CUDA graph replays it."""
    for n, k, group in ((300, 512, 128), (77, 192, 64)):
        ex = lowbit.quantize_sbvr_experts((torch.randn(6, n, k, generator=gen) * 0.05).cuda(), num_sums=ns, group=group)
        counts = [0, 1, 4, 11, 0, 2]
        off = torch.tensor([0] + counts).cumsum(0).cuda()
        x = torch.randn(sum(counts), k, generator=gen).to(dtype).cuda()
        y = lowbit.sbvr_grouped_linear(x, off, ex)
        assert y.dtype == dtype and torch.isfinite(y).all()
        spans = list(zip(off[:-1].tolist(), off[1:].tolist()))
        want = torch.cat([sbvr.linear_bitplane_reference(x[a:b].float().cpu(), *(t.cpu() for t in ex.expert(e).tensors()),
                                                         group, act_bits=8) for e, (a, b) in enumerate(spans)])
        assert rel_err(y.float().cpu(), want) < 8e-3
        assert torch.equal(y, lowbit.sbvr_grouped_linear(x, off, ex))
        g, out = capture(lambda: lowbit.sbvr_grouped_linear(x, off, ex))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y)


def test_nan_and_inf_activations_give_nan_outputs(gen):
    """A NaN or Inf in a token's activations makes every output of that token non-finite on every path (the
    popcount path: NaN -- its encoder must not let fminf/fmaxf drop it; the weight-only path: what x @ W^T gives,
    NaN or +-Inf); the other tokens stay finite."""
    n, k = 96, 512
    q, _ = _weight(n, k, 4, 128, gen)
    for bad in (float("nan"), float("inf")):
        x = torch.randn(3, k, generator=gen).half().cuda()
        x[1, 200] = bad
        for path in ("popcount", "lookup"):
            with lowbit.dispatch.forced_path(path):
                y = lowbit.sbvr_linear(x, q, act_bits=8)
            assert (torch.isnan(y[1]) if path == "popcount" else ~torch.isfinite(y[1])).all(), (path, bad)
            assert torch.isfinite(y[[0, 2]]).all(), (path, bad)
        ex = lowbit.quantize_sbvr_experts((torch.randn(2, n, k, generator=gen) * 0.05).cuda(), num_sums=4)
        yg = lowbit.sbvr_grouped_linear(x, torch.tensor([0, 2, 3]).cuda(), ex)
        assert torch.isnan(yg[1]).all() and torch.isfinite(yg[[0, 2]]).all()
