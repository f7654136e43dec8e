"""Fused projections (lowbit.nn.fused): one kbit weight for linears that read the same input."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import lowbit
from lowbit.nn import FusedKbitLinear, KbitLinear, KbitLinearPart, fuse_linears

from .tiny_models import build, reference_copy, rel_err

pytest.importorskip("transformers")


def _seed(gen):
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen))


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "glm4_moe_lite", "qwen3_next"])
def test_fused_model_is_the_reference_model(name, gen):
    seed = _seed(gen)
    model = build(name, seed)
    report = lowbit.quantize_model(model, bits=4, fuse=True, progress=False)
    fused = [m for m in model.modules() if isinstance(m, FusedKbitLinear)]
    assert fused and any(x.kind == "fused" for x in report.layers)
    assert not any(isinstance(m, nn.Linear) for n, m in model.named_modules() if not n.endswith("lm_head")
                   and not n.endswith("gate") and "router" not in n)  # every block linear quantized
    ref = reference_copy(model, build(name, seed))
    ids = torch.randint(0, 320, (2, 7), generator=gen)
    with torch.no_grad():
        assert rel_err(model(ids).logits, ref(ids).logits) < 1e-5


def test_fused_groups_and_report(gen):
    model = build("llama", _seed(gen))
    report = lowbit.quantize_model(model, bits=4, fuse=True, progress=False)
    att, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(att.q_proj, KbitLinearPart) and att.q_proj.fused is att.lowbit_fused_q_proj_k_proj_v_proj
    assert att.lowbit_fused_q_proj_k_proj_v_proj.out_sizes == (128, 64, 64)
    assert mlp.lowbit_fused_gate_proj_up_proj.out_sizes == (224, 224) and isinstance(mlp.down_proj, KbitLinear)
    names = [x.name for x in report.layers]
    assert names[:4] == ["model.layers.0.self_attn.{q_proj,k_proj,v_proj}", "model.layers.0.self_attn.o_proj",
                         "model.layers.0.mlp.{gate_proj,up_proj}", "model.layers.0.mlp.down_proj"]
    # the parts own no tensors: the state dict holds each weight once
    assert not any(k.startswith("model.layers.0.self_attn.q_proj.") for k in model.state_dict())
    with pytest.raises(ValueError, match="fuse groups"):
        lowbit.quantize_model(build("llama", 1), fuse=[("q_proj",)], progress=False)


def test_fuse_needs_matching_members(gen):
    """A group with a skipped member, or members of different bits, stays unfused."""
    model = build("llama", _seed(gen))
    lowbit.quantize_model(model, bits=4, fuse=True, skip=("lm_head", "*.k_proj"), bits_for={"*.up_proj": 5},
                          progress=False)
    att, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(att.k_proj, nn.Linear) and isinstance(att.q_proj, KbitLinear)
    assert isinstance(mlp.up_proj, KbitLinear) and mlp.up_proj.bits == 5 and isinstance(mlp.gate_proj, KbitLinear)


def test_round_semantics(gen):
    """Each part gets its own rows; a new input, a repeated part or an in-place change recomputes."""
    lins = [nn.Linear(64, n, bias=True) for n in (48, 16, 16)]
    parent = nn.Module()
    for i, lin in enumerate(lins):
        setattr(parent, f"p{i}", lin)
    fused = fuse_linears(parent, ["p0", "p1", "p2"], bits=5)
    assert fused.part_names == ("p0", "p1", "p2") and parent.lowbit_fused_p0_p1_p2 is fused
    calls = []
    compute = fused.forward
    fused.forward = lambda x: (calls.append(1), compute(x))[1]  # count the fused computations
    x, x2 = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen)
    full = fused(x)
    calls.clear()
    a, b, c = parent.p0(x), parent.p1(x), parent.p2(x)
    assert len(calls) == 1 and torch.equal(torch.cat([a, b, c], -1), full)
    assert fused._round_input is None  # round over: nothing kept
    parent.p0(x)
    assert torch.equal(parent.p1(x2), fused(x2)[:, 48:64])  # another input mid-round
    calls.clear()
    parent.p2(x)
    parent.p2(x)
    assert len(calls) == 2  # the same part twice: computed twice
    parent.p0(x)
    x.add_(1.0)  # modified in place mid-round: recomputed
    assert torch.equal(parent.p1(x), fused(x)[:, 48:64])
    with pytest.raises(TypeError, match="not torch.nn.Linear"):
        fuse_linears(parent, ["p0", "p1"])  # already parts
    with pytest.raises(ValueError, match="in_features"):
        FusedKbitLinear.from_linears([nn.Linear(64, 8), nn.Linear(96, 8)])
    with pytest.raises(ValueError, match="bias"):
        FusedKbitLinear.from_linears([nn.Linear(64, 8), nn.Linear(64, 8, bias=False)])


def test_fused_model_compiles(gen):
    model = build("llama", _seed(gen))
    lowbit.quantize_model(model, bits=3, fuse=True, progress=False)
    ids = torch.randint(0, 320, (1, 5), generator=gen)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(n for n in gm.graph.nodes if n.op == "call_function" and "kbit_tiled_linear" in str(n.target))
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        want = model(ids).logits
        got = torch.compile(model, fullgraph=True, backend=backend)(ids).logits
    assert torch.equal(got, want)
    assert len(seen) == 2 * 4  # per layer: q|k|v, o, gate|up, down


def test_fused_save_load_round_trip(tmp_path, gen):
    seed = _seed(gen)
    model = build("qwen3_next", seed, dtype=torch.bfloat16)
    lowbit.quantize_model(model, bits=4, fuse=True, progress=False)
    lowbit.save_quantized(model, tmp_path, max_shard_bytes=50_000)
    skeleton = lowbit.load_quantized(build("qwen3_next", seed + 1, dtype=torch.bfloat16), tmp_path)
    sa, sb = model.state_dict(), skeleton.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(isinstance(m, KbitLinearPart) for m in skeleton.modules())
    ids = torch.randint(0, 320, (1, 6), generator=gen)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, skeleton(ids).logits)
    # a skeleton whose linears do not fit the saved parts is refused, unchanged
    other = build("llama", seed)
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(lowbit.model.LoadError):
        lowbit.load_quantized(other, tmp_path)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


_CALLS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(calls=_CALLS, seed=st.integers(0, 2**31 - 1))
def test_round_semantics_any_call_sequence(calls, seed):
    """Any interleaving of parts, inputs and in-place changes: every part returns exactly its rows of
    the fused product of the input as it is at the call."""
    g = torch.Generator().manual_seed(seed)
    parent = nn.Module()
    for i, n in enumerate((40, 24, 8)):
        setattr(parent, f"p{i}", nn.Linear(32, n, bias=True))
    fused = fuse_linears(parent, ["p0", "p1", "p2"], bits=4)
    inputs = [torch.randn(2, 32, generator=g) for _ in range(3)]
    for part, which, modify in calls:
        x = inputs[which]
        if modify:
            x.mul_(0.5).add_(0.25)  # in place: the same object, new values
        want = fused(x.clone())[:, fused.offsets[part]:fused.offsets[part] + fused.out_sizes[part]]
        assert torch.equal(getattr(parent, f"p{part}")(x), want)


# ------------------------------------------------------------------ NVFP4 (fused by default too)
def test_nvfp4_fuses_by_default(gen):
    from lowbit.nn import FusedNvFp4Linear, LinearPart, NvFp4Linear

    seed = _seed(gen)
    plain = build("llama", seed)
    lowbit.quantize_model(plain, format="nvfp4", fuse=False, progress=False)
    assert not any(isinstance(m, FusedNvFp4Linear) for m in plain.modules())
    model = build("llama", seed)
    report = lowbit.quantize_model(model, format="nvfp4", progress=False)
    att = model.model.layers[0].self_attn
    fused = att.lowbit_fused_q_proj_k_proj_v_proj
    assert isinstance(fused, FusedNvFp4Linear) and isinstance(att.q_proj, LinearPart) and fused.out_sizes == (128, 64, 64)
    assert isinstance(att.o_proj, NvFp4Linear) and any(x.kind == "fused" for x in report.layers)
    # the fused weight is NVFP4 of the concatenated weights (one tensor scale): the reference model
    dense = build("llama", seed)
    w = torch.cat([dense.model.layers[0].self_attn.get_submodule(p).weight for p in ("q_proj", "k_proj", "v_proj")])
    assert torch.equal(fused.dequantize(), lowbit.quantize_nvfp4(w.detach()).dequantize())
    ids = torch.randint(0, 320, (2, 7), generator=gen)
    with torch.no_grad():
        got, alone, ref = model(ids).logits, plain(ids).logits, dense(ids).logits
    # fused and separately scaled NVFP4 are the same format: as far from each other as from the dense model
    assert rel_err(got, ref) < 0.5 and rel_err(got, alone) < 2 * rel_err(alone, ref)


def test_nvfp4_fused_save_load_and_gptq(tmp_path, gen):
    from lowbit.nn import FusedNvFp4Linear

    seed = _seed(gen)
    model = build("llama", seed, dtype=torch.bfloat16)
    lowbit.quantize_model(model, format="nvfp4", fuse=True, progress=False)
    lowbit.save_quantized(model, tmp_path)
    skeleton = lowbit.load_quantized(build("llama", seed + 1, dtype=torch.bfloat16), tmp_path)
    assert any(isinstance(m, FusedNvFp4Linear) for m in skeleton.modules())
    ids = torch.randint(0, 320, (1, 6), generator=gen)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, skeleton(ids).logits)
    calibrated = build("llama", seed)
    lowbit.quantize_model(calibrated, format="nvfp4", fuse=True, method="gptq", progress=False,
                          calibration=torch.randint(0, 320, (2, 16), generator=gen))
    assert any(isinstance(m, FusedNvFp4Linear) for m in calibrated.modules())
    with pytest.raises(ValueError, match="bits"):
        FusedNvFp4Linear.from_linears([nn.Linear(32, 8), nn.Linear(32, 8)], bits=3)
