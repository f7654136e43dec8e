"""lowbit as a transformers quantizer (lowbit.hf.quantizer), on the CPU, the way a user loads a model:
``from_pretrained(dir, quantization_config=LowbitConfig(...))`` must give exactly the model quantize_model
makes from the same weights, quantize each layer as it loads, and survive save_pretrained/from_pretrained
with its checksums; bad configs and damaged checkpoints are refused with errors that say what is wrong."""

from __future__ import annotations

import json

import pytest
import torch

import lowbit

from .tiny_models import build

transformers = pytest.importorskip("transformers")
from lowbit.hf import LowbitConfig  # noqa: E402  (registers "lowbit" with transformers)
from lowbit.hf.quantizer import LowbitHfQuantizer  # noqa: E402
from lowbit.model import LoadError  # noqa: E402

FORMATS = [("kbit", 4), ("kbit", 2), ("nvfp4", 4), ("sbvr", 4)]


@pytest.fixture
def saved(tmp_path, gen):
    """save_pretrained of a fresh random tiny model; returns (name -> directory)."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))

    def make(name: str) -> str:
        d = tmp_path / f"dense_{name}"
        build(name, seed).save_pretrained(d)
        return str(d)

    return make


def _load(path, **kw):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()


def _logits(model, gen) -> torch.Tensor:
    ids = torch.randint(0, 300, (2, 9), generator=gen)
    with torch.no_grad():
        return model(ids).logits


def _assert_same_model(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    differ = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not differ, f"tensors differ: {differ[:5]}"
    assert [type(m).__name__ for m in a.modules()] == [type(m).__name__ for m in b.modules()]


@pytest.mark.parametrize("fmt,bits", FORMATS, ids=[f"{f}{b}" for f, b in FORMATS])
@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
def test_quantize_on_load_is_quantize_model_and_round_trips(name, fmt, bits, saved, tmp_path, gen):
    """from_pretrained(quantization_config=...) == quantize_model on the dense load (every tensor, every module,
    the logits bit for bit); then save_pretrained and a plain from_pretrained give the same logits again."""
    path = saved(name)
    q = _load(path, quantization_config=LowbitConfig(format=fmt, bits=bits))
    ref = _load(path)
    report = lowbit.quantize_model(ref, bits=bits, format=fmt, progress=False)
    _assert_same_model(q, ref)
    assert q.lowbit_report.summary().split(" in ")[0] == report.summary().split(" in ")[0]
    want = _logits(ref, gen.manual_seed(1))
    got = _logits(q, gen.manual_seed(1))
    assert torch.isfinite(got).all() and torch.equal(got, want)

    out = tmp_path / "quantized"
    q.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "lowbit" and cfg["format"] == fmt and cfg["modules"] and cfg["checksums"]
    again = _load(out)
    assert type(again.hf_quantizer) is LowbitHfQuantizer
    _assert_same_model(again, q)
    assert torch.equal(_logits(again, gen.manual_seed(1)), want)


def test_options_are_quantize_models(saved, gen):
    """skip / bits_for / fuse / rotation mean what they mean to quantize_model."""
    path = saved("llama")
    for opts in ({"skip": [], "bits_for": {"lm_head": 5, "*.down_proj": 3}}, {"fuse": False}, {"rotation": 32, "bits": 3}):
        q = _load(path, quantization_config=LowbitConfig(**opts))
        ref = _load(path)
        lowbit.quantize_model(ref, progress=False, **opts)
        _assert_same_model(q, ref)
        assert torch.equal(_logits(q, gen.manual_seed(2)), _logits(ref, gen.manual_seed(2)))


def test_layers_are_quantized_as_they_load(saved, monkeypatch):
    """The unquantized model is never whole: at any time at most one fusion group's dense tensors wait."""
    seen = []
    arrived = LowbitHfQuantizer._arrived

    def spy(self, model, key, value):
        arrived(self, model, key, value)
        waiting = sum(len([k for k, i in self._item_of.items() if i == j]) - len(p)
                      for j, p in self._pending.items() if j not in self._built)
        seen.append(waiting)

    monkeypatch.setattr(LowbitHfQuantizer, "_arrived", spy)
    q = _load(saved("llama"), quantization_config=LowbitConfig())
    assert len(seen) == 14  # every linear's weight (lm_head skipped)
    assert max(seen) <= 2  # q|k|v waits for its last member, gate|up for its second
    assert not [n for n, m in q.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]


def test_disk_offload_is_refused(saved):
    with pytest.raises(ValueError, match="offloads to disk"):
        _load(saved("llama"), quantization_config=LowbitConfig(), device_map={"model": "cpu", "lm_head": "disk"})


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="format must be one of"):
        LowbitConfig(format="int3")
    with pytest.raises(ValueError):
        LowbitConfig(bits=9)
    with pytest.raises(TypeError, match="bits must be an int"):
        LowbitConfig(bits="4")
    with pytest.raises(TypeError, match="skip"):
        LowbitConfig(skip=[1])
    with pytest.raises(ValueError, match="rotation"):
        LowbitConfig(rotation=7)
    with pytest.raises(ValueError, match="quantize_model"):
        LowbitConfig(method="gptq")
    with pytest.raises(TypeError, match="unknown options"):
        LowbitConfig(group_size=128)
    cfg = LowbitConfig(format="nvfp4", bits_for={"lm_head": 4})
    assert LowbitConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()


def _tamper(directory, key, fn):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = directory / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    tensors[key] = fn(tensors[key].clone())
    save_file(tensors, str(path), metadata=meta)


def test_damaged_checkpoints_are_refused(saved, tmp_path):
    q = _load(saved("llama"), quantization_config=LowbitConfig())
    out = tmp_path / "q"
    q.save_pretrained(out)
    key = next(k for k in q.state_dict() if k.endswith("qweight"))

    _tamper(out, key, lambda t: t ^ 1)  # one flipped bit in the codes
    with pytest.raises(LoadError, match="checksum"):
        _load(out)

    q.save_pretrained(out)  # a NaN codebook entry with a matching checksum: the value check refuses it
    cb = next(k for k in q.state_dict() if k.endswith("codebook"))
    cfg = json.loads((out / "config.json").read_text())
    from lowbit.model.checkpoint import crc32

    bad = q.state_dict()[cb].clone()
    bad[0] = float("nan")
    cfg["quantization_config"]["checksums"][cb] = crc32(bad)
    (out / "config.json").write_text(json.dumps(cfg))
    _tamper(out, cb, lambda t: bad)
    with pytest.raises(LoadError, match="codebook"):
        _load(out)

    del cfg["quantization_config"]["modules"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LoadError, match="lists no saved modules"):
        _load(out)
