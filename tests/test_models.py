"""quantize_model and save/load on tiny random-init transformers models (Llama, Qwen3-MoE, Mixtral), CPU."""

import copy
import json
import warnings
import zlib

import pytest
import torch
from torch import nn

import lowbit
from lowbit.nn import KbitLinear, KbitMoeExperts
from lowbit.model.checkpoint import INDEX_FILE, LoadError

from . import tiny_models
from .tiny_models import build, reference_copy, rel_err


def _ids(gen, batch=2, seq=9, vocab=320):
    return torch.randint(0, vocab, (batch, seq), generator=gen)


def _seed(gen):
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen))


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "mixtral", "glm4_moe_lite", "qwen3_next"])
@pytest.mark.parametrize("bits", [2, 4, 5])
def test_quantized_model_is_reference_model(name, bits, gen):
    """Logits of the quantized model == logits of the model whose weights are the reference
    dequantization (fp32 on CPU: same math, so rel. error < 1e-5)."""
    seed = _seed(gen)
    model = build(name, seed)
    original = copy.deepcopy(model)
    report = lowbit.quantize_model(model, bits=bits, progress=False)
    kinds = {type(m) for m in model.modules()}
    assert KbitLinear in kinds
    assert (KbitMoeExperts in kinds) == (name != "llama")
    ref = reference_copy(model, build(name, seed))
    ids = _ids(gen)
    with torch.no_grad():
        got, want, orig = model(ids).logits, ref(ids).logits, original(ids).logits
    assert rel_err(got, want) < 1e-5
    # what the bits cost: a loose guard only (routing flips in the MoE models amplify the error)
    assert rel_err(got, orig) < {2: 2.0, 4: 0.5, 5: 0.3}[bits]
    assert report.bits == bits and report.layers


def test_report_numbers(gen):
    model = build("qwen3_moe", _seed(gen))
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    before = tiny_models.transformers  # noqa: F841 (import check)
    total_before = lowbit.model.model_bytes(model)
    report = lowbit.quantize_model(model, bits=4, fuse=False, progress=False)  # per-linear accounting
    names = {x.name for x in report.layers}
    assert "lm_head" not in names and ("lm_head", "output embedding (lm_head), skipped by default") in report.skipped
    assert names == {n for n in linears if n != "lm_head"} | {f"model.layers.{i}.mlp.experts" for i in range(2)}
    # the router gate is an nn.Linear too, quantized: every nn.Linear but lm_head
    for x in report.layers:
        if x.kind == "linear":
            n_out, k = x.shape
            assert x.bytes_before == n_out * k * 4 + (0 if linears[x.name].bias is None else n_out * 4)
            assert x.format_bytes == n_out * k * 4 // 8 + n_out * k // 32
        else:
            e, h, i = x.shape
            assert (e, h, i) == (8, 128, 96) and x.bytes_before == e * 3 * h * i * 4
        assert x.format_bytes <= x.bytes_after < x.bytes_before
    assert report.model_bytes_before == total_before
    assert report.model_bytes_after == lowbit.model.model_bytes(model) < total_before
    assert "kbit4" in str(report) and "lm_head" in str(report)


def test_skip_rules(gen):
    model = build("llama", _seed(gen))
    model.model.layers[0].mlp.odd = nn.Linear(40, 8)  # K_in % 32 != 0: stays, with a warning
    with pytest.warns(UserWarning, match="odd"):
        report = lowbit.quantize_model(model, bits=4, skip=["*.self_attn.q_proj"], fuse=False, progress=False)
    skipped = dict(report.skipped)
    assert "multiple of 32" in skipped["model.layers.0.mlp.odd"]
    assert isinstance(model.model.layers[0].mlp.odd, nn.Linear)
    assert isinstance(model.model.layers[1].self_attn.q_proj, nn.Linear)  # the pattern
    assert isinstance(model.lm_head, KbitLinear)  # skip replaced the default: lm_head quantized
    assert isinstance(model.model.embed_tokens, nn.Embedding)

    model = build("llama", _seed(gen))
    # each linear alone here (fused groups: tests/test_fused.py)
    report = lowbit.quantize_model(model, bits=3, skip=lambda n, m: n.endswith("down_proj"), fuse=False, progress=False)
    assert isinstance(model.model.layers[0].mlp.down_proj, nn.Linear)
    assert isinstance(model.model.layers[0].mlp.up_proj, KbitLinear)
    again = lowbit.quantize_model(model, bits=3, progress=False)  # a second call takes only what is left
    assert {x.name for x in again.layers} == {f"model.layers.{i}.mlp.down_proj" for i in range(2)}
    assert sum(w == "already quantized" for _, w in again.skipped) == 2 * 7 - 2 + 1  # a callable replaces the
    # default skip list, so lm_head was quantized too


def test_unsupported_expert_blocks_are_listed(gen):
    class CustomGate(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.randn(4, 64, 32))
            self.down_proj = nn.Parameter(torch.randn(4, 32, 32))
            self.act_fn = nn.SiLU()

        def _apply_gate(self, gate_up):  # a model-specific gate (e.g. GPT-OSS clamps): not reproduced
            return gate_up

    model = nn.Sequential(CustomGate(), nn.Linear(32, 32))
    report = lowbit.quantize_model(model, bits=4, progress=False)
    assert isinstance(model[0], CustomGate) and isinstance(model[1], KbitLinear)
    assert "does not reproduce" in dict(report.skipped)["0"]
    report = lowbit.quantize_model(build("mixtral", _seed(gen)), bits=4, experts=False, progress=False)
    assert "experts=False" in dict(report.skipped)["model.layers.0.mlp.experts"]


def test_shared_module_quantized_once(gen):
    lin = nn.Linear(64, 32)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    lowbit.quantize_model(model, bits=4, progress=False)
    assert isinstance(model[0], KbitLinear) and model[0] is model[2]


def test_quantize_model_errors():
    with pytest.raises(TypeError, match="nn.Module"):
        lowbit.quantize_model("not a model")
    with pytest.raises(ValueError, match="bits"):
        lowbit.quantize_model(nn.Linear(32, 32), bits=8)


# ------------------------------------------------------------------------------ save / load
def _state_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "mixtral"])
def test_save_load_round_trip_bit_exact(name, tmp_path, gen):
    seed = _seed(gen)
    model = build(name, seed, dtype=torch.bfloat16)
    lowbit.quantize_model(model, bits=3, progress=False)
    lowbit.save_quantized(model, tmp_path, max_shard_bytes=60_000)  # several shards
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["format"] == "lowbit" and index["format_version"] == 2 and index["lowbit_version"] == lowbit.__version__
    assert all(cfg["bits"] == 3 for cfg in index["modules"].values())
    skeleton = build(name, seed + 1, dtype=torch.bfloat16)  # a fresh skeleton (other random weights)
    lowbit.load_quantized(skeleton, tmp_path)
    assert _state_equal(model, skeleton)
    ids = _ids(gen)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, skeleton(ids).logits)


@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
def test_saved_size_is_format_bytes_plus_bf16(name, tmp_path, gen):
    """No tile padding and no fp32 on disk: a model run in fp32 and saved with dtype=bf16 stores
    exactly its format bytes (+ fp32 codebooks / scales) + 2 bytes per unquantized value. Llama is
    built 160 wide / 352 deep, so every layer's K_in is padded in the tiled layout (to 256 / 512)."""
    seed = _seed(gen)
    kw = {"hidden": 160, "inter": 352} if name == "llama" else {}
    model = build(name, seed, **kw)
    lowbit.quantize_model(model, bits=3, progress=False)
    lowbit.save_quantized(model, tmp_path, dtype=torch.bfloat16)
    quantized = {n: m for n, m in model.named_modules() if isinstance(m, (KbitLinear, KbitMoeExperts))}
    own = {f"{n}.{k}" for n, m in quantized.items() for k in m.state_dict() if k != "bias"}
    fmt = sum(m.format_bytes() for m in quantized.values())
    fmt += sum(v.nbytes for k, v in model.state_dict().items() if k in own and ("scale" in k or "codebook" in k))
    plain = sum(v.numel() * 2 for k, v in model.state_dict().items() if k not in own)  # no tied tensors here
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    stored = sum(torch.empty(e["shape"], dtype=getattr(torch, e["dtype"]), device="meta").nbytes
                 for e in index["tensors"].values())
    assert stored == fmt + plain
    on_disk = sum(f.stat().st_size for f in tmp_path.glob("model-*.safetensors"))
    assert stored < on_disk < stored + 64 * 1024  # + the safetensors headers
    assert {e["dtype"] for k, e in index["tensors"].items() if "norm" in k or "embed" in k} == {"bfloat16"}

    skeleton = build(name, seed + 1, **kw)
    lowbit.load_quantized(skeleton, tmp_path, dtype=torch.float32)  # bf16 on disk, fp32 in the model again
    for (k, a), (k2, b) in zip(model.state_dict().items(), skeleton.state_dict().items()):
        assert k == k2 and a.dtype == b.dtype, k
        assert torch.equal(a.to(torch.bfloat16).to(a.dtype) if a.is_floating_point() and k not in own else a, b), k


@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
def test_nvfp4_save_load_round_trip_bit_exact(name, tmp_path, gen):
    """One entry point for every format: quantize_model(format="nvfp4") and the same save/load checks (each linear
    alone here; the fused groups' round trip: test_fused.py)."""
    seed = _seed(gen)
    model = build(name, seed, dtype=torch.bfloat16)
    report = lowbit.quantize_model(model, format="nvfp4", fuse=False, progress=False)
    want = {"linear": lowbit.nn.NvFp4Linear, "experts": lowbit.nn.NvFp4MoeExperts}
    assert report.format == "nvfp4" and all(isinstance(model.get_submodule(x.name), want[x.kind]) for x in report.layers)
    lowbit.save_quantized(model, tmp_path, max_shard_bytes=60_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    types = {"NvFp4Linear", "NvFp4MoeExperts"} if name == "qwen3_moe" else {"NvFp4Linear"}
    assert {cfg["type"] for cfg in index["modules"].values()} == types
    skeleton = build(name, seed + 1, dtype=torch.bfloat16)
    lowbit.load_quantized(skeleton, tmp_path)
    assert _state_equal(model, skeleton)
    ids = _ids(gen)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, skeleton(ids).logits)
    # a block scale made NaN on disk (checksum updated to match) is refused by the value check
    key = f"{next(x.name for x in report.layers if x.kind == 'linear')}.weight_scale"
    from safetensors.torch import load_file, save_file

    shard = tmp_path / index["tensors"][key]["file"]
    tensors = load_file(shard)
    bad = tensors[key].view(torch.uint8).clone()
    bad.view(-1)[0] = 0x7F  # E4M3 NaN
    tensors[key] = bad.view(torch.float8_e4m3fn)
    save_file(tensors, shard, metadata={"format": "lowbit", "format_version": "2"})
    index["tensors"][key]["crc32"] = zlib.crc32(bad.numpy().tobytes())
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(LoadError, match="block scales must be finite"):
        lowbit.load_quantized(build(name, seed + 2, dtype=torch.bfloat16), tmp_path)


def test_save_load_tied_embeddings(tmp_path, gen):
    model = build("llama", _seed(gen), tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    lowbit.quantize_model(model, bits=4, progress=False)
    lowbit.save_quantized(model, tmp_path)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
    skeleton = build("llama", _seed(gen), tie=True)
    lowbit.load_quantized(skeleton, tmp_path)
    assert skeleton.lm_head.weight is skeleton.model.embed_tokens.weight
    assert _state_equal(model, skeleton)


def test_load_onto_meta_skeleton(tmp_path, gen):
    model = build("qwen3_moe", _seed(gen))
    lowbit.quantize_model(model, bits=4, progress=False)
    lowbit.save_quantized(model, tmp_path)
    cfg, cls = tiny_models.qwen3_moe()
    with torch.device("meta"):
        skeleton = cls(cfg)
    # rotary inv_freq is a non-persistent buffer: a meta skeleton cannot be completed -> refused up front
    with pytest.raises(LoadError, match="meta"):
        lowbit.load_quantized(skeleton, tmp_path)


@pytest.fixture
def saved(tmp_path, gen):
    seed = _seed(gen)
    model = build("qwen3_moe", seed)
    lowbit.quantize_model(model, bits=4, fuse=False, progress=False)  # names below are per linear
    lowbit.save_quantized(model, tmp_path, max_shard_bytes=200_000)
    return tmp_path, seed


def _refused(path, seed, match, **kw):
    skeleton = build("qwen3_moe", seed + 7, **kw)
    before = copy.deepcopy(skeleton.state_dict())
    with pytest.raises((LoadError, FileNotFoundError), match=match):
        lowbit.load_quantized(skeleton, path)
    after = skeleton.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before), "half-loaded"
    assert not any(isinstance(m, (KbitLinear, KbitMoeExperts)) for m in skeleton.modules())


def _edit_index(path, fn):
    p = path / INDEX_FILE
    index = json.loads(p.read_text())
    fn(index)
    p.write_text(json.dumps(index))


def test_refuses_wrong_version(saved):
    path, seed = saved
    _edit_index(path, lambda ix: ix.update(format_version=99))
    _refused(path, seed, "format version 99")


def test_refuses_truncated_file(saved):
    path, seed = saved
    shard = sorted(path.glob("model-*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    _refused(path, seed, shard.name)


def test_refuses_tampered_bytes(saved):
    path, seed = saved
    index = json.loads((path / INDEX_FILE).read_text())
    key = "model.layers.1.mlp.experts.down_planes"
    shard = path / index["tensors"][key]["file"]
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0x10  # a flipped bit near the end of the data section
    shard.write_bytes(bytes(data))
    _refused(path, seed, "checksum")


def test_refuses_missing_tensor(saved):
    path, seed = saved
    _edit_index(path, lambda ix: ix["tensors"].pop("model.layers.0.self_attn.q_proj.absmax"))
    _refused(path, seed, "model.layers.0.self_attn.q_proj.absmax.*missing")


def test_refuses_wrong_bits(saved):
    path, seed = saved
    _edit_index(path, lambda ix: ix["modules"]["model.layers.0.self_attn.k_proj"].update(bits=3))
    _refused(path, seed, "model.layers.0.self_attn.k_proj.(planes|codebook)")


def test_refuses_tampered_shape(saved):
    path, seed = saved
    _edit_index(path, lambda ix: ix["tensors"]["model.norm.weight"].update(shape=[64]))
    _refused(path, seed, "model.norm.weight")


def test_refuses_mismatched_model(saved):
    path, seed = saved
    cfg, cls = tiny_models.qwen3_moe()
    cfg.moe_intermediate_size = 64
    torch.manual_seed(seed)
    skeleton = cls(cfg)
    with pytest.raises(LoadError, match="model.layers.0.mlp.experts"):
        lowbit.load_quantized(skeleton, path)
    llama = build("llama", seed)
    with pytest.raises(LoadError, match="does not exist|does not fit|missing|unexpected"):
        lowbit.load_quantized(llama, path)


def test_refuses_unexpected_tensor_and_bad_values(saved, tmp_path_factory):
    path, seed = saved
    _edit_index(path, lambda ix: ix["aliases"].update({"model.extra.weight": "model.norm.weight"}))
    _refused(path, seed, "model.extra.weight.*unexpected")


def test_refuses_not_a_lowbit_dir(tmp_path, gen):
    with pytest.raises(FileNotFoundError, match=INDEX_FILE):
        lowbit.load_quantized(build("llama", 0), tmp_path)
    (tmp_path / INDEX_FILE).write_text('{"format": "gguf"}')
    with pytest.raises(LoadError, match="format"):
        lowbit.load_quantized(build("llama", 0), tmp_path)


def test_save_warns_nothing_for_plain_models(tmp_path):
    model = build("llama", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lowbit.save_quantized(model, tmp_path)  # an unquantized model saves and loads too
    skeleton = build("llama", 1)
    lowbit.load_quantized(skeleton, tmp_path)
    assert _state_equal(model, skeleton)


def test_bits_for_quantizes_lm_head_at_other_bits(gen):
    seed = _seed(gen)
    model = build("llama", seed)
    report = lowbit.quantize_model(model, bits=4, bits_for={"lm_head": 5, "*.mlp.down_proj": 3}, progress=False)
    assert isinstance(model.lm_head, KbitLinear) and model.lm_head.bits == 5
    assert model.model.layers[0].mlp.down_proj.bits == 3 and model.model.layers[0].mlp.up_proj.bits == 4
    assert not report.skipped and {x.name: x.bits for x in report.layers}["lm_head"] == 5
    assert "lm_head kbit5" in str(report)
    ref = reference_copy(model, build("llama", seed))
    ids = _ids(gen)
    with torch.no_grad():
        assert rel_err(model(ids).logits, ref(ids).logits) < 1e-5
    with pytest.raises(ValueError, match="bits"):
        lowbit.quantize_model(build("llama", seed), bits=4, bits_for={"lm_head": 7}, progress=False)
    with pytest.raises(ValueError, match="codebook tensor"):
        lowbit.quantize_model(build("llama", seed), bits=4, codebook=lowbit.formats.kbit.normal_float_codebook(4),
                              bits_for={"lm_head": 5}, progress=False)
