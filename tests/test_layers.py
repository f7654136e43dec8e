"""The fused decoder layer (lowbit.hf.layers): the residual adds and the post-attention RMSNorm inside the kbit
GEMVs' outputs (lowbit.ops.kbit_gemv_epilogue). On CPU through the op's reference; the kernels' side is in
tests/gpu/test_layers_gpu.py."""

import pytest
import torch

import lowbit
from lowbit import ops
from lowbit.formats.kbit import tiled as kbit_tiled
from lowbit.hf import attention as hf_attention
from lowbit.hf import layers as hf_layers


def _weight(gen, n, k, bits=4):
    w = torch.randn(n, k, generator=gen)
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = w
    return lowbit.nn.KbitLinear.from_linear(lin, bits=bits)


@pytest.mark.parametrize("parts", ["rms", "residual", "norm_weight", "all", "none"])
def test_epilogue_reference_is_its_definition(parts, gen):
    """The op's reference = the fp32 product, times the per-row RMS factor, plus bias and residual, rounded once;
    yw = round(y * norm_weight)."""
    m, n, k = 3, 48, 64
    q = _weight(gen, n, k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    rms_x = torch.randn(m, k, generator=gen).to(torch.bfloat16) * 3 if parts in ("rms", "all") else None
    residual = torch.randn(m, n, generator=gen).to(torch.bfloat16) if parts in ("residual", "all") else None
    nw = torch.rand(n, generator=gen).to(torch.bfloat16) + 0.5 if parts in ("norm_weight", "all") else None
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    y, yw = ops.kbit_gemv_epilogue(x, q.qweight, q.qabsmax, q.codebook, q.scale, 4, n, k, bias, rms_x, 1e-5, residual, nw)
    w = kbit_tiled.dequantize(q.qweight, q.qabsmax, q.codebook, q.scale, 4, n, k)
    want = x.float() @ w.t()
    if rms_x is not None:
        want = want / torch.sqrt(rms_x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    want = want + bias.float() + (residual.float() if residual is not None else 0)
    torch.testing.assert_close(y.float(), want, rtol=1e-2, atol=1e-2)
    assert y.dtype == torch.bfloat16 and not torch.isnan(y).any()
    if nw is None:
        assert yw.numel() == 0
    else:
        assert torch.equal(yw, (y.float() * nw.float()).to(torch.bfloat16))


@pytest.mark.parametrize("rms", [True, False])
def test_swiglu_reference_is_its_definition(rms, gen):
    """swiglu=True: silu(g) * u of the plain epilogue's rounded halves [g | u], in fp32, rounded once."""
    m, n, k = 3, 64, 96
    q = _weight(gen, n, k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    rms_x = torch.randn(m, k, generator=gen).to(torch.bfloat16) * 3 if rms else None
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    args = (x, q.qweight, q.qabsmax, q.codebook, q.scale, 4, n, k, bias, rms_x, 1e-5)
    y, _ = ops.kbit_gemv_epilogue(*args)
    s, yw = ops.kbit_gemv_epilogue(*args, swiglu=True)
    assert s.shape == (m, n // 2) and s.dtype == torch.bfloat16 and yw.numel() == 0
    g, u = y.float()[:, : n // 2], y.float()[:, n // 2:]
    assert torch.equal(s, (g * torch.sigmoid(g) * u).to(torch.bfloat16))
    assert not s.isnan().any()


def test_epilogue_errors(gen):
    m, n, k = 2, 32, 64
    q = _weight(gen, n, k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    args = (x, q.qweight, q.qabsmax, q.codebook, q.scale, 4, n, k)
    with pytest.raises(ValueError, match="rms_x must be"):
        ops.kbit_gemv_epilogue(*args, None, torch.zeros(m, n, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="residual must be"):
        ops.kbit_gemv_epilogue(*args, None, None, 1e-6, torch.zeros(m + 1, n, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="norm_weight must be"):
        ops.kbit_gemv_epilogue(*args, None, None, 1e-6, None, torch.zeros(k, dtype=torch.bfloat16))
    with pytest.raises((TypeError, ValueError), match="dtype"):
        ops.kbit_gemv_epilogue(*args, None, None, 1e-6, torch.zeros(m, n, dtype=torch.float16))
    with pytest.raises(ValueError, match="swiglu=True needs .* no residual"):
        ops.kbit_gemv_epilogue(*args, None, None, 1e-6, torch.zeros(m, n, dtype=torch.bfloat16), swiglu=True)
    q48 = _weight(gen, 48, k)
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.kbit_gemv_epilogue(x, q48.qweight, q48.qabsmax, q48.codebook, q48.scale, 4, 48, k, swiglu=True)
    # modules the fused layer does not take: rotated weights (the epilogue's instances are unrotated), fp32 rows
    rotated = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(k, n, bias=False), bits=4, rotation=32)
    assert not hf_layers._takes(rotated, m, x, k)
    assert not hf_layers._takes(q, m, x.float(), k)


def _decode(model, ids, steps, compiled):
    from .tiny_models import decode_logits  # (tiny_models needs transformers: only the tests that build a model)

    return decode_logits(model, ids, steps, compiled)


def _tiny_kbit_llama(seed, dtype=torch.bfloat16, **quantize):
    """A tiny Llama quantized to kbit4 (``quantize``: more quantize_model arguments, e.g. ``format="nvfp4"``), in
    ``dtype``, its attention layers switched to lowbit's fused decode step (the fused decoder layer needs it)."""
    from .tiny_models import build

    model = build("llama", seed)
    lowbit.quantize_model(model, **{"bits": 4, **quantize})
    model = model.to(dtype)
    model.set_attn_implementation("sdpa")
    assert hf_attention.use_gqa_sdpa(model)
    assert hf_attention.use_fused_decode_attention(model) == len(model.model.layers)
    return model


@pytest.mark.parametrize("fuse", ["swiglu", "fused-gate-up", "separate"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fused_layer_decodes_as_the_model(fuse, compiled, gen, monkeypatch):
    """A tiny kbit4 Llama (bf16) decoding 3 steps: with the layers switched, every decode step of every layer
    runs its projections as epilogue GEMVs (o_proj, gate|up or gate and up, down_proj; q|k|v after the first layer)
    and no post-attention norm module, and only the first layer its input norm module; the logits match the
    layer's own forward within bf16 rounding of a few ops (bound: 2% of the logits' spread); prefill runs the
    layer's own forward."""
    torch._dynamo.reset()
    monkeypatch.setattr(hf_layers, "SWIGLU", fuse == "swiglu")
    model = _tiny_kbit_llama(0, fuse=None if fuse != "separate" else False)
    ids = torch.randint(0, 320, (2, 7), generator=gen)
    steps = torch.randint(0, 320, (3, 2, 1), generator=gen)
    want = _decode(model, ids, steps, compiled)
    monkeypatch.setattr(hf_layers, "CPU_REFERENCE", True)
    assert hf_layers.use_fused_decode_layers(model) == 2
    assert hf_layers.use_fused_decode_layers(model) == 0  # already switched
    calls, norms, in_norms = [], [], []
    real = ops.kbit_gemv_epilogue
    monkeypatch.setattr(ops, "kbit_gemv_epilogue",
                        lambda *a, **kw: calls.append(tuple(i for i in (8, 9, 11, 12, 13)
                                                            if len(a) > i and a[i] is not None and a[i] is not False))
                        or real(*a, **kw))
    # count the norm modules' calls without hooks (a hooked module keeps the layer's own forward: next test)
    layers = model.model.layers
    norm_cls = type(layers[0].input_layernorm)
    real_norm = norm_cls.forward
    def counted(m, x):
        if any(m is layer.input_layernorm for layer in layers):
            in_norms.append(1)
        if any(m is layer.post_attention_layernorm for layer in layers):
            norms.append(1)
        return real_norm(m, x)

    monkeypatch.setattr(norm_cls, "forward", counted)
    torch._dynamo.reset()
    got = _decode(model, ids, steps, compiled)
    per_step = 11 if fuse == "separate" else 7  # layer 0: o, gate|up, down; layer 1: q|k|v too (split: 2 + 3 more)
    assert len(calls) == 3 * per_step
    # (residual, norm_weight): o_proj and layer 0's down_proj; (rms_x,): gate|up, q|k|v; (residual,): the last down;
    # (rms_x, swiglu): gate|up with the activation
    assert sorted(set(calls)) == sorted({(11, 12), (9,), (11,)} | ({(9, 13)} if fuse == "swiglu" else set()))
    if not compiled:
        assert norms == [1, 1]  # the prefill's layers only
    if not compiled:  # (dynamo traces the forwards once)
        assert len(in_norms) == 2 + 3  # the prefill's, then layer 0's per step
    assert not torch.isnan(got).any()
    spread = want.amax() - want.amin()
    assert (got - want).abs().max() <= 0.02 * spread


def test_fused_layer_keeps_its_forward_where_it_does_not_apply(gen, monkeypatch):
    """fp32 (no GEMV), prefill and FUSED = False run transformers' own forward: bit-identical logits."""
    model = _tiny_kbit_llama(1, torch.float32)
    ids = torch.randint(0, 320, (1, 5), generator=gen)
    steps = torch.randint(0, 320, (2, 1, 1), generator=gen)
    want = _decode(model, ids, steps, False)
    monkeypatch.setattr(hf_layers, "CPU_REFERENCE", True)
    hf_layers.use_fused_decode_layers(model)
    assert torch.equal(_decode(model, ids, steps, False), want)  # fp32: not the GEMV's dtype
    monkeypatch.setattr(hf_layers, "FUSED", False)
    model = model.to(torch.bfloat16)
    want = _decode(model, ids, steps, False)
    monkeypatch.setattr(hf_layers, "FUSED", True)
    assert not torch.equal(_decode(model, ids, steps, False), want)  # (the switch does switch)


def test_fused_layer_keeps_hooked_modules(gen, monkeypatch):
    """A forward hook on a module the fused step would not call (tensor parallelism's all-reduce on o_proj, a
    profiler's on a norm) keeps the layer's own forward: the hook runs on every step, logits bit for bit."""
    model = _tiny_kbit_llama(2)
    ids = torch.randint(0, 320, (1, 5), generator=gen)
    steps = torch.randint(0, 320, (2, 1, 1), generator=gen)
    monkeypatch.setattr(hf_layers, "CPU_REFERENCE", True)
    want = _decode(model, ids, steps, False)  # (not switched yet: the model's own layers)
    hf_layers.use_fused_decode_layers(model)
    for name in ("self_attn.o_proj", "post_attention_layernorm", "mlp.down_proj", "mlp.gate_proj"):
        seen, calls, real = [], [], ops.kbit_gemv_epilogue
        handles = [layer.get_submodule(name).register_forward_hook(lambda *a, seen=seen: seen.append(1))
                   for layer in model.model.layers]
        monkeypatch.setattr(ops, "kbit_gemv_epilogue",
                            lambda *a, calls=calls, real=real, **kw: calls.append(1) or real(*a, **kw))
        got = _decode(model, ids, steps, False)
        monkeypatch.setattr(ops, "kbit_gemv_epilogue", real)
        for h in handles:
            h.remove()
        assert torch.equal(got, want), name
        assert len(seen) == 2 * 3 and not calls, name  # prefill + 2 steps, 2 layers; no fused step
    # a forward replaced on the instance, as transformers' tensor parallelism wraps a sharded module
    for layer in model.model.layers:
        o = layer.self_attn.o_proj
        o.forward = lambda x, _f=o.forward: _f(x)
    calls = []
    monkeypatch.setattr(ops, "kbit_gemv_epilogue", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    assert torch.equal(_decode(model, ids, steps, False), want) and not calls


class _Wrapped(torch.nn.Module):
    """A projection that is a module of its own kind, with none of nn.Linear's attributes (a torch int4 or a user's
    wrapper): the fused step must leave its layer alone, not ask it for ``out_features``."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("name", ["mlp.gate_proj", "mlp.down_proj", "self_attn.o_proj", "self_attn.q_proj"])
def test_fused_layer_keeps_layers_with_foreign_projections(name, gen, monkeypatch):
    """One projection of every layer wrapped in a module without in/out_features: the layers that cannot run fused
    keep their own forward, bit for bit, and nothing raises; a wrapped q_proj leaves only the q|k|v fusion out."""
    model = _tiny_kbit_llama(4, fuse=False)
    for layer in model.model.layers:
        parent, child = name.rsplit(".", 1)
        mod = layer.get_submodule(parent)
        setattr(mod, child, _Wrapped(getattr(mod, child)))
    ids = torch.randint(0, 320, (1, 5), generator=gen)
    steps = torch.randint(0, 320, (2, 1, 1), generator=gen)
    want = _decode(model, ids, steps, False)
    monkeypatch.setattr(hf_layers, "CPU_REFERENCE", True)
    hf_layers.use_fused_decode_layers(model)
    calls, real = [], ops.kbit_gemv_epilogue
    monkeypatch.setattr(ops, "kbit_gemv_epilogue", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got = _decode(model, ids, steps, False)
    if name == "self_attn.q_proj":  # o, gate, up, down still fused; the q|k|v input norm stays a module
        assert calls and (got - want).abs().max() <= 0.02 * (want.amax() - want.amin())
    else:
        assert not calls and torch.equal(got, want)


def test_listed_classes_are_llamas():
    """Every decoder layer and MLP class the fused layer takes (that this transformers has) runs Llama's forward:
    the same body, so the fused step computes what it replaces."""
    import importlib
    import inspect
    import re

    def body(fn, start):
        src = re.sub(r"\s+", " ", inspect.getsource(fn))
        return src[src.index(start):]

    from transformers.models.llama import modeling_llama as llama

    want_layer = body(llama.LlamaDecoderLayer.forward, "residual = hidden_states")
    want_mlp = body(llama.LlamaMLP.forward, "down_proj =")
    checked = 0
    for names, want, start in ((hf_layers.LAYERS, want_layer, "residual = hidden_states"), (hf_layers.MLPS, want_mlp, "down_proj =")):
        for name in names:
            family = re.sub(r"(DecoderLayer|MLP)$", "", name).lower()
            try:
                mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
            except ImportError:
                continue
            assert body(getattr(mod, name).forward, start) == want, name
            checked += 1
    assert checked >= 2


def test_fused_layer_next_to_an_unquantized_one(gen, monkeypatch):
    """Layer 1's attention left unquantized: layer 0 still runs fused but writes no input for layer 1, which runs
    its own forward; logits within the same bound as the whole fused model."""
    model = _tiny_kbit_llama(3, skip=("lm_head", "*.layers.1.self_attn.*"))
    ids = torch.randint(0, 320, (2, 6), generator=gen)
    steps = torch.randint(0, 320, (3, 2, 1), generator=gen)
    want = _decode(model, ids, steps, False)
    monkeypatch.setattr(hf_layers, "CPU_REFERENCE", True)
    hf_layers.use_fused_decode_layers(model)
    calls = []
    real = ops.kbit_gemv_epilogue
    monkeypatch.setattr(ops, "kbit_gemv_epilogue",
                        lambda *a, **kw: calls.append(tuple(i for i in (9, 11, 12) if len(a) > i and a[i] is not None))
                        or real(*a, **kw))
    got = _decode(model, ids, steps, False)
    assert calls == [(11, 12), (9,), (11,)] * 3  # layer 0: o_proj, gate|up, down_proj without the next input
    assert model.model.layers[1]._lowbit_in is None
    assert (got - want).abs().max() <= 0.02 * (want.amax() - want.amin())


def test_nvfp4_epilogue_reference_is_its_definition(gen):
    """NVFP4's op: the same definition as kbit's on the NVFP4 weight's fp32 product (norm factor, bias, residual,
    one rounding; yw; swiglu of the rounded halves), and the same argument checks."""
    from lowbit.formats import nvfp4

    m, n, k = 3, 64, 96
    w = nvfp4.quantize(torch.randn(n, k, generator=gen))
    qw, qs = w.tiled()
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    rms_x = torch.randn(m, k, generator=gen).to(torch.bfloat16) * 3
    res = torch.randn(m, n, generator=gen).to(torch.bfloat16)
    nw = torch.rand(n, generator=gen).to(torch.bfloat16) + 0.5
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    args = (x, qw, qs, w.scale_2, n, k, bias)
    y32 = x.float() @ nvfp4.dequantize_tiled(qw, qs, w.scale_2, n, k).t()
    want_y, want_yw = ops.apply_epilogue(y32, x.dtype, bias, rms_x, 1e-5, res, nw)
    y, yw = ops.nvfp4_gemv_epilogue(*args, rms_x, 1e-5, res, nw)
    assert torch.equal(y, want_y) and torch.equal(yw, want_yw) and not y.isnan().any()
    plain, _ = ops.nvfp4_gemv_epilogue(*args, rms_x, 1e-5)
    s, _ = ops.nvfp4_gemv_epilogue(*args, rms_x, 1e-5, swiglu=True)
    assert s.shape == (m, n // 2) and torch.equal(s, ops.swiglu_reference(plain))
    with pytest.raises(ValueError, match="residual must be"):
        ops.nvfp4_gemv_epilogue(*args, None, 1e-6, res[:, :-1].contiguous())
    with pytest.raises(ValueError, match="swiglu=True needs"):
        ops.nvfp4_gemv_epilogue(*args, None, 1e-6, res, swiglu=True)
    with pytest.raises(ValueError, match="1..8 rows"):
        ops.nvfp4_gemv_epilogue(torch.zeros(9, k, dtype=torch.bfloat16), *args[1:])


def test_fused_nvfp4_layer_decodes_as_the_model(gen, monkeypatch):
    """The fused layer on a tiny NVFP4 Llama: every projection of a decode step through nvfp4_gemv_epilogue (gate|up
    with swiglu), logits within the kbit test's bound of the model's own layers. Eager: on CPU the NVFP4 model's own
    compiled step does not trace (its weight check is data-dependent); the GPU test compiles it."""
    compiled = False
    torch._dynamo.reset()
    model = _tiny_kbit_llama(0, format="nvfp4")
    ids = torch.randint(0, 320, (2, 7), generator=gen)
    steps = torch.randint(0, 320, (3, 2, 1), generator=gen)
    want = _decode(model, ids, steps, compiled)
    monkeypatch.setattr(hf_layers, "CPU_REFERENCE", True)
    assert hf_layers.use_fused_decode_layers(model) == 2
    calls = []
    real = ops.nvfp4_gemv_epilogue
    monkeypatch.setattr(ops, "nvfp4_gemv_epilogue", lambda *a, **kw: calls.append(len(a) > 11 and a[11]) or real(*a, **kw))
    torch._dynamo.reset()
    got = _decode(model, ids, steps, compiled)
    assert len(calls) == 3 * 7 and sum(calls) == 3 * 2  # o, gate|up (swiglu), down per layer; q|k|v in layer 1
    assert not torch.isnan(got).any()
    assert (got - want).abs().max() <= 0.02 * (want.amax() - want.amin())
