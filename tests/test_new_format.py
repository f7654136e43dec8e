"""A new format needs no edit to the model layer: a module class defined here (a toy int8 format, rows
scaled by their absmax) is enough for quantize_model(format=...), save/load with the integrity checks,
and lowbit generate's --format. docs/architecture.md lists what a real format adds (ops, kernels, dispatch)."""

import json

import pytest
import torch
from torch import nn

import lowbit
from lowbit.model.checkpoint import INDEX_FILE, LoadError
from lowbit.nn.base import REGISTRY, QuantizedModule, describe

from .tiny_models import build, rel_err


class ToyInt8Linear(QuantizedModule):
    format_name = "toyint8"
    k_multiple = 1

    @classmethod
    def label(cls, bits):
        return "toyint8"

    def __init__(self, in_features, out_features, bias=True, *, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.zeros((out_features, in_features), dtype=torch.int8, device=device))
        self.register_buffer("row_scale", torch.ones((out_features,), dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False) if bias else None

    @classmethod
    def check_options(cls, bits=4, codebook=None):
        if codebook is not None:
            raise ValueError("codebook is a kbit option")

    @classmethod
    def from_linear(cls, linear, bits=4, codebook=None):
        cls.check_options(bits, codebook)
        w = linear.weight.detach().float()
        scale = w.abs().amax(1).clamp_min(1e-12) / 127
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, device=w.device)
        mod.qweight.copy_(torch.round(w / scale[:, None]).to(torch.int8))
        mod.row_scale.copy_(scale)
        if linear.bias is not None:
            mod.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return mod

    def forward(self, x):
        w = (self.qweight.float() * self.row_scale[:, None]).to(x.dtype)
        return nn.functional.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def format_bytes(self):
        return self.qweight.numel() + 4 * self.out_features

    def checkpoint_config(self):
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None}

    @classmethod
    def from_checkpoint_config(cls, name, cfg, old):
        n, k, bias = cfg["out_features"], cfg["in_features"], cfg["bias"]
        if isinstance(old, (nn.Linear, cls)) and (old.out_features, old.in_features, old.bias is not None) == (n, k, bias):
            return cls(k, n, bias, device="meta")
        raise ValueError(f"saved ToyInt8Linear({k} -> {n}) does not fit this model's {describe(old)}")

    def check_checkpoint_values(self, name, staged):
        s = staged[f"{name}.row_scale"]
        if not bool(torch.isfinite(s).all()) or bool((s <= 0).any()):
            raise ValueError(f"tensor {name + '.row_scale'!r}: scales must be finite and > 0")


REGISTRY.pop("ToyInt8Linear")  # it registered itself when defined; only the tests below may see it


@pytest.fixture(autouse=True)
def _registered():
    REGISTRY["ToyInt8Linear"] = ToyInt8Linear
    yield
    REGISTRY.pop("ToyInt8Linear", None)


def test_quantize_save_load_a_format_the_library_does_not_know(tmp_path):
    assert "toyint8" in lowbit.nn.formats()
    model = build("llama", 3)
    ids = torch.randint(0, 320, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
    report = lowbit.quantize_model(model, format="toyint8", progress=False)
    assert report.summary().startswith("quantized 14 linear layers to toyint8 in")
    assert all(isinstance(model.get_submodule(x.name), ToyInt8Linear) for x in report.layers)
    with torch.no_grad():
        got = model(ids).logits
    assert rel_err(got, want) < 0.05  # 8-bit rows

    lowbit.save_quantized(model, tmp_path)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert {m["type"] for m in index["modules"].values()} == {"ToyInt8Linear"}
    skeleton = build("llama", 4)
    lowbit.load_quantized(skeleton, tmp_path)
    with torch.no_grad():
        assert torch.equal(skeleton(ids).logits, got)

    with pytest.raises(ValueError, match="codebook is a kbit option"):
        lowbit.quantize_model(build("llama", 3), format="toyint8", codebook="fit")
    with pytest.raises(ValueError, match="has no fused module"):
        lowbit.quantize_model(build("llama", 3), format="toyint8", fuse=True)
    REGISTRY.pop("ToyInt8Linear")
    with pytest.raises(LoadError, match="unknown module type 'ToyInt8Linear'"):
        lowbit.load_quantized(build("llama", 4), tmp_path)


def test_generate_takes_the_new_format(capsys):
    from lowbit.hf.generate import generate, parse_formats

    assert parse_formats("kbit,toyint8") == ["kbit", "toyint8"]
    r = generate("random:tiny-llama", max_new_tokens=3, device="cpu", quiet=True, fmt="kbit,toyint8", compare=True)
    assert set(r["variants"]) == {"kbit4", "toyint8"} and r["variants"]["toyint8"]["quality"]["kl"] >= 0
