"""NvFp4Linear and the two ways to a model of them (quantize, load an NVFP4 checkpoint), on CPU."""

import pytest
import torch
from torch import nn

import lowbit
from lowbit.formats import nvfp4
from lowbit import load_nvfp4_checkpoint, quantize_model
from lowbit.nn import NvFp4Linear


def _mlp(gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 48, bias=False), nn.Linear(48, 8))


def test_module_matches_reference(gen):
    lin = nn.Linear(64, 40)
    mod = NvFp4Linear.from_linear(lin)
    x = torch.randn(2, 3, 64, generator=gen)
    w = nvfp4.quantize(lin.weight.detach())
    ref = (x.reshape(-1, 64) @ w.dequantize().t() + lin.bias.detach()).reshape(2, 3, 40)
    torch.testing.assert_close(mod(x), ref, rtol=0, atol=1e-5)
    assert torch.equal(mod.weight, w.packed) and mod.format_bytes() == 40 * 64 * 9 // 16 + 4


def test_state_dict_is_modelopt_layout_and_round_trips(gen):
    mod = NvFp4Linear.from_linear(nn.Linear(64, 40))
    sd = mod.state_dict()
    assert set(sd) == {"weight", "weight_scale", "weight_scale_2", "bias"}
    assert sd["weight"].dtype == torch.uint8 and sd["weight_scale"].dtype == torch.float8_e4m3fn
    w = nvfp4.from_state_dict(sd)  # the ModelOpt reader takes the module's own state dict
    assert torch.equal(w.packed, mod.weight)
    empty = NvFp4Linear(64, 40)
    empty.load_state_dict(sd)
    x = torch.randn(5, 64, generator=gen)
    assert torch.equal(empty(x), mod(x))


def test_dtype_casts_keep_the_format(gen):
    mod = NvFp4Linear.from_linear(nn.Linear(64, 40)).half()
    assert mod.weight_scale.dtype == torch.float8_e4m3fn and mod.weight_scale_2.dtype == torch.float32
    assert mod.bias.dtype == torch.float16
    assert mod(torch.randn(2, 64, generator=gen).half()).dtype == torch.float16


def test_quantize_model_nvfp4(gen):
    model = _mlp(gen)
    x = torch.randn(256, 64, generator=gen)  # 256 rows: the error estimate itself is stable (4 rows: 0.05-0.21)
    ref = model(x)
    report = quantize_model(model, format="nvfp4", skip=("3",), progress=False)
    assert [x.name for x in report.layers] == ["0", "2"] and type(model[3]) is nn.Linear
    assert report.skipped == [("3", "matches skip pattern '3'")] and report.summary().startswith("quantized 2 linear layers to NVFP4")
    assert isinstance(model[0], NvFp4Linear)
    y = model(x)
    assert (y - ref).norm() / ref.norm() < 0.2  # 4-bit weights: 0.12 on average, at most 0.145 over 300 seeds


def test_load_checkpoint_both_conventions(gen):
    src = _mlp(gen)
    quantize_model(src, format="nvfp4", skip=(), progress=False)
    x = torch.randn(3, 64, generator=gen)
    want = src(x)
    for layout in ("modelopt", "compressed-tensors"):
        sd = {}
        for name in ("0", "2", "3"):
            mod = src.get_submodule(name)
            sd.update(nvfp4.to_state_dict(mod.nvfp4_weight(), layout, prefix=name + "."))
            if mod.bias is not None:
                sd[name + ".bias"] = mod.bias
        dst = _mlp(gen)
        assert load_nvfp4_checkpoint(dst, sd) == ["0", "2", "3"]
        torch.testing.assert_close(dst(x), want, rtol=1e-6, atol=1e-6)


def test_load_checkpoint_rejects_wrong_shape(gen):
    sd = nvfp4.to_state_dict(lowbit.quantize_nvfp4(torch.randn(40, 64)), "modelopt", prefix="0.")
    with pytest.raises(ValueError, match="checkpoint weight is"):
        load_nvfp4_checkpoint(_mlp(gen), sd)


def test_bad_construction():
    with pytest.raises(ValueError, match="in_features % 16"):
        NvFp4Linear(40, 8)
    with pytest.raises(TypeError, match="torch.nn.Linear"):
        NvFp4Linear.from_linear(nn.Conv1d(4, 4, 1))


def test_quantize_model_nvfp4_refuses_kbit_options():
    for kw in ({"bits": 3}, {"codebook": "fit"}, {"bits_for": {"3": 5}}):
        with pytest.raises(ValueError, match="kbit options"):
            quantize_model(_mlp(torch.Generator().manual_seed(0)), format="nvfp4", **kw)
    with pytest.raises(ValueError, match="has no fused module"):  # NVFP4 fuses (test_fused.py); SBVR does not
        quantize_model(_mlp(torch.Generator().manual_seed(0)), format="sbvr", fuse=True)
    with pytest.raises(ValueError, match="format must be one of kbit, nvfp4"):
        quantize_model(_mlp(torch.Generator().manual_seed(0)), format="int4")


@pytest.mark.parametrize("model", ["qwen3_moe", "mixtral"])
def test_moe_expert_blocks_in_nvfp4(model, tmp_path, gen):
    """quantize_model(format="nvfp4") replaces fused expert blocks (NvFp4MoeExperts): the block equals the original
    with its decoded weights, each expert quantized as lowbit.quantize_nvfp4 would; a checkpoint round trip is
    bit-exact and a NaN block scale on disk is refused; method="gptq" rounds the expert blocks to nearest; tensor
    parallel parts sum to the block."""
    import json
    import zlib

    from safetensors.torch import load_file, save_file

    from lowbit.model.checkpoint import INDEX_FILE, LoadError
    from lowbit.nn import NvFp4MoeExperts

    from .tiny_models import build, rel_err

    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    kw = {"moe_inter": 128} if model == "qwen3_moe" else {}  # I = 128 splits in two parts of whole 32-blocks
    m, orig = build(model, seed, **kw), build(model, seed, **kw)
    report = lowbit.quantize_model(m, format="nvfp4", progress=False)
    names = [lay.name for lay in report.layers if lay.kind == "experts"]
    assert names and not any("expert block" in why for _, why in report.skipped)
    h = torch.randn(5, 128, generator=gen)
    for name in names:
        ex, blk = m.get_submodule(name), orig.get_submodule(name)
        assert isinstance(ex, NvFp4MoeExperts)
        want = nvfp4.quantize(blk.gate_up_proj.detach()[1])
        assert torch.equal(ex.experts("gate_up").weight(1).packed, want.packed)
        top = torch.stack([torch.randperm(ex.num_experts, generator=gen)[:2] for _ in range(5)])
        w = torch.rand(5, 2, generator=gen)
        blk.gate_up_proj.data, blk.down_proj.data = ex.dequantize()
        y = ex(h, top, w)
        assert torch.isfinite(y).all() and rel_err(y, blk(h, top, w)) < 1e-5
        if ex.intermediate_dim % 64 == 0:
            parts = [ex.tp_shard("experts", r, 2) for r in range(2)]
            assert rel_err(parts[0](h, top, w) + parts[1](h, top, w), y) < 1e-5
        else:
            with pytest.raises(ValueError, match="whole 32-element blocks"):
                ex.tp_shard("experts", 0, 2)
    ids = torch.randint(0, 300, (2, 9), generator=gen)
    with torch.no_grad():
        logits = m(ids).logits
    lowbit.save_quantized(m, tmp_path / "ck")
    with torch.no_grad():
        assert torch.equal(lowbit.load_quantized(build(model, seed + 1, **kw), tmp_path / "ck")(ids).logits, logits)
    index = json.loads((tmp_path / "ck" / INDEX_FILE).read_text())
    key = f"{names[0]}.down_qscales"
    shard = tmp_path / "ck" / index["tensors"][key]["file"]
    tensors = load_file(shard)
    bad = tensors[key].clone()
    bad.view(-1)[0] = 0x7F  # E4M3 NaN
    tensors[key] = bad
    save_file(tensors, shard, metadata={"format": "lowbit", "format_version": "2"})
    index["tensors"][key]["crc32"] = zlib.crc32(bad.numpy().tobytes())
    (tmp_path / "ck" / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(LoadError, match="block scales must be finite"):
        lowbit.load_quantized(build(model, seed + 2, **kw), tmp_path / "ck")
    g = build(model, seed, **kw)
    lowbit.quantize_model(g, format="nvfp4", method="gptq", calibration=torch.randint(0, 300, (2, 16), generator=gen),
                          progress=False)
    for name in names:
        assert torch.equal(g.get_submodule(name).down_qweight, m.get_submodule(name).down_qweight)


def test_moe_expert_module_bad_input(gen):
    from lowbit.nn import NvFp4MoeExperts

    with pytest.raises(ValueError, match="intermediate_dim % 32 == 0"):
        NvFp4MoeExperts(4, 64, 48)
    with pytest.raises(ValueError, match="num_experts must be a positive int"):
        NvFp4MoeExperts(0, 64, 64)
    with pytest.raises(TypeError, match="not a fused expert block"):
        NvFp4MoeExperts.from_experts(nn.Linear(64, 64))
    ex = NvFp4MoeExperts(4, 64, 64)
    with pytest.raises(ValueError, match=r"hidden_states must be \[tokens, 64\]"):
        ex(torch.randn(3, 32), torch.zeros(3, 2, dtype=torch.int64), torch.ones(3, 2))
    with pytest.raises(ValueError, match="style"):
        ex.tp_shard("colwise", 0, 2)
