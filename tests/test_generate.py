"""lowbit generate on CPU with a random-init model (no downloads): the decode loop, compare, the CLI."""

import pytest
import torch

pytest.importorskip("transformers")

import lowbit  # noqa: E402
from lowbit.cli import make_parser  # noqa: E402
from lowbit.hf import decode, quality, sources  # noqa: E402


def test_static_decode_equals_transformers_generate():
    torch.manual_seed(0)  # a fixed model too: an unseeded one hit a kbit3 near-tie in ~1 of 6 runs
    model, tok, _ = sources.load("random:tiny-llama", dtype=torch.float32, device="cpu")
    # fixed ids: a random tiny model has near-tied logits for ~3% of random prompts (and may emit its
    # EOS, after which generate pads), where two correct fp32 implementations can pick different tokens
    ids = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(0))
    r = decode.greedy_decode(model, ids, 9, graph=False)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=9, do_sample=False, pad_token_id=0)[:, 6:]
    assert torch.equal(r.tokens, want) and r.mode == "eager" and r.tokens_per_s() > 0
    lowbit.quantize_model(model, bits=3, progress=False)
    r = decode.greedy_decode(model, ids, 9, graph=False)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=9, do_sample=False, pad_token_id=0)[:, 6:]
    assert torch.equal(r.tokens, want)


def test_compiled_decode_step_equals_eager():
    """compile=True compiles the forward, the argmax and the token/position feedback as one graph; it must pick
    the eager step's tokens (a kbit3 model on the CPU: the op references under inductor)."""
    torch.manual_seed(0)
    model, _, _ = sources.load("random:tiny-llama", dtype=torch.float32, device="cpu")
    lowbit.quantize_model(model, bits=3, progress=False)
    ids = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(0))
    eager = decode.greedy_decode(model, ids, 6, graph=False)
    compiled = decode.greedy_decode(model, ids, 6, graph=False, compile=True)
    assert compiled.mode == "eager+compile" and torch.equal(compiled.tokens, eager.tokens)


@pytest.mark.parametrize("vocab", [700, 1025, 128256, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_two_stage_argmax_is_argmax(vocab, dtype, gen):
    """argmax_rows picks torch's index: the first maximum, ties across and inside chunks, NaN as the maximum,
    rows of -inf, vocabularies that are not a multiple of the chunk."""
    x = torch.randn(6, vocab, generator=gen).to(dtype)
    top = x[1].max()
    x[1, 3], x[1, vocab - 2] = top, top                 # a tie across chunks
    x[2, 600], x[2, 601] = x[2].max(), x[2].max()       # a tie inside one chunk
    x[3, vocab // 2], x[3, vocab - 1] = float("nan"), float("nan")
    x[4] = float("-inf")
    x[5, vocab - 1] = x[5].max() + 1                    # the max in the padded last chunk
    assert torch.equal(decode.argmax_rows(x), x.argmax(-1))


def test_decode_rejects_bad_args():
    model, _, _ = sources.load("random:tiny-llama", dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode.greedy_decode(model, torch.zeros(1, 3, dtype=torch.long), 0, graph=False)
    with pytest.raises(ValueError, match="GPU"):
        decode.greedy_decode(model, torch.zeros(1, 3, dtype=torch.long), 2, graph=True)
    with pytest.raises(ValueError, match="unknown random model"):
        sources.load("random:nope", dtype=torch.float32, device="cpu")


def test_generate_compare_reports_speed_and_quality(tmp_path):
    from lowbit.hf.generate import generate

    r = generate("random:tiny-llama", bits=4, max_new_tokens=6, batch=2, compare=True, device="cpu", quiet=True,
                 save=str(tmp_path / "q"))
    assert r["quantized"]["tokens_per_s"] > 0 and r["unquantized"]["tokens_per_s"] > 0
    q = r["quality"]
    assert q["tokens"] == 6 and 0 <= q["top1"] <= 1 and q["kl"] >= 0 and q["ppl"] > 0
    again = generate("random:tiny-llama", max_new_tokens=6, device="cpu", quiet=True, load=str(tmp_path / "q"))
    assert again["quantized"]["text"] == r["quantized"]["text"]  # the saved model decodes the same


def test_quality_compare_identity():
    logits = torch.randn(20, 50)
    t = torch.randint(0, 50, (20,))
    m = quality.compare(logits, logits, t)
    assert m["kl"] == pytest.approx(0, abs=1e-6) and m["top1"] == 1 and m["ppl"] == m["ppl_ref"]
    assert len(quality.stdlib_docstrings(5000)) == 5000


def test_cli_parses_generate():
    args = make_parser().parse_args(["generate", "--bits", "3", "--compare", "--codebook", "fit", "--batch", "2"])
    assert args.bits == 3 and args.compare and args.codebook == "fit" and args.batch == 2
    with pytest.raises(SystemExit):
        make_parser().parse_args(["generate", "--bits", "7"])


def test_baselines_quantize_to_their_levels(gen):
    from lowbit.bench.baselines import BASELINES, NF4_LEVELS, int4_rtn, nf4

    w = torch.randn(16, 256, generator=gen)
    q = nf4(w, 64).reshape(16, 4, 64)
    absmax = w.reshape(16, 4, 64).abs().amax(-1, keepdim=True)
    assert torch.allclose(q / absmax, (q / absmax).clone().apply_(lambda v: min(NF4_LEVELS, key=lambda c: abs(c - v))))
    for g in (32, 128):
        q = int4_rtn(w, g).reshape(16, -1, g)
        assert all(t.unique().numel() <= 16 for t in q.reshape(-1, g))
    for name, (fn, bpw) in BASELINES.items():
        err = float((fn(w) - w).norm() / w.norm())
        assert 0 < err < 0.15 and 4 < bpw <= 5, name
    w2 = torch.randn(4, 576, generator=gen)  # ragged last group: 576 = 4.5 x 128
    q2 = int4_rtn(w2, 128)
    assert q2.shape == w2.shape and torch.isfinite(q2).all() and float((q2 - w2).norm() / w2.norm()) < 0.15
    assert torch.equal(int4_rtn(w2, 128)[:, :512], int4_rtn(w2[:, :512], 128))


def test_gqa_sdpa_switch_on_cpu_keeps_logits():
    """On CPU the function hands every call to transformers' SDPA: the switch changes nothing."""
    from lowbit.hf import attention

    from .tiny_models import build

    model = build("llama", 3)
    ids = torch.randint(0, 320, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # padding: the function must get transformers' SDPA mask, not None
    with torch.no_grad():
        want, want_pad = model(ids).logits, model(ids, attention_mask=mask).logits
        assert attention.use_gqa_sdpa(model)
        assert torch.equal(model(ids).logits, want)
        assert torch.equal(model(ids, attention_mask=mask).logits, want_pad)
        assert not attention.use_gqa_sdpa(model)  # already switched


def test_generate_nvfp4_on_cpu():
    from lowbit.hf.generate import generate

    r = generate("random:tiny-llama", max_new_tokens=4, compare=True, device="cpu", quiet=True, fmt="nvfp4")
    assert r["quantized"]["tokens_per_s"] > 0 and r["quality"]["tokens"] == 4 and r["quality"]["kl"] >= 0
    with pytest.raises(ValueError, match="kbit options"):
        generate("random:tiny-llama", max_new_tokens=2, device="cpu", quiet=True, fmt="nvfp4", lm_head_bits=3)
    assert make_parser().parse_args(["generate", "--format", "nvfp4"]).fmt == "nvfp4"


def test_cli_generate_nvfp4_quantizes_moe_expert_blocks():
    """`lowbit generate --format nvfp4` on a MoE model, as a user types it: the expert blocks are quantized too."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "lowbit", "generate", "--model", "random:tiny-qwen3-moe", "--format",
                           "nvfp4", "--device", "cpu", "--max-new-tokens", "2"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "quantized 8 linear layers and 2 MoE expert blocks to NVFP4" in proc.stdout, proc.stdout


def test_generate_formats_side_by_side_on_cpu(capsys):
    """--format kbit,nvfp4: each format quantizes its own copy; one table with a row and a quality per format."""
    from lowbit.hf.generate import generate

    r = generate("random:tiny-llama", max_new_tokens=4, compare=True, device="cpu", fmt="kbit,nvfp4")
    assert list(r["variants"]) == ["kbit4", "nvfp4"]
    assert [v["format"] for v in r["variants"].values()] == ["kbit", "nvfp4"]
    for v in r["variants"].values():
        assert v["tokens_per_s"] > 0 and v["quality"]["tokens"] == 4 and v["quality"]["kl"] >= 0
    assert r["quality"] == r["variants"]["kbit4"]["quality"]
    out = capsys.readouterr().out
    assert "[kbit4]" in out and "[nvfp4]" in out and "nvfp4" in out.split("[nvfp4]")[1]
    # random weights: the quality numbers are returned but not shown as a verdict
    assert "quality not scored: random-init weights" in out and "top-1 agreement" not in out


def test_generate_warns_before_the_text_at_3_bits(capsys):
    from lowbit.hf.generate import generate

    generate("random:tiny-llama", bits=3, max_new_tokens=2, device="cpu")
    out = capsys.readouterr().out
    assert "WARNING: round-to-nearest at this many bits breaks models" in out
    assert out.index("WARNING") < out.index("[kbit3]")


def test_generate_nvfp4_saves_and_loads(tmp_path):
    from lowbit.hf.generate import generate

    r = generate("random:tiny-llama", max_new_tokens=4, device="cpu", quiet=True, fmt="nvfp4", save=str(tmp_path / "q"))
    again = generate("random:tiny-llama", max_new_tokens=4, device="cpu", quiet=True, load=str(tmp_path / "q"))
    assert list(again["variants"]) == [f"loaded from {tmp_path / 'q'}"]
    assert again["quantized"]["text"] == r["quantized"]["text"]


def test_random_model_built_layer_by_layer():
    """A random model is built on the meta device and its decoder layers get weights one at a time, each
    handed to the callback (lowbit generate quantizes it there) before the next: no layer is ever dense
    beside the others, and the result runs."""
    seen = []

    def each(block):
        assert not any(p.is_meta for p in block.parameters())
        seen.append(block)
        lowbit.quantize_model(block, progress=False)

    model, _, _ = sources.load("random:tiny-llama", dtype=torch.float32, device="cpu", each_layer=each)
    assert seen == list(model.model.layers)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert isinstance(model.model.layers[1].mlp.down_proj, lowbit.nn.KbitLinear)
    rot = model.model.rotary_emb.inv_freq
    assert torch.isfinite(rot).all() and rot[0] == 1.0  # transformers' init recomputed the rotary buffer
    with torch.no_grad():
        y = model(torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name,category", [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all-reduce / all-gather (tensor parallel)"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 16, 2>(...)",
     "all-reduce / all-gather (tensor parallel)"),
    ("kbit_gemv_streamk<4, 1>", "kbit GEMV (lowbit)"),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "other (norms, rope, activations, routing, argmax)"),
])
def test_decode_breakdown_names_the_collectives(name, category):
    from lowbit.hf.decode import kernel_category

    assert kernel_category(name) == category
