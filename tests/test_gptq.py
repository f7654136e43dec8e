"""Calibrated quantization (GPTQ): the algorithm against its unblocked form, what it buys over round to
nearest, every format's column quantizer against its dequantizer, whole models block by block (MoE
experts included), determinism, checkpoints, and the inputs it refuses."""

import json

import pytest
import torch
from torch import nn

import lowbit
from lowbit.formats import kbit, nvfp4
from lowbit.formats.kbit.columns import ColumnQuantizer as KbitColumns
from lowbit.formats.nvfp4.columns import ColumnQuantizer as NvFp4Columns
from lowbit.model.calibrate import decoder_blocks
from lowbit.model.calibration_data import calibration_ids, default_text, token_windows
from lowbit.model.gptq import HessianAccumulator, gptq, gptq_reference

from .tiny_models import build, rel_err


def _correlated(gen, n, k, rows=1024):
    """Inputs with strongly correlated features (what makes error compensation pay) and a weight."""
    mix = torch.randn(k, k, generator=gen) / k**0.5
    x = torch.randn(rows, k, generator=gen) @ mix + 0.2 * torch.randn(rows, k, generator=gen)
    return x, torch.randn(n, k, generator=gen)


def _hessian(x):
    acc = HessianAccumulator(x.shape[1], x.device)
    acc.add(x)
    return acc.hessian()


class Recording:
    """A column quantizer that keeps what it returned per column (to compare with the module's weight)."""

    def __init__(self, inner):
        self.inner, self.group, self.cols = inner, inner.group, {}

    def set_block(self, b, columns):
        self.inner.set_block(b, columns)

    def quantize(self, col, w):
        q = self.inner.quantize(col, w)
        self.cols[col] = q.clone()
        return q

    def result(self):
        return self.inner.result()


def _kbit_weight(result, n, k):
    codes, absmax, codebook, scale = result
    return (codebook[codes.long()] * (kbit.e4m4.decode(absmax) * scale)[..., None]).reshape(n, k)


@pytest.mark.parametrize("fmt, bits", [("kbit", 2), ("kbit", 3), ("kbit", 4), ("kbit", 5), ("nvfp4", 4)])
def test_blocked_gptq_matches_unblocked_reference(fmt, bits, gen):
    x, w = _correlated(gen, 48, 192)
    h = _hessian(x)
    make = (lambda: KbitColumns(w, bits)) if fmt == "kbit" else (lambda: NvFp4Columns(w))
    a, b = make(), make()
    gptq(w, h, a, block_size=64)  # 3 blocks: the lazy updates between blocks are exercised
    gptq_reference(w, h, b)
    # Same arithmetic in another order: fp32 noise may flip a code sitting on a rounding boundary, and the error
    # feedback then carries the difference along the rest of that row (seed 3243044266: 24 codes of one row, kbit4).
    # Over 551 seeds per format at most 1 row of 48 differed, in 0-1% of the cases, and the GPTQ objective
    # tr((W - Q) H (W - Q)^T) of the two agreed within 0.12%.
    rows = (a.codes != b.codes).reshape(48, -1).any(-1)
    assert int(rows.sum()) <= 2, int(rows.sum())
    if fmt == "kbit":
        wa, wb = _kbit_weight(a.result(), 48, 192), _kbit_weight(b.result(), 48, 192)
    else:
        wa, wb = a.result().dequantize(torch.float32), b.result().dequantize(torch.float32)
    assert torch.equal(wa[~rows], wb[~rows])  # rows with the same codes decode to the same weights
    loss_a, loss_b = ((((w - q) @ h) * (w - q)).sum().item() for q in (wa, wb))
    assert abs(loss_a / loss_b - 1) <= 1e-2, (loss_a, loss_b)


@pytest.mark.parametrize("fmt, bits", [("kbit", 2), ("kbit", 3), ("kbit", 4), ("nvfp4", 4)])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_output_error_below_round_to_nearest(fmt, bits, act_order, gen):
    x, w = _correlated(gen, 64, 256)
    h = _hessian(x)
    if fmt == "kbit":
        q = KbitColumns(w, bits)
        gptq(w, h, q, act_order=act_order)
        wq = _kbit_weight(q.result(), 64, 256)
        codes, absmax, cb, scale = kbit.quantize_codes(w, bits)
        wr = _kbit_weight((codes, absmax, cb, scale), 64, 256)
    else:
        q = NvFp4Columns(w)
        gptq(w, h, q, act_order=act_order)
        wq, wr = q.result().dequantize(torch.float32), nvfp4.quantize(w).dequantize(torch.float32)
    y = x @ w.t()
    e_gptq, e_rtn = rel_err(x @ wq.t(), y), rel_err(x @ wr.t(), y)
    # Measured over seeds: GPTQ removes 15-25% of RTN's output error on these inputs; demand 8%.
    assert e_gptq < 0.92 * e_rtn, (e_gptq, e_rtn)


@pytest.mark.parametrize("fmt", ["kbit", "nvfp4"])
def test_columns_return_what_the_module_decodes(fmt, gen):
    """The error GPTQ propagates is the error the kernels will see: the quantizer's returned columns
    equal the built module's dequantized weight, bit for bit."""
    x, w = _correlated(gen, 40, 128)
    rec = Recording(KbitColumns(w, 3) if fmt == "kbit" else NvFp4Columns(w))
    gptq(w, _hessian(x), rec)
    linear = nn.Linear(128, 40, bias=False)
    linear.weight.data.copy_(w)
    cls = lowbit.nn.linear_class(fmt)
    mod = cls.from_linear(linear, bits=3 if fmt == "kbit" else 4, quantized=rec.result())
    returned = torch.stack([rec.cols[c] for c in range(128)], dim=1)
    assert torch.equal(mod.dequantize(torch.float32), returned)


def test_act_order_keeps_one_scale_per_block_and_weighted_codebook(gen):
    x, w = _correlated(gen, 32, 128)
    h = _hessian(x)
    q = KbitColumns(w, 3, "fit", importance=torch.diagonal(h))
    gptq(w, h, q, act_order=True)
    codes, absmax, codebook, scale = q.result()
    # static groups: each block's scale is the one computed from the weight as given
    want = kbit.e4m4.encode(w.reshape(32, 4, 32).abs().amax(-1) / scale)
    assert torch.equal(absmax, want)
    assert codebook.numel() == 8 and bool((codebook.abs() <= 1).all()) and codebook.unique().numel() == 8
    assert not torch.equal(codebook, kbit.normal_float_codebook(3))


def test_dead_columns_are_rounded_alone(gen):
    x, w = _correlated(gen, 16, 64)
    x[:, 5] = 0  # an input feature the calibration never sees
    h = _hessian(x)
    q = KbitColumns(w, 4)
    stats = gptq(w, h, q)
    assert stats.dead == 1
    codes, absmax, cb, scale = q.result()
    assert torch.isfinite(_kbit_weight(q.result(), 16, 64)).all()


def test_non_finite_hessian_refused():
    h = torch.eye(32)
    h[3, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        gptq(torch.randn(4, 32), h, KbitColumns(torch.randn(4, 32), 4))


# ------------------------------------------------------------------------------------- data
class WordTokenizer:
    """Enough of a tokenizer: one id per character."""

    def __init__(self, vocab=128):
        self.vocab = vocab

    def __call__(self, text):
        return {"input_ids": [ord(c) % self.vocab for c in text]}


def test_calibration_ids_from_every_source():
    tok = WordTokenizer()
    ids, desc = calibration_ids(["hello world " * 50, "more text " * 50], tok, 128, samples=4, seq_len=64)
    assert ids.shape == (4, 64) and "2 given texts" in desc and "4 x 64 = 256 tokens" in desc
    ids, desc = calibration_ids(None, tok, 128, samples=3, seq_len=32)
    assert ids.shape == (3, 32) and "language reference" in desc
    given = torch.randint(0, 100, (2, 16))
    ids, _ = calibration_ids(given, None, 128)
    assert torch.equal(ids, given)
    assert token_windows(torch.arange(10), 5, 64).shape == (1, 10)  # shorter than a window: all of it


def test_default_text_is_not_the_eval_text():
    from lowbit.hf.quality import stdlib_docstrings

    cal, ev = default_text(), stdlib_docstrings()
    assert len(cal) > 200_000
    paragraphs = {p.strip() for p in ev.split("\n\n") if len(p.strip()) > 80}
    assert not any(p in cal for p in paragraphs)


@pytest.mark.parametrize("calibration, tokenizer, message", [
    ([], WordTokenizer(), "calibration texts are empty"),
    (["   "], WordTokenizer(), "calibration texts are empty"),
    (["some text"], None, "needs the model's tokenizer"),
    (None, None, "needs the model's tokenizer"),
    (torch.randint(0, 500, (2, 16)), None, r"must lie in \[0, 128\)"),
    (torch.zeros(2, 16), None, "int64/int32 tensor"),
    (torch.zeros(0, 16, dtype=torch.long), None, ">= 1 sample"),
    (3.5, None, "must be a LongTensor"),
])
def test_bad_calibration_refused(calibration, tokenizer, message):
    with pytest.raises((ValueError, TypeError), match=message):
        calibration_ids(calibration, tokenizer, 128)


# ------------------------------------------------------------------------------------- models
def _ids(gen, vocab=320, n=8, seq=48):
    return torch.randint(0, vocab, (n, seq), generator=gen)


def _seed(gen):
    return int(torch.randint(0, 2**31, (1,), generator=gen))


@pytest.mark.parametrize("fmt, bits", [("kbit", 3), ("nvfp4", 4)])
def test_gptq_model_closer_than_rtn_and_deterministic(fmt, bits, gen):
    base = build("llama", _seed(gen), hidden=128, inter=256)
    # 32 x 64 tokens: with 16 x 64 a seed was seen where NVFP4's GPTQ lost to RTN on held-out tokens
    calib, held_out = _ids(gen, n=32, seq=64), _ids(gen, n=2, seq=64)
    ref = base(held_out).logits
    models = {}
    for method in ("rtn", "gptq", "gptq"):
        m = build("llama", 0, hidden=128, inter=256)
        m.load_state_dict(base.state_dict())
        kw = dict(method="gptq", calibration=calib) if method == "gptq" else {}
        report = lowbit.quantize_model(m, format=fmt, bits=bits, progress=False, **kw)
        models.setdefault(method, []).append(m)
        if method == "gptq":
            assert report.method == "gptq" and report.calibration.blocks == 2
            assert "32 x 64 = 2048 tokens" in str(report) and "with GPTQ" in report.summary()
    e_rtn = rel_err(models["rtn"][0](held_out).logits, ref)
    e_gptq = rel_err(models["gptq"][0](held_out).logits, ref)
    assert e_gptq < e_rtn, (e_gptq, e_rtn)
    a, b = (m.state_dict() for m in models["gptq"])
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []


def test_gptq_moe_per_expert_hessians_and_fallback(gen):
    base = build("qwen3_moe", _seed(gen))
    calib = _ids(gen, n=8, seq=32)
    m = build("qwen3_moe", 0)
    m.load_state_dict(base.state_dict())
    report = lowbit.quantize_model(m, bits=4, progress=False, method="gptq", calibration=calib)
    assert any(x.kind == "experts" for x in report.layers)
    assert isinstance(m.model.layers[0].mlp.experts, lowbit.nn.KbitMoeExperts)
    # 256 tokens x top-2 over 8 experts: every expert is routed ~64 rows; ask for more to see the fallback
    m2 = build("qwen3_moe", 0)
    m2.load_state_dict(base.state_dict())
    r2 = lowbit.quantize_model(m2, bits=4, progress=False, method="gptq", calibration=calib,
                               gptq=lowbit.GptqOptions(min_expert_tokens=10**6))
    fallbacks = [f for f in r2.calibration.fallbacks if "pooled Hessian" in f[1]]
    assert len(fallbacks) == 2 and "experts [0, 1, 2, 3, 4, 5, 6, 7]" in fallbacks[0][1]
    assert "pooled Hessian" in str(r2)
    x = _ids(gen, n=1, seq=16)
    ref = base(x).logits
    assert rel_err(m(x).logits, ref) < 0.5 and torch.isfinite(m2(x).logits).all()


def test_moe_routes_each_expert_its_own_tokens(gen):
    """The per-expert Hessian is built from exactly the tokens the router sends to that expert."""
    from lowbit.model.calibrate import _ExpertHessians

    model = build("qwen3_moe", _seed(gen))
    experts = model.model.layers[0].mlp.experts
    hess = _ExpertHessians(experts)
    hidden = torch.randn(10, 128, generator=gen)
    top_k = torch.tensor([[0, 1]] * 6 + [[2, 1]] * 4)
    hess.hook(experts, (hidden, top_k, torch.ones(10, 2)), {}, None)
    assert hess.tokens.tolist()[:3] == [6, 10, 4] and int(hess.tokens[3:].sum()) == 0
    assert torch.allclose(hess.gu[2], hidden[6:].t() @ hidden[6:], rtol=1e-5, atol=1e-4)


def test_gptq_checkpoint_records_method(tmp_path, gen):
    m = build("llama", _seed(gen))
    lowbit.quantize_model(m, bits=3, progress=False, method="gptq", calibration=_ids(gen, n=4, seq=32))
    lowbit.save_quantized(m, tmp_path)
    index = json.loads((tmp_path / "lowbit_model.json").read_text())
    q = index["quantization"]
    assert q["method"] == "gptq" and q["format"] == "kbit3" and "4 x 32 = 128 tokens" in q["calibration"]
    assert q["options"]["damp"] == 0.01
    fresh = build("llama", 0)
    lowbit.load_quantized(fresh, tmp_path)
    assert fresh.lowbit_quantization["method"] == "gptq"
    x = _ids(gen, n=1, seq=8)
    assert torch.equal(fresh(x).logits, m(x).logits)


def test_gptq_bad_models_and_options(gen):
    calib = _ids(gen, n=2, seq=16)
    with pytest.raises(ValueError, match="no layers to quantize"):
        lowbit.quantize_model(nn.Sequential(nn.Embedding(10, 8)), method="gptq", calibration=calib, progress=False)
    with pytest.raises(ValueError, match="method must be 'rtn' or 'gptq'"):
        lowbit.quantize_model(build("llama", 0), method="awq", progress=False)
    with pytest.raises(ValueError, match="options of method='gptq'"):
        lowbit.quantize_model(build("llama", 0), calibration=calib, progress=False)
    with pytest.raises(ValueError, match="damp must be"):
        lowbit.quantize_model(build("llama", 0), method="gptq", calibration=calib, gptq=lowbit.GptqOptions(damp=-1))
    with pytest.raises(ValueError, match="model's vocabulary"):
        lowbit.quantize_model(build("llama", 0), method="gptq", calibration=calib + 1000, progress=False)
    m = build("llama", 0)
    with torch.no_grad():
        m.model.embed_tokens.weight[calib[0, 0]] = float("nan")
    with pytest.raises(ValueError, match="contain NaN or inf"):
        lowbit.quantize_model(m, method="gptq", calibration=calib, progress=False)


def test_decoder_blocks_found():
    model = build("llama", 0)
    name, blocks = decoder_blocks(model, [n for n, _ in model.named_modules()])
    assert name == "model.layers" and len(blocks) == 2


def test_cli_generate_gptq_saves_and_records(tmp_path):
    """`lowbit generate --method gptq --save` as a user types it (random-init model: random calibration ids)."""
    import subprocess
    import sys

    out = tmp_path / "q"
    cmd = [sys.executable, "-m", "lowbit", "generate", "--model", "random:tiny-llama", "--device", "cpu", "--bits", "3",
           "--method", "gptq", "--calibration-samples", "4", "--calibration-seq-len", "32", "--max-new-tokens", "3",
           "--save", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "to kbit3 with GPTQ" in p.stdout and "4 x 32 = 128 tokens" in p.stdout
    assert "[kbit3-fit-gptq-h32]" in p.stdout  # the 3-bit recipe: fitted codebook + rotation (gptq_recipe)
    index = json.loads((out / "lowbit_model.json").read_text())
    assert index["quantization"]["method"] == "gptq" and index["quantization"]["rotation"] == 32


def test_gptq_recipe_fills_only_what_the_caller_left_open():
    from lowbit.hf.generate import resolve_recipe, variant_label

    opts = lowbit.GptqOptions()
    assert resolve_recipe("kbit", 2, "gptq", "auto", "auto", opts) == ("fit", 32, lowbit.GptqOptions(codebook_rounds=2))
    assert resolve_recipe("kbit", 3, "gptq", "auto", "auto", opts) == ("fit", 32, opts)
    assert resolve_recipe("kbit", 4, "gptq", "auto", "auto", opts) == (None, 0, opts)
    assert resolve_recipe("kbit", 2, "rtn", "auto", "auto", None) == (None, 0, opts)
    assert resolve_recipe("nvfp4", 4, "gptq", "auto", "auto", opts) == (None, 0, opts)
    # what the caller said stays: no rotation, the default codebook, three rounds
    three = lowbit.GptqOptions(codebook_rounds=3)
    assert resolve_recipe("kbit", 2, "gptq", "fit", 0, three) == ("fit", 0, three)
    assert resolve_recipe("kbit", 2, "gptq", None, "auto", opts) == (None, 32, opts)
    assert variant_label("kbit2", "fit", "gptq", 32, lowbit.GptqOptions(codebook_rounds=2)) == "kbit2-fit-gptq-h32-r2"
    assert variant_label("kbit4", None, "rtn", 0, None) == "kbit4"
    assert lowbit.gptq_recipe("kbit", 3) == {"codebook": "fit", "rotation": 32}


def test_format_without_column_quantizer_refused(monkeypatch, gen):
    monkeypatch.setattr(lowbit.nn.KbitLinear, "column_quantizer", None)
    with pytest.raises(ValueError, match="has no column quantizer"):
        lowbit.quantize_model(build("llama", 0), method="gptq", calibration=_ids(gen, n=2, seq=16), progress=False)


def test_nvfp4_encode_matches_one_compare_per_midpoint(gen):
    """encode_e2m1 (one search, what GPTQ calls per column) against the rule written out: one compare per
    midpoint, ties at odd midpoints up to the even code."""
    mids = torch.tensor(nvfp4._MIDPOINTS)
    x = torch.cat([torch.randn(20000, generator=gen) * 3, mids, -mids, torch.tensor([0.0, -0.0, 6.0, 7.0, 1e9, -1e9])])
    a = x.abs()
    want = torch.zeros(x.shape, dtype=torch.uint8)
    for i, mid in enumerate(nvfp4._MIDPOINTS):
        want += ((a > mid) | ((a == mid) & (i % 2 == 1))).to(torch.uint8)
    want |= torch.signbit(x).to(torch.uint8) << 3
    assert torch.equal(nvfp4.encode_e2m1(x), want)


@pytest.mark.parametrize("act_order", [False, True])
def test_stacked_walk_equals_one_walk_per_expert(act_order, gen):
    """MoE experts go through GPTQ together (gptq_stack); each comes out as if walked alone."""
    from lowbit.model.gptq import gptq_stack

    xs, ws = zip(*[_correlated(gen, 24, 96, rows=384) for _ in range(3)])
    w, h = torch.stack(ws), torch.stack([_hessian(x) for x in xs])
    stacked = KbitColumns(w, 3)
    gptq_stack(w, h, stacked, block_size=64, act_order=act_order)
    for e in range(3):
        alone = KbitColumns(w[e], 3)
        gptq(w[e], h[e], alone, block_size=64, act_order=act_order)
        assert (alone.codes != stacked.codes[e]).float().mean().item() <= 2e-3
        assert torch.equal(alone.absmax, stacked.absmax[e]) and torch.equal(alone.scale, stacked.scale[e])


def test_true_sequential_and_codebook_rounds_run(gen):
    base = build("llama", _seed(gen), hidden=128, inter=256)
    # 32 x 64 tokens: with 8 x 64 a seed was seen where GPTQ over-fitted and lost to RTN on held-out tokens
    calib, held_out = _ids(gen, n=32, seq=64), _ids(gen, n=2, seq=64)
    ref = base(held_out).logits
    errs = {}
    for name, opts in (("rtn", None), ("seq", lowbit.GptqOptions(true_sequential=True, codebook_rounds=2))):
        m = build("llama", 0, hidden=128, inter=256)
        m.load_state_dict(base.state_dict())
        kw = {} if opts is None else dict(method="gptq", calibration=calib, gptq=opts)
        r = lowbit.quantize_model(m, bits=3, codebook="fit", progress=False, **kw)
        errs[name] = rel_err(m(held_out).logits, ref)
        if opts is not None:
            assert r.linears == 14 and r.calibration.blocks == 2
    assert errs["seq"] < errs["rtn"], errs


# ------------------------------------------------------------------------------------- rotation
def test_rotation_is_an_involution_and_modules_agree_on_every_path(gen):
    from lowbit import dispatch
    from lowbit.formats.kbit import rotation

    x = torch.randn(5, 96, generator=gen)
    assert torch.allclose(rotation.rotate(rotation.rotate(x)), x, atol=1e-5)
    h = rotation.hadamard()
    assert torch.allclose(h @ h.t(), torch.eye(32), atol=1e-6)
    lin = nn.Linear(96, 40)
    lin.weight.data = torch.randn(40, 96, generator=gen)
    m = lowbit.nn.KbitLinear.from_linear(lin, bits=4, rotation=32)
    y = m(x)  # CPU path: the weight decoded and rotated back
    b = m._buffers
    # what CUDA and torch.compile run: the rotation inside the op (the GEMV's kernel rotates x in
    # registers), or x rotated first (GEMM / dequantize paths) -- the same product
    for rows in (2, 9, 40):
        xr = torch.randn(rows, 96, generator=gen)
        want = m(xr)
        y_op = dispatch.kbit_tiled_linear_op(xr, b["qweight"], b["qabsmax"], b["codebook"], b["scale"], 4, 40, 96, m.bias,
                                             32)
        assert rel_err(y_op, want) < 1e-5
    xh = x.bfloat16()  # the GEMV op's own reference (its CPU / meta implementation)
    y_gemv = lowbit.ops.kbit_gemv(xh, b["qweight"], b["qabsmax"], b["codebook"], b["scale"], 4, 40, 96,
                                  m.bias.detach().bfloat16(), 32)
    assert rel_err(y_gemv.float(), m(xh).float()) < 1e-2
    assert rel_err(torch.compile(m, fullgraph=True)(x), y) < 1e-5
    with pytest.raises(ValueError, match="rotation must be one of"):
        lowbit.ops.kbit_gemv(xh, b["qweight"], b["qabsmax"], b["codebook"], b["scale"], 4, 40, 96, None, 16)
    assert rel_err(y, lin(x)) < 0.15  # kbit4 of a Gaussian weight: ~0.09
    with pytest.raises(ValueError, match="rotation must be one of"):
        lowbit.nn.KbitLinear.from_linear(lin, bits=4, rotation=16)


def test_rotation_through_quantize_model_gptq_and_checkpoints(tmp_path, gen):
    base = build("llama", _seed(gen), hidden=128, inter=256)
    calib, held_out = _ids(gen, n=8, seq=64), _ids(gen, n=2, seq=64)
    ref = base(held_out).logits
    m = build("llama", 0, hidden=128, inter=256)
    m.load_state_dict(base.state_dict())
    lowbit.quantize_model(m, bits=3, progress=False, method="gptq", calibration=calib, rotation=32)
    fused = m.model.layers[0].self_attn.lowbit_fused_q_proj_k_proj_v_proj
    assert fused.rotation == 32 and m.model.layers[0].mlp.down_proj.rotation == 32
    assert rel_err(m(held_out).logits, ref) < 0.6
    assert m.lowbit_quantization["rotation"] == 32
    lowbit.save_quantized(m, tmp_path)
    fresh = build("llama", 0, hidden=128, inter=256)
    lowbit.load_quantized(fresh, tmp_path)
    assert fresh.model.layers[0].mlp.down_proj.rotation == 32
    assert torch.equal(fresh(held_out).logits, m(held_out).logits)
    with pytest.raises(ValueError, match="rotation must be one of"):
        lowbit.quantize_model(build("llama", 0), format="nvfp4", rotation=32, progress=False)
