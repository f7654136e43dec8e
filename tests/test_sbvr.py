"""SBVR's reference (lowbit/formats/sbvr): bit packing, the encoder's contract (every element one of its
group's subset sums), the two reference products, the module and its checkpoints, bad input.

Error bounds: on Gaussian weights, SBVR with num_sums = 4 (4.25 bits with a 128-group index and its cache)
has a relative weight error <= 0.13 (measured ~0.107; kbit4: 0.087), num_sums = 3 <= 0.24, 5 <= 0.075;
7-bit bit-plane activations move a Gaussian product by <= 2% (measured ~1.2%)."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit.formats import sbvr
from lowbit.model.checkpoint import INDEX_FILE, LoadError

from .tiny_models import build, rel_err


@settings(max_examples=40, deadline=None)
@given(num_sums=st.integers(2, 6), rows=st.integers(1, 5), words=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_pack_unpack_round_trip(num_sums, rows, words, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << num_sums, (rows, 32 * words), generator=g, dtype=torch.int64).to(torch.uint8)
    packed = sbvr.pack_bits(codes, num_sums)
    assert packed.dtype == torch.int32 and packed.shape == (rows, words, num_sums)
    assert torch.equal(sbvr.unpack_bits(packed), codes)
    # bit j of element 32w + i sits in bit i of word (w, j): check one element by hand
    r, e = rows - 1, 32 * words - 1
    word = int(packed[r, e // 32, num_sums - 1]) & 0xFFFFFFFF
    assert (word >> (e % 32)) & 1 == (int(codes[r, e]) >> (num_sums - 1)) & 1


@pytest.mark.parametrize("num_sums, bound", [(3, 0.24), (4, 0.13), (5, 0.075)])
def test_encode_error_and_every_element_a_subset_sum(num_sums, bound, gen):
    w = torch.randn(96, 512, generator=gen) * 0.02
    q = lowbit.quantize_sbvr(w, num_sums=num_sums)
    d = q.dequantize()
    assert rel_err(d, w) <= bound
    # each element is exactly one of its group's 2^num_sums points
    pts = sbvr.points(q.cache)[q.coeff_idx.to(torch.int64) & 0xFFFF]          # [N, G, P]
    groups = d.reshape(96, -1, 128)
    assert bool((groups[..., None] == pts[:, :, None, :]).any(-1).all())
    assert q.cache.shape[0] <= 96 * 4 and 0 < q.bits_per_weight() - num_sums < 0.5


def test_every_subset_sum_decodes(gen):
    """Codes 0..2^num_sums - 1 in a group decode to exactly the subset sums of its coefficients."""
    num_sums = 4
    cache = (torch.randn(3, num_sums, generator=gen) * 0.1).half()
    codes = torch.arange(16, dtype=torch.uint8).repeat(2, 8)  # [2, 128]
    idx = torch.tensor([[2], [1]], dtype=torch.int16)
    w = sbvr.decode(sbvr.pack_bits(codes, num_sums), idx, cache, 128)
    c = cache.float()
    for row, line in ((0, 2), (1, 1)):
        want = torch.stack([sum((c[line, j] for j in range(num_sums) if k >> j & 1), torch.zeros(())) for k in range(16)])
        assert torch.equal(w[row, :16], want.float())


def test_products_exact_and_bitplane(gen):
    w = torch.randn(40, 256, generator=gen)
    q = lowbit.quantize_sbvr(w)
    x = torch.randn(3, 256, generator=gen)
    exact = lowbit.sbvr_linear(x, q)
    assert torch.allclose(exact, x @ q.dequantize().t(), rtol=1e-5, atol=1e-5)
    bp = sbvr.linear_bitplane_reference(x, *q.tensors(), q.group)
    qx, s, m = sbvr.encode_activations(x)
    x_hat = (qx.reshape(3, 2, 128).float() * s[..., None] + m[..., None]).reshape(3, 256)
    assert rel_err(bp, x_hat @ q.dequantize().t()) < 1e-5   # the popcount form is the RTN-activation product
    assert rel_err(bp, exact) < 0.02                        # what 7-bit activations cost
    assert rel_err(sbvr.linear_bitplane_reference(x, *q.tensors(), q.group, act_bits=4), exact) > rel_err(bp, exact)


def test_bad_input_refused(gen):
    w = torch.randn(8, 256, generator=gen)
    with pytest.raises(ValueError, match="num_sums must be one of"):
        lowbit.quantize_sbvr(w, num_sums=7)
    with pytest.raises(ValueError, match="group must be a power of two >= 32"):
        lowbit.quantize_sbvr(w, group=48)
    with pytest.raises(ValueError, match="group must be a power of two >= 32"):
        lowbit.quantize_sbvr(w, group=96)
    with pytest.raises(ValueError, match="K a multiple of group=128"):
        lowbit.quantize_sbvr(torch.randn(8, 96))
    bad = w.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        lowbit.quantize_sbvr(bad)
    q = lowbit.quantize_sbvr(w)
    with pytest.raises(ValueError, match="points past the cache"):
        lowbit.SbvrWeight(q.bitvectors, torch.full_like(q.coeff_idx, q.cache.shape[0]), q.cache)
    nan_cache = q.cache.clone()
    nan_cache[0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf coefficients"):
        lowbit.SbvrWeight(q.bitvectors, q.coeff_idx, nan_cache)
    with pytest.raises(ValueError, match="not a multiple of group"):
        lowbit.SbvrWeight(q.bitvectors[:, :3], q.coeff_idx, q.cache)
    with pytest.raises(TypeError, match="coeff_idx must have dtype int16"):
        lowbit.SbvrWeight(q.bitvectors, q.coeff_idx.int(), q.cache)
    with pytest.raises(ValueError, match=r"x must have shape \[..., K=256\]"):
        lowbit.sbvr_linear(torch.randn(2, 128), q)


def test_quantize_model_save_load_and_tamper(tmp_path, gen):
    model = build("llama", int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    ref = build("llama", 0)
    ref.load_state_dict(model.state_dict())
    report = lowbit.quantize_model(model, format="sbvr", bits=4, progress=False)
    assert report.label == "sbvr4" and isinstance(model.model.layers[0].mlp.down_proj, lowbit.nn.SbvrLinear)
    x = torch.randint(0, 320, (2, 12), generator=gen)
    with torch.no_grad():
        got, want = model(x).logits, ref(x).logits
    assert rel_err(got, want) < 0.25
    lowbit.save_quantized(model, tmp_path)
    fresh = build("llama", 1)
    lowbit.load_quantized(fresh, tmp_path)
    with torch.no_grad():
        assert torch.equal(fresh(x).logits, got)
    # a coefficient index past the cache on disk (checksum updated to match): refused by the value check
    import zlib

    from safetensors.torch import load_file, save_file

    index = json.loads((tmp_path / INDEX_FILE).read_text())
    key = "model.layers.0.mlp.down_proj.coeff_idx"
    shard = tmp_path / index["tensors"][key]["file"]
    tensors = load_file(shard)
    bad = torch.full_like(tensors[key], 30000)
    tensors[key] = bad
    save_file(tensors, shard, metadata={"format": "lowbit", "format_version": "2"})
    index["tensors"][key]["crc32"] = zlib.crc32(bad.numpy().tobytes())
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(LoadError, match="points past the cache"):
        lowbit.load_quantized(build("llama", 2), tmp_path)


def test_cli_generate_format_sbvr():
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "lowbit", "generate", "--model", "random:tiny-llama", "--device", "cpu", "--format", "sbvr",
           "--max-new-tokens", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "to sbvr4" in p.stdout
    bad = subprocess.run(cmd + ["--codebook", "fit"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "codebook is a kbit option" in bad.stderr, bad.stderr


def test_gptq_column_quantizer_matches_decoder_and_beats_rtn(gen):
    """SBVR through the calibration engine: the values GPTQ compensates against are what the stored weight
    decodes to, and on correlated inputs the output error is below round-to-nearest's."""
    from lowbit.formats.sbvr.columns import ColumnQuantizer
    from lowbit.model import gptq

    n, k = 48, 256
    w = torch.randn(n, k, generator=gen)
    mix = torch.randn(k, k, generator=gen) / k**0.5 + torch.eye(k)
    x = torch.randn(2048, k, generator=gen) @ mix
    h = 2 * x.t() @ x / x.shape[0]
    q = ColumnQuantizer(w, bits=3, importance=torch.diagonal(h))
    gptq.gptq(w.clone(), h, q, act_order=True)
    res = q.result()
    # every column value the walk compensated against is the stored weight's decoded value
    pts = sbvr.points(res.cache)[res.coeff_idx.to(torch.int64) & 0xFFFF]
    assert bool((res.dequantize().reshape(n, -1, 128)[..., None] == pts[:, :, None, :]).any(-1).all())
    rtn = lowbit.quantize_sbvr(w, num_sums=3)
    err = lambda wq: ((x @ (wq - w).t()).norm() / (x @ w.t()).norm()).item()  # noqa: E731
    assert err(res.dequantize()) < err(rtn.dequantize())


def test_module_under_torch_compile(gen):
    """The module's forward traces in one graph (torch.compile fullgraph) and gives the eager result."""
    lin = torch.nn.Linear(256, 64)
    mod = lowbit.nn.SbvrLinear.from_linear(lin, bits=3)
    x = torch.randn(2, 256, generator=gen)
    assert torch.equal(torch.compile(mod, fullgraph=True)(x), mod(x))


def test_rotated_sbvr_module(tmp_path, gen):
    """rotation=32: the module stores W H and rotates x; its forward is x @ dequantize()^T (W in x's space),
    and a checkpoint keeps the rotation."""
    lin = torch.nn.Linear(256, 40, bias=False)
    lin.weight.data = torch.randn(40, 256, generator=gen)
    mod = lowbit.nn.SbvrLinear.from_linear(lin, bits=4, rotation=32)
    x = torch.randn(9, 256, generator=gen)  # > 8 rows: weight-only
    assert rel_err(mod(x), x @ mod.dequantize().t()) < 1e-5
    # <= SBVR_POPCOUNT_MAX_M rows: the popcount product, x H rounded to 8 bits per group, times the stored W H
    m = lowbit.dispatch.SBVR_POPCOUNT_MAX_M
    xh = sbvr.rtn_activations(lowbit.formats.kbit.rotation.rotate(x[:m]), 8, 128)
    assert rel_err(mod(x[:m]), xh @ mod.sbvr_weight().dequantize().t()) < 1e-5
    assert rel_err(mod.dequantize(), lin.weight.detach()) < 0.13
    assert mod.checkpoint_config()["rotation"] == 32
    with pytest.raises(ValueError, match="rotation must be one of"):
        lowbit.nn.SbvrLinear.from_linear(lin, bits=4, rotation=16)


# ---------------------------------------------------------------- the kernels' layout and ops (CPU references)
@settings(max_examples=30, deadline=None)
@given(num_sums=st.integers(2, 6), n=st.integers(1, 40), words=st.integers(1, 9), group_words=st.sampled_from([1, 2, 4, 8]),
       lines=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
def test_tile_untile_round_trip(num_sums, n, words, group_words, lines, seed):
    """Any N (odd, < 16), any K (partial 128-chunks), any group: tile then untile gives the tensors back, and
    the padding of the tiled layout is zero bits (it adds nothing to a product)."""
    from lowbit.formats.sbvr import tiled

    words = -(-words // group_words) * group_words
    g = torch.Generator().manual_seed(seed)
    bv = torch.randint(-2**31, 2**31, (n, words, num_sums), generator=g, dtype=torch.int64).to(torch.int32)
    idx = torch.randint(0, lines, (n, words // group_words), generator=g).to(torch.int16)
    cache = torch.randn(lines, num_sums, generator=g).to(torch.float16)
    qbits, qidx, cache8 = tiled.tile(bv, idx, cache)
    back = tiled.untile(qbits, qidx, cache8, n, 32 * words)
    assert all(torch.equal(a, b) for a, b in zip(back, (bv, idx, cache)))
    total_bits = sum(bin(int(v) & 0xFFFFFFFF).count("1") for v in qbits.flatten().tolist())
    assert total_bits == sum(bin(int(v) & 0xFFFFFFFF).count("1") for v in bv.flatten().tolist())
    if num_sums <= tiled.CODE_MAX_NUM_SUMS:  # the lookup GEMV's 4-bit codes
        assert torch.equal(tiled.code_untile(tiled.code_tile(bv), n, 32 * words), sbvr.unpack_bits(bv))
    else:
        with pytest.raises(ValueError, match="num_sums <= 4"):
            tiled.code_tile(bv)


@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_popcount_op_reference_is_the_bitplane_product(group, gen):
    """The op's reference (RTN activations x decoded weight) equals the product written with popcounts."""
    n, k = 45, 512
    q = lowbit.quantize_sbvr(torch.randn(n, k, generator=gen), num_sums=3, group=group)
    t = q.tiled()
    x = torch.randn(5, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    want = sbvr.linear_bitplane_reference(x, *q.tensors(), group, act_bits=8) + bias
    assert rel_err(lowbit.ops.sbvr_gemv(x, *t, n, k, group, bias), want) < 1e-5
    assert torch.equal(lowbit.ops.sbvr_tiled_dequantize(*t, n, k, group, torch.bfloat16), q.dequantize(torch.bfloat16))
    # the facade: weight-only by default; act_bits=8: the popcount product where the rule picks it
    assert rel_err(lowbit.sbvr_linear(x, q), x @ q.dequantize().t()) < 1e-5
    rounded = lowbit.dispatch.sbvr_path(x, 3, group, 8) == "popcount"
    assert rounded == (group < 128)  # 5 rows: the lookup GEMV's weight-only product where it takes the weight
    assert rel_err(lowbit.sbvr_linear(x, q, act_bits=8), want - bias if rounded else x @ q.dequantize().t()) < 1e-5
    assert rel_err(lowbit.sbvr_linear(x[:1], q, act_bits=8), (want - bias)[:1]) < 1e-5


def test_popcount_op_bad_input(gen):
    q = lowbit.quantize_sbvr(torch.randn(20, 256, generator=gen), num_sums=4)
    qbits, qidx, cache8 = q.tiled()
    x = torch.randn(2, 256, generator=gen)
    with pytest.raises(ValueError, match="M = 1..8"):
        lowbit.ops.sbvr_gemv(torch.randn(9, 256), qbits, qidx, cache8, 20, 256, 128)
    with pytest.raises(ValueError, match=r"x must have shape \[M, K=256\]"):
        lowbit.ops.sbvr_gemv(torch.randn(2, 128), qbits, qidx, cache8, 20, 256, 128)
    with pytest.raises(ValueError, match="qbits must be"):
        lowbit.ops.sbvr_gemv(x, qbits[:, :1].contiguous(), qidx, cache8, 20, 256, 128)
    with pytest.raises(ValueError, match="qidx must be"):
        lowbit.ops.sbvr_gemv(x, qbits, qidx, cache8, 20, 256, 64)
    with pytest.raises(ValueError, match="not a multiple of group"):
        lowbit.ops.sbvr_gemv(x, qbits, qidx, cache8, 20, 256, 512)
    with pytest.raises(TypeError, match="cache8"):
        lowbit.ops.sbvr_gemv(x, qbits, qidx, cache8.float(), 20, 256, 128)
    with pytest.raises(ValueError, match="act_bits must be"):
        lowbit.sbvr_linear(x, q, act_bits=7)
    with pytest.raises(ValueError, match="act_bits must be"):
        lowbit.nn.SbvrLinear(256, 20, act_bits=4)


def test_module_act_bits_paths_and_checkpoint(tmp_path, gen):
    """M <= SBVR_POPCOUNT_MAX_M rows: the popcount product (x rounded to 8 bits); more rows or act_bits=None:
    weight-only, on CPU as on the GPU; a checkpoint keeps act_bits."""
    m = build("llama", int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    lowbit.quantize_model(m, format="sbvr", bits=4, progress=False)
    for mod in (m.model.layers[0].mlp.down_proj, m.model.layers[0].mlp.up_proj):
        assert mod.act_bits == 8
        w = mod.sbvr_weight()
        for rows in (1, lowbit.dispatch.SBVR_POPCOUNT_MAX_M, lowbit.dispatch.SBVR_POPCOUNT_MAX_M + 1, 8, 9):
            x = torch.randn(rows, mod.in_features, generator=gen)
            rounded = rows <= 8 and (rows <= lowbit.dispatch.SBVR_POPCOUNT_MAX_M or not sbvr.tiled.codes_fit(4, mod.group))
            assert (lowbit.dispatch.sbvr_path(x, 4, mod.group, 8) == "popcount") == rounded
            xin = sbvr.rtn_activations(x, 8, sbvr.act_group(mod.group)) if rounded else x
            assert rel_err(mod(x), xin @ w.dequantize().t()) < 1e-5
    mod = m.model.layers[0].mlp.down_proj
    mod.act_bits = None
    x = torch.randn(1, mod.in_features, generator=gen)
    assert rel_err(mod(x), x @ mod.sbvr_weight().dequantize().t()) < 1e-5
    lowbit.save_quantized(m, tmp_path / "ck")
    m2 = lowbit.load_quantized(build("llama", 0), tmp_path / "ck")
    assert m2.model.layers[0].mlp.down_proj.act_bits is None and m2.model.layers[0].mlp.up_proj.act_bits == 8


@pytest.mark.parametrize("num_sums", [2, 4])
def test_lookup_op_reference_is_the_weight_only_product(num_sums, gen):
    n, k = 37, 384
    q = lowbit.quantize_sbvr(torch.randn(n, k, generator=gen), num_sums=num_sums)
    qbits, qcodes, qidx, cache8 = q.layouts()
    x = torch.randn(6, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    y = lowbit.ops.sbvr_lookup_gemv(x, qcodes, qidx, cache8, n, k, 128, bias)
    assert rel_err(y, x @ q.dequantize().t() + bias) < 1e-6
    with pytest.raises(ValueError, match="multiples of 128"):
        g64 = lowbit.quantize_sbvr(torch.randn(n, k, generator=gen), num_sums=num_sums, group=64)
        lowbit.ops.sbvr_lookup_gemv(x, qcodes, g64.tiled()[1], cache8, n, k, 64)
    with pytest.raises(ValueError, match="qcodes must be"):
        lowbit.ops.sbvr_lookup_gemv(x, qcodes[:, :1].contiguous(), qidx, cache8, n, k, 128)
    assert lowbit.quantize_sbvr(torch.randn(n, k, generator=gen), num_sums=5).codes() is None


def test_grouped_experts_reference_and_bad_input(gen):
    """The grouped product (MoE rows sorted by expert): the popcount product per expert (x rounded to 8 bits),
    weight-only with act_bits=None; empty experts; experts with their own caches; bad input."""
    ex = lowbit.quantize_sbvr_experts(torch.randn(5, 40, 384, generator=gen), num_sums=3)
    assert ex.shape == (5, 40, 384) and ex.cache_offsets.shape == (6,)
    x = torch.randn(9, 384, generator=gen)
    off = torch.tensor([0, 3, 3, 4, 9, 9])
    spans = list(zip(off[:-1].tolist(), off[1:].tolist()))
    want = torch.cat([sbvr.linear_bitplane_reference(x[a:b], *ex.expert(e).tensors(), 128, act_bits=8)
                      for e, (a, b) in enumerate(spans)])
    assert rel_err(lowbit.sbvr_grouped_linear(x, off, ex), want) < 1e-5
    exact = torch.cat([x[a:b] @ ex.expert(e).dequantize().t() for e, (a, b) in enumerate(spans)])
    assert rel_err(lowbit.sbvr_grouped_linear(x, off, ex, act_bits=None), exact) < 1e-5
    with pytest.raises(ValueError, match="expert_offsets must rise"):
        lowbit.sbvr_grouped_linear(x, torch.tensor([0, 3, 2, 4, 9, 9]), ex)
    with pytest.raises(TypeError, match="SbvrExperts"):
        lowbit.sbvr_grouped_linear(x, off, ex.expert(0))
    with pytest.raises(ValueError, match="cache_offsets must rise"):
        sbvr.SbvrExperts(ex.bitvectors, ex.coeff_idx, ex.cache, ex.cache_offsets.flip(0))
    with pytest.raises(ValueError, match="coeff_idx points past the cache"):
        bad = ex.cache_offsets.clone()
        bad[1] = 1
        sbvr.SbvrExperts(ex.bitvectors, ex.coeff_idx, ex.cache, bad)


@pytest.mark.parametrize("model", ["qwen3_moe", "mixtral"])
def test_moe_expert_blocks_in_sbvr(model, tmp_path, gen):
    """quantize_model(format="sbvr") replaces fused expert blocks (SbvrMoeExperts): weight-only (act_bits=None)
    it equals the original block with the decoded weights; act_bits=8 (decode) differs by the activation
    rounding only; a checkpoint round trip is bit-exact; method="gptq" rounds the expert blocks to nearest."""
    from lowbit.nn.sbvr import SbvrMoeExperts

    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    m, orig = build(model, seed), build(model, seed)
    report = lowbit.quantize_model(m, format="sbvr", bits=4, progress=False)
    names = [lay.name for lay in report.layers if lay.kind == "experts"]
    assert names
    ids = torch.randint(0, 300, (2, 9), generator=gen)
    for name in names:
        ex = m.get_submodule(name)
        assert isinstance(ex, SbvrMoeExperts)
        blk = orig.get_submodule(name)
        gu, dn = ex.dequantize()
        blk.gate_up_proj.data, blk.down_proj.data = gu, dn
    with torch.no_grad():
        rounded = m(ids).logits
        for name in names:
            m.get_submodule(name).act_bits = None
        exact, want = m(ids).logits, orig(ids).logits
    # the linears are SBVR in m and float in orig: compare the experts alone through one block
    blk, ex = orig.get_submodule(names[0]), m.get_submodule(names[0])
    h = torch.randn(5, ex.hidden_dim, generator=gen)
    top = torch.stack([torch.randperm(ex.num_experts, generator=gen)[:2] for _ in range(5)])
    w = torch.rand(5, 2, generator=gen)
    assert rel_err(ex(h, top, w), blk(h, top, w)) < 1e-5
    assert torch.isfinite(rounded).all() and rel_err(rounded, exact) < 0.05 and want.shape == exact.shape
    lowbit.save_quantized(m, tmp_path / "ck")
    m2 = lowbit.load_quantized(build(model, seed), tmp_path / "ck")
    with torch.no_grad():
        assert torch.equal(m2(ids).logits, exact)  # act_bits=None was saved with the experts
    g = build(model, seed)
    report = lowbit.quantize_model(g, format="sbvr", bits=4, method="gptq", calibration=torch.randint(0, 300, (2, 16), generator=gen),
                                   progress=False)
    assert all(isinstance(g.get_submodule(n), SbvrMoeExperts) for n in names)
