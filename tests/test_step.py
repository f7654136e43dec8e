"""The decode step's own ops (RMSNorm, SiLU-mul), the GEMV's residual epilogue and lowbit's decoder-layer step
(lowbit.hf.layer): references against transformers' arithmetic, argument checks, the layer switch's rules.
The kernels themselves: tests/gpu/test_step_gpu.py."""

import pytest
import torch

import lowbit
from lowbit.hf import layer as hf_layer

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_is_llama_rms_norm(dtype, gen):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(96, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=gen))
    x = (torch.randn(3, 2, 96, generator=gen) * 5).to(dtype)
    with torch.no_grad():
        assert torch.equal(lowbit.ops.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_is_the_gated_mlp_activation(dtype, gen):
    x = (torch.randn(4, 1, 2 * 40, generator=gen) * 4).to(dtype)
    gate, up = x[..., :40], x[..., 40:]
    got = lowbit.ops.silu_mul(x)
    assert got.shape == (4, 1, 40) and got.dtype == dtype
    assert torch.equal(got, torch.nn.functional.silu(gate) * up)


def test_step_ops_reject_bad_input():
    x = torch.randn(2, 16)
    with pytest.raises(TypeError, match="weight must have dtype"):
        lowbit.ops.rms_norm(x, torch.ones(16, dtype=torch.float16), 1e-6)
    with pytest.raises(ValueError, match=r"x must be \[..., N=8\]"):
        lowbit.ops.rms_norm(x, torch.ones(8), 1e-6)
    for eps in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="eps must be"):
            lowbit.ops.rms_norm(x, torch.ones(16), eps)
    with pytest.raises(TypeError, match="x must have dtype"):
        lowbit.ops.rms_norm(torch.ones(2, 16, dtype=torch.int32), torch.ones(16), 1e-6)
    with pytest.raises(ValueError, match=r"gate \| up"):
        lowbit.ops.silu_mul(torch.randn(2, 15))
    with pytest.raises(ValueError, match=r"gate \| up"):
        lowbit.ops.silu_mul(torch.randn(()))


def test_step_ops_opcheck(gen):
    x = torch.randn(3, 64, generator=gen)
    torch.library.opcheck(torch.ops.lowbit.rms_norm, (x, torch.randn(64, generator=gen), 1e-6))
    torch.library.opcheck(torch.ops.lowbit.silu_mul, (x,))


def _kbit(gen, n=48, k_in=96, bias=False, dtype=torch.float32):
    lin = torch.nn.Linear(k_in, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k_in, generator=gen))
    return lowbit.nn.KbitLinear.from_linear(lin, bits=4).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gemv_residual_is_added_before_the_one_rounding(dtype, gen):
    mod = _kbit(gen, dtype=dtype)
    b = mod._buffers
    x = torch.randn(3, 96, generator=gen).to(dtype)
    r = (torch.randn(3, 48, generator=gen) * 8).to(dtype)
    w = mod.dequantize(torch.float32)
    want = (x.float() @ w.t() + r.float()).to(dtype)
    got = lowbit.ops.kbit_gemv(x, b["qweight"], b["qabsmax"], b["codebook"], b["scale"], 4, 48, 96, None, 0, r)
    assert torch.equal(got, want)
    assert torch.equal(mod(x, residual=r), want)
    assert torch.equal(lowbit.nn.linear_residual(mod, x, r), want)
    with pytest.raises(ValueError, match=r"residual must have shape \[M=3, N=48\]"):
        lowbit.ops.kbit_gemv(x, b["qweight"], b["qabsmax"], b["codebook"], b["scale"], 4, 48, 96, None, 0, r[:2])
    with pytest.raises(TypeError, match="residual must have dtype"):
        lowbit.ops.kbit_gemv(x, b["qweight"], b["qabsmax"], b["codebook"], b["scale"], 4, 48, 96, None, 0, r.float())
    with pytest.raises(ValueError, match="residual must be"):
        mod(x, residual=r[:, :40])


def test_linear_residual_respects_hooks_and_other_modules(gen):
    mod = _kbit(gen, bias=True)
    x, r = torch.randn(2, 96, generator=gen), torch.randn(2, 48, generator=gen)
    mod.register_forward_hook(lambda m, a, out: out * 2)  # as tensor parallelism's sum over ranks would
    assert torch.equal(lowbit.nn.linear_residual(mod, x, r), r + 2 * mod.forward(x))
    lin = torch.nn.Linear(96, 48)
    assert torch.equal(lowbit.nn.linear_residual(lin, x, r), r + lin(x))


def _tiny(fuse=True, **kw):
    from .tiny_models import build

    model = build("llama", 0, **kw)
    lowbit.quantize_model(model, bits=4, fuse=fuse, progress=False)
    return model


def test_layer_switch_keeps_cpu_forward(gen):
    model = _tiny()
    ids = torch.randint(0, 320, (2, 7), generator=gen)
    with torch.no_grad():
        want = model(ids).logits
        assert hf_layer.use_fused_decode_layers(model) == 2
        assert hf_layer.use_fused_decode_layers(model) == 0  # already switched
        assert torch.equal(model(ids).logits, want)
        assert torch.equal(model(ids[:, :1]).logits, model.__class__.forward(model, ids[:, :1]).logits)
    assert type(model.model.layers[0]).__name__ == "LowbitFusedLlamaDecoderLayer"
    assert "model.layers.0.mlp.lowbit_fused_gate_proj_up_proj.qweight" in model.state_dict()


def test_layer_step_rules():
    model = _tiny()
    layer = model.model.layers[0]
    assert hf_layer._gate_up(layer.mlp) is layer.mlp.gate_proj.fused
    assert hf_layer._rms_norm_eps(layer.input_layernorm, torch.float32) == layer.input_layernorm.variance_epsilon
    assert hf_layer._rms_norm_eps(layer.input_layernorm, torch.bfloat16) is None  # the weight's dtype differs
    assert hf_layer._gate_up(_tiny(fuse=False).model.layers[0].mlp) is None  # separate gate and up GEMVs
    x = torch.randn(1, 1, 128)
    assert hf_layer._layer_step(layer, x, None, None, None, {}) is None  # on the CPU: the layer's own forward
