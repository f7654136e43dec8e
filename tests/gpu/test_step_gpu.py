"""The decode step's own kernels on CUDA: RMSNorm and SiLU-mul (csrc/step/), the GEMV's residual epilogue,
and a Llama decoder layer's decode step in lowbit's kernels only (lowbit.hf.layer).

Bounds: rms_norm and silu_mul compute transformers' arithmetic in fp32 with the same roundings, so they
differ from the reference only where fp32 sums (rms_norm: summation order) or expf/rsqrtf land an
intermediate on the other side of a rounding boundary: each element within 1 ulp of the output dtype and
>= 99% of them bit-identical. The GEMV with a residual: relative norm error vs fp64 as the GEMV tests
(kbit_check.BOUND), and bit-identical to the plain GEMV when the residual is zero. NaN never passes.
"""

import pytest
import torch

import lowbit
from lowbit.kernels import tiled

from .kbit_check import BOUND, DTYPES, capture
from .kbit_check import dtype_id as ids

pytestmark = pytest.mark.gpu

ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _within_ulp(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert not got.isnan().any(), "NaN in output"
    g, w = got.double(), want.double()
    # one ulp at the larger magnitude's binade (<= 2 x the relative unit)
    assert ((g - w).abs() <= 2 * ULP[dtype] * torch.maximum(g.abs(), w.abs())).all(), \
        f"max |diff| {(g - w).abs().max().item():.3e}"
    assert (got == want).double().mean().item() >= 0.99


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("rows,n", [(1, 4096), (3, 2048), (8, 8192), (2, 1000), (5, 8), (1, 3), (300, 136)])
def test_rms_norm_matches_reference(rows, n, dtype, gen):
    x = (torch.randn(rows, n, generator=gen) * 3).to(dtype).cuda()
    w = torch.randn(n, generator=gen).to(dtype).cuda()
    eps = float(torch.rand(1, generator=gen)) * 1e-5
    got = lowbit.ops.rms_norm(x, w, eps)
    _within_ulp(got, lowbit.ops.rms_norm_reference(x, w, eps), dtype)


def test_rms_norm_is_transformers_llama_norm(gen):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(4096, eps=1e-5).to(torch.bfloat16).cuda()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(4096, generator=gen))
    x = torch.randn(4, 1, 4096, generator=gen).to(torch.bfloat16).cuda()
    with torch.no_grad():
        _within_ulp(lowbit.ops.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x), torch.bfloat16)


def test_rms_norm_strided_and_nan(gen):
    x = torch.randn(6, 2 * 512, generator=gen).half().cuda()[:, ::2]  # not contiguous
    w = torch.randn(512, generator=gen).half().cuda()
    _within_ulp(lowbit.ops.rms_norm(x, w, 1e-6), lowbit.ops.rms_norm_reference(x, w, 1e-6), torch.float16)
    x = torch.randn(2, 512, generator=gen).half().cuda()
    x[1, 7] = float("nan")
    y = lowbit.ops.rms_norm(x, w, 1e-6)
    assert y[1].isnan().all() and not y[0].isnan().any()


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("shape", [(1, 1, 2 * 14336), (4, 2 * 4096), (3, 2 * 12), (2, 2 * 5), (7, 1, 2 * 1408)])
def test_silu_mul_matches_reference(shape, dtype, gen):
    x = (torch.randn(*shape, generator=gen) * 4).to(dtype).cuda()
    got = lowbit.ops.silu_mul(x)
    _within_ulp(got, lowbit.ops.silu_mul_reference(x), dtype)
    i = shape[-1] // 2
    act = torch.nn.functional.silu(x[..., :i]) * x[..., i:]  # transformers' LlamaMLP
    _within_ulp(got, act, dtype)


@pytest.mark.parametrize("early", [False, True], ids=["trigger-after-wait", "trigger-at-entry"])
def test_step_kernels_in_graph_with_pdl_chain(early, gen):
    """norm -> GEMV -> SiLU-mul -> GEMV (+ residual) -> norm under PDL in a CUDA graph: bit-equal to the chain
    launched plainly (each kernel waits for its predecessor before reading what it wrote; with ``early`` the
    norm and SiLU-mul let the GEMV after them start before they wait)."""
    up = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(1024, 2 * 2816, bias=False), bits=4).half().cuda()
    down = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(2816, 1024, bias=False), bits=4).half().cuda()
    w = torch.randn(1024, generator=gen).half().cuda()
    x = torch.randn(2, 1024, generator=gen).half().cuda()

    def chain():
        h = lowbit.ops.rms_norm(x, w, 1e-5, early)
        h = down(lowbit.ops.silu_mul(up(h), early), residual=x)
        return lowbit.ops.rms_norm(h, w, 1e-5), h

    with torch.no_grad():
        want = chain()
        with lowbit.programmatic_launch():
            up._launcher = down._launcher = None
            chain()
            g, got = capture(chain)
        for _ in range(3):
            for t in got:
                t.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            for a, b in zip(got, want):
                assert torch.equal(a, b)


@pytest.mark.parametrize("path", ["streamk", "local", "split"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gemv_residual_epilogue(path, dtype, m, gen, monkeypatch):
    """y = x W^T + residual in the GEMV (one rounding), on every dense kernel, eager launcher and op alike."""
    monkeypatch.setattr(tiled, "DENSE_PATH", path)
    n, k_in = 2048 + 16, 1024 + 64
    lin = torch.nn.Linear(k_in, n, bias=False)
    mod = lowbit.nn.KbitLinear.from_linear(lin, bits=4).to(dtype).cuda()
    x = torch.randn(m, k_in, generator=gen).to(dtype).cuda()
    r = (torch.randn(m, n, generator=gen) * 4).to(dtype).cuda()
    w = mod.dequantize(torch.float64).cpu()
    want = x.cpu().double() @ w.t() + r.cpu().double()
    with torch.no_grad():
        plain = mod(x)
        for y in (mod(x, residual=r), lowbit.dispatch.kbit_tiled_linear_op(
                x, *(mod._buffers[k] for k in ("qweight", "qabsmax", "codebook", "scale")), 4, n, k_in, None, 0, r)):
            assert not y.isnan().any()
            assert ((y.cpu().double() - want).norm() / want.norm()).item() <= BOUND[dtype]
            # the sum is rounded once: within half an ulp of the rounded GEMV output plus the residual, more or less
            assert ((y.double() - (plain.double() + r.double())).abs() <= ULP[dtype] * (y.double().abs() + plain.double().abs())).all()
        assert torch.equal(mod(x, residual=torch.zeros_like(r)), plain)


def test_gemv_residual_with_bias_and_hooks(gen):
    lin = torch.nn.Linear(512, 768, bias=True)
    mod = lowbit.nn.KbitLinear.from_linear(lin, bits=4).half().cuda()
    x = torch.randn(2, 512, generator=gen).half().cuda()
    r = torch.randn(2, 768, generator=gen).half().cuda()
    with torch.no_grad():
        want = mod(x).double() + r.double()
        got = mod(x, residual=r)
        assert ((got.double() - want).abs() <= 2 * ULP[torch.float16] * want.abs() + 1e-3).all()
        # a hooked module (tensor parallelism's all-reduce) gets the residual after its call
        mod.register_forward_hook(lambda m, a, out: out * 2)
        got = lowbit.nn.linear_residual(mod, x, r)
        assert torch.equal(got, r + 2 * mod.forward(x))


def _tiny_llama(gen):
    from lowbit.hf.attention import use_fused_decode_attention, use_gqa_sdpa

    from ..tiny_models import build

    model = build("llama", 0, dtype=torch.bfloat16, device="cuda", hidden=256, inter=512)  # head_dim 64
    lowbit.quantize_model(model, bits=4, fuse=True, progress=False)
    model.set_attn_implementation("sdpa")
    assert use_gqa_sdpa(model)
    assert use_fused_decode_attention(model) == 2
    return model


@pytest.mark.parametrize("batch", [1, 3])
def test_decoder_layer_step_in_lowbit_kernels(batch, gen, monkeypatch):
    """A tiny kbit4 Llama (head_dim 64): 4 decode steps after a 9-token prompt with lowbit's layer step give
    the model's own logits within bf16 rounding (the residual adds are rounded once instead of twice) and the
    same caches; the layer step ran for every layer and step."""
    from transformers import StaticCache

    from lowbit.hf import layer as hf_layer

    model = _tiny_llama(gen)
    ids = torch.randint(0, 320, (batch, 9), generator=gen).cuda()
    steps = torch.randint(0, 320, (4, batch, 1), generator=gen).cuda()
    taken = []
    step = hf_layer._layer_step

    def counted(*a):
        out = step(*a)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(hf_layer, "_layer_step", counted)

    def run():
        cache = StaticCache(config=model.config, max_cache_len=40)
        out = []
        with torch.no_grad():
            model(ids, past_key_values=cache, position_ids=torch.arange(9).expand(batch, -1).cuda(), use_cache=True)
            for i, tok in enumerate(steps):
                out.append(model(tok, past_key_values=cache, position_ids=torch.full((batch, 1), 9 + i).cuda(),
                                 use_cache=True).logits.float())
        return torch.cat(out, 1), cache

    want, want_cache = run()
    assert not taken
    assert hf_layer.use_fused_decode_layers(model) == 2
    got, got_cache = run()
    assert taken.count(True) == 2 * 4 and taken.count(False) == 2  # the prefill took the layers' own forward
    assert torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 2e-2
    for a, b in zip(got_cache.layers, want_cache.layers):
        assert ((a.keys.float() - b.keys.float()).norm() / b.keys.float().norm()).item() < 1e-2
        assert int(a.cumulative_length) == 13


def test_greedy_decode_compiled_with_layer_step(gen):
    """The compiled, graphed decode loop with lowbit's layer step: the same tokens as without it for most steps
    (bf16 rounding of the residual adds may flip a near-tie), finite throughout."""
    from lowbit.hf import decode
    from lowbit.hf import layer as hf_layer

    model = _tiny_llama(gen)
    ids = torch.randint(0, 320, (2, 9), generator=gen)
    hf_layer.DECODE_LAYER = False
    try:
        want = decode.greedy_decode(model, ids, 8, compile=True).tokens
    finally:
        hf_layer.DECODE_LAYER = True
    torch._dynamo.reset()
    got = decode.greedy_decode(model, ids, 8, compile=True).tokens
    assert (got == want).double().mean().item() >= 0.75
