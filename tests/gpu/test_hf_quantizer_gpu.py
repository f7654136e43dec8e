"""The transformers quantizer on CUDA (lowbit.hf.quantizer): from_pretrained(device_map="cuda",
quantization_config=LowbitConfig(...)) quantizes each layer on the GPU as it loads and gives the model
quantize_model makes on the GPU from the same weights (bit-identical logits through the kernels), and a
save_pretrained directory loads back to the same logits."""

import pytest
import torch

import lowbit

from ..tiny_models import build

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("fmt", ["kbit", "nvfp4"])
@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
def test_from_pretrained_on_cuda_is_quantize_model(name, fmt, tmp_path, gen):
    from lowbit.hf import LowbitConfig

    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    build(name, seed).save_pretrained(tmp_path / "dense")
    kw = dict(dtype=torch.bfloat16, device_map="cuda")
    q = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", quantization_config=LowbitConfig(format=fmt), **kw)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", **kw)
    lowbit.quantize_model(ref, format=fmt, progress=False)
    assert all(t.is_cuda for t in q.state_dict().values())
    ids = torch.randint(0, 300, (2, 7), generator=gen).cuda()
    with torch.no_grad():
        got, want = q(ids).logits, ref(ids).logits
    assert torch.isfinite(got).all() and torch.equal(got, want)
    q.save_pretrained(tmp_path / "q")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q", **kw)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, want)
