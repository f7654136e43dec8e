"""Every format decodes real model shapes on the GPU through ``lowbit.hf.generate``: a 2-layer
Llama-3-8B-shaped model and a 2-layer Qwen3-30B-A3B-shaped MoE model, bf16 and fp16, batch 1 and 4, eager,
CUDA graph and torch.compile. Each run is scored teacher-forced against the unquantized model (KL over the
generated tokens): finite and bounded. Random-init models are noise-sensitive (near-uniform logits): on the
H100 both kbit4 and NVFP4 measured KL ~0.13 nats here, so the bound (0.5) catches NaN, unwritten and garbage
outputs, not small precision losses (tests/gpu/test_models_gpu.py bounds those against the reference)."""

import math

import pytest
import torch

from lowbit.hf.generate import generate

pytestmark = pytest.mark.gpu

MODES = {"eager": dict(graph=False), "graph": dict(graph=None), "compile": dict(graph=None, compile=True)}
#: KL (nats) bound for a 2-layer random-init model's 6 teacher-forced tokens (H100: kbit4 and NVFP4 both ~0.13)
KL_BOUND = 0.5


def _run(model, fmt, dtype, batch, mode, bits=4):
    return generate(f"random:{model}", layers=2, fmt=fmt, bits=bits, dtype=dtype, batch=batch, max_new_tokens=6,
                    compare=True, quiet=True, **MODES[mode])


def _check(r, batch):
    q = r["quality"]
    assert math.isfinite(q["kl"]) and q["kl"] < KL_BOUND, q
    assert r["quantized"]["tokens_per_s"] > 0 and r["batch"] == batch


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("fmt", ["kbit", "nvfp4"])
def test_llama_8b_shape_decodes(fmt, dtype, batch, mode):
    if mode == "compile" and (dtype, batch) not in ((torch.bfloat16, 1), (torch.float16, 4)):
        pytest.skip("torch.compile: two of the four dtype/batch pairs (each compile takes ~30 s)")
    _check(_run("llama-3-8b", fmt, dtype, batch, mode), batch)


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("fmt", ["kbit", "nvfp4"])
def test_moe_shape_decodes(fmt, batch, mode):
    _check(_run("qwen3-30b-a3b", fmt, torch.bfloat16, batch, mode), batch)


@pytest.mark.parametrize("bits", [2, 3, 5])
def test_other_bits_decode(bits):
    r = _run("llama-3-8b", "kbit", torch.bfloat16, 1, "graph", bits=bits)
    assert math.isfinite(r["quality"]["kl"]), r["quality"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=lambda d: str(d).removeprefix("torch."))
def test_nvfp4_plain_gemv_shapes_in_any_order(dtype):
    """The failure the model showed and single calls did not: a plan with a small shared-memory need made
    after a larger one must not break the larger one's later launches (csrc/nvfp4/gemv.cu)."""
    import lowbit

    g = torch.Generator().manual_seed(0)
    shapes = [(4096, 4096), (1024, 4096), (4096, 4096), (14336, 4096), (1024, 4096), (4096, 14336), (4096, 4096)]
    for n, k in shapes:
        w = torch.randn(n, k, generator=g) * 0.02
        q = lowbit.quantize_nvfp4(w).to("cuda")
        x = torch.randn(1, k, generator=g).to(dtype)
        y = lowbit.nvfp4_linear(x.cuda(), q).float().cpu()
        ref = x.float() @ q.dequantize(torch.float32).cpu().t()
        assert torch.linalg.norm(y - ref) / torch.linalg.norm(ref) < 1e-2, (n, k)


def test_generate_says_when_this_gpu_is_untuned(capsys):
    """`lowbit generate` prints dispatch.untuned_note's line on a GPU the tuning files do not list, and only there."""
    from lowbit.dispatch import untuned_note

    generate("random:llama-3-8b", layers=1, max_new_tokens=2, graph=False)
    out, note = capsys.readouterr().out, untuned_note(torch.cuda.get_device_name())
    assert (note in out) if note else "no tuning for" not in out
