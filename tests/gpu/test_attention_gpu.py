"""lowbit's decode attention kernels (csrc/attention/decode.cu on CUDA cores, decode_mma.cu on tensor cores) against
the fp64 softmax; the tests marked with the ``kernel`` fixture run once per kernel.

Bound: relative norm error vs fp64 <= 2e-3 (fp16) / 1e-2 (bf16): q, K, V are exact inputs, scores,
softmax and the weighted sum are fp32 (exp2 of the fast path; the tensor-core kernel rounds the softmax weights to
the dtype before the weighted sum, ~2e-4 / ~1.6e-3 rms), the output is rounded once (~2.4e-4 / ~2e-3 rms). NaN never
passes except where the reference is NaN (no visible position).
"""

import pytest
import torch

import lowbit

from .kbit_check import capture

pytestmark = pytest.mark.gpu
BOUND = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.fixture(params=["simt", "mma"])
def kernel(request, monkeypatch):
    """Each decode attention kernel forced in turn (lowbit.kernels.attention.KERNEL)."""
    from lowbit.kernels import attention as kattn

    monkeypatch.setattr(kattn, "KERNEL", request.param)
    return request.param


def _kernel_shapes(shapes):
    """(kernel, head dim, group) for each kernel and each shape it has an instance for (the ``kernel`` fixture,
    indirectly)."""
    from lowbit.kernels import attention as kattn

    return [pytest.param(kern, d, g, id=f"{kern}-{d}-{g}") for kern in ("simt", "mma") for d, g in sorted(shapes)
            if kern == "simt" or kattn.mma_supported(d, g)]


def _ref(q, k, v, mask, scale):
    return lowbit.ops.decode_attention_reference(q.cpu().double(), k.cpu().double(), v.cpu().double(),
                                                 None if mask is None else mask.cpu(), scale)


def _rel(y, want):
    y = y.cpu().double()
    assert not y.isnan().any(), "NaN in output"
    return ((y - want).norm() / want.norm()).item()


def _case(gen, b, hq, hkv, length, d, dtype, p_visible=0.8):
    q = torch.randn(b, hq, d, generator=gen).to(dtype).cuda()
    k = (torch.randn(b, hkv, length, d, generator=gen) * 2).to(dtype).cuda()  # peaked softmax rows too
    v = torch.randn(b, hkv, length, d, generator=gen).to(dtype).cuda()
    mask = torch.rand(b, length, generator=gen) < p_visible
    mask[:, 0] = True
    return q, k, v, mask.cuda()


@pytest.mark.parametrize("kernel,d,g", _kernel_shapes(lowbit.ops.DECODE_ATTENTION_SHAPES), indirect=["kernel"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_decode_attention_matches_reference(d, g, dtype, gen, kernel):
    for b, hkv, length in ((1, 8, 1), (2, 2, 37), (1, 4, 590), (3, 1, 3000)):
        q, k, v, mask = _case(gen, b, hkv * g, hkv, length, d, dtype)
        scale = d ** -0.5
        for m in (mask, None):
            out = lowbit.ops.decode_attention(q, k, v, m, scale)
            err = _rel(out, _ref(q, k, v, m, scale))
            assert err <= BOUND[dtype], f"B={b} Hkv={hkv} L={length}: rel err {err:.2e}"


@pytest.mark.parametrize("splits", [1, 2, 4, 8])
def test_query_heads_split_over_ctas(splits, gen, kernel):
    """Each head split (a KV head's query heads over 1-8 CTAs, each reading the K/V rows) gives the reference's
    result; a split the compiled group sizes do not allow falls back to none."""
    from lowbit.kernels import attention as kattn

    q, k, v, mask = _case(gen, 2, 32, 4, 700, 128, torch.bfloat16)
    want = _ref(q, k, v, mask, 0.09)
    try:
        kattn.HEAD_SPLITS = splits
        out = lowbit.ops.decode_attention(q, k, v, mask, 0.09)
    finally:
        kattn.HEAD_SPLITS = None
    assert _rel(out, want) <= BOUND[torch.bfloat16]


@pytest.mark.parametrize("length", [64, 1024, 1025, 2112])
def test_chunk_merge_from_registers_and_in_a_loop(length, gen, kernel):
    """The last CTA of a head group merges up to 16 chunks from registers (one round of loads) and more in a loop:
    1, 16, 17 and 33 chunks of 64 positions give the reference's result, bit-equal on repeated calls."""
    from lowbit.kernels import attention as kattn

    q, k, v, mask = _case(gen, 1, 32, 8, length, 128, torch.bfloat16)
    want = _ref(q, k, v, mask, 0.09)
    try:
        kattn.CHUNK = 64
        out = lowbit.ops.decode_attention(q, k, v, mask, 0.09)
        again = lowbit.ops.decode_attention(q, k, v, mask, 0.09)
    finally:
        kattn.CHUNK = None
    assert _rel(out, want) <= BOUND[torch.bfloat16]
    assert torch.equal(out, again)


def test_masked_sequences_strided_cache_and_determinism(gen, kernel):
    """A sequence with no visible position is NaN, its neighbours are not; a cache view (the first slots
    of a longer cache) reads only its slots; repeated calls are bit-equal (chunk merge in fixed order)."""
    q, k, v, mask = _case(gen, 3, 32, 8, 700, 128, torch.bfloat16, p_visible=0.3)
    mask[1] = False
    mask[2] = False
    mask[2, 699] = True  # one visible position, in the last chunk
    out = lowbit.ops.decode_attention(q, k, v, mask, 0.09)
    assert out[1].isnan().all() and torch.isfinite(out[[0, 2]]).all()
    want = _ref(q, k, v, mask, 0.09)
    assert _rel(out[[0, 2]], want[[0, 2]]) <= BOUND[torch.bfloat16]
    assert torch.equal(out[2].float(), v[2, :, 699].repeat_interleave(4, 0).float())  # softmax of one score is 1
    big_k = torch.full((3, 8, 900, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    big_v = big_k.clone()
    big_k[:, :, :700], big_v[:, :, :700] = k, v
    strided = lowbit.ops.decode_attention(q, big_k[:, :, :700], big_v[:, :, :700], mask, 0.09)
    assert torch.equal(strided[[0, 2]], out[[0, 2]])
    for _ in range(3):
        assert torch.equal(lowbit.ops.decode_attention(q, k, v, mask, 0.09)[[0, 2]], out[[0, 2]])


def test_nan_in_the_cache_is_never_dropped(gen, kernel):
    """NaN in K rows filling a whole 8-position step of one warp (where a max over the step's scores would
    drop them) or in one V row makes that KV head's query heads NaN, like the reference; the rest stays finite."""
    q, k, v, mask = _case(gen, 2, 32, 8, 300, 128, torch.bfloat16, p_visible=1.0)
    k[0, 3, 8:16] = float("nan")
    v[1, 5, 100] = float("nan")
    out = lowbit.ops.decode_attention(q, k, v, mask, 0.09)
    bad = torch.zeros(2, 32, dtype=torch.bool)
    bad[0, 12:16] = True
    bad[1, 20:24] = True
    assert out.isnan().any(-1).cpu().equal(bad) and out.cpu()[bad].isnan().all()
    assert _ref(q, k, v, mask, 0.09).isnan().any(-1).equal(bad)


def test_decode_attention_in_graph_with_pdl_chain(gen, kernel):
    """Captured in a CUDA graph with programmatic launch between it and a kbit GEMV reading its output
    (the o_proj pattern), replays bit-equal to the serialized calls; counters are reset for replays."""
    q, k, v, mask = _case(gen, 1, 32, 8, 590, 128, torch.bfloat16)
    o = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(4096, 1024, bias=False), bits=4).to("cuda", torch.bfloat16)

    def step():
        a = lowbit.ops.decode_attention(q, k, v, mask, 0.088)
        return o(a.view(1, 4096))

    with torch.no_grad():
        want = step()
        with lowbit.programmatic_launch():
            o._launcher = None
            step()
            graph, out = capture(step)
        for _ in range(3):
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want)


def test_transformers_decode_step_uses_it(gen):
    """A tiny Llama (head_dim 64) decoding one token after a 9-token prompt in a static cache: with
    lowbit's attention function the decode step runs the kernel, and its logits match transformers'
    eager attention within bf16 rounding."""
    from transformers import StaticCache

    from lowbit.hf.attention import NAME, use_gqa_sdpa

    from ..tiny_models import build

    model = build("llama", 0, dtype=torch.bfloat16, device="cuda", hidden=256)
    model.set_attn_implementation("sdpa")
    assert use_gqa_sdpa(model)
    ids = torch.randint(0, 320, (2, 9), generator=gen).cuda()
    nxt = torch.randint(0, 320, (2, 1), generator=gen).cuda()
    calls = []
    real = lowbit.ops.decode_attention

    def counting(*a):
        calls.append(1)
        return real(*a)

    def step_logits(impl):
        model.set_attn_implementation(impl)
        cache = StaticCache(config=model.config, max_cache_len=40)
        with torch.no_grad():
            model(ids, past_key_values=cache, position_ids=torch.arange(9).expand(2, -1).cuda(), use_cache=True)
            return model(nxt, past_key_values=cache, position_ids=torch.full((2, 1), 9).cuda(), use_cache=True).logits

    mp = pytest.MonkeyPatch()
    mp.setattr(lowbit.ops, "decode_attention", counting)
    try:
        got = step_logits(NAME)
    finally:
        mp.undo()
    assert len(calls) == 2  # the decode step's two layers; the prompt went to SDPA
    want = step_logits("eager")
    assert _rel(got, want.double().cpu()) < 2e-2


# ---- rotary embedding + KV-cache append + attention in one kernel (decode_attention_append)

def _append_inputs(gen, b, hq, hkv, length, d, dtype, pos):
    """Inputs as a fused q|k|v projection leaves them (q, k, v row views of one [b, (hq + 2 hkv) d] output),
    cos/sin of random angles, caches full of random rows, and a causal mask up to pos."""
    qkv = torch.randn(b, (hq + 2 * hkv) * d, generator=gen).to(dtype).cuda()
    q = qkv[:, :hq * d].view(b, hq, d)
    k_new = qkv[:, hq * d:(hq + hkv) * d].view(b, hkv, d)
    v_new = qkv[:, (hq + hkv) * d:].view(b, hkv, d)
    ang = torch.rand(b, d // 2, generator=gen) * 50
    cos = torch.cat((ang, ang), -1).cos().to(dtype).cuda()
    sin = torch.cat((ang, ang), -1).sin().to(dtype).cuda()
    kc = torch.randn(b, hkv, length, d, generator=gen).to(dtype).cuda()
    vc = torch.randn(b, hkv, length, d, generator=gen).to(dtype).cuda()
    mask = (torch.arange(length)[None].expand(b, length) <= pos).cuda()
    return q, k_new, v_new, cos, sin, kc, vc, torch.tensor([pos], device="cuda"), mask


def _append_check(args, scale, dtype, norms=None):
    """``norms``: (q_norm, k_norm, eps), each head RMS-normalized before the rotation."""
    q, k_new, v_new, cos, sin, kc, vc, position, mask = args
    pos = int(position)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    kw = {} if norms is None else {"q_norm": norms[0], "k_norm": norms[1], "norm_eps": norms[2]}
    want = lowbit.ops.decode_attention_append_reference(q, k_new, v_new, cos, sin, ref_kc, ref_vc, position.clone(),
                                                         mask, scale, **kw)
    out = lowbit.ops.decode_attention_append(q, k_new, v_new, cos, sin, kc, vc, position, mask, scale, **kw)
    assert position.tolist() == [pos + 1]  # advanced once, by the grid's last CTA
    # the cache rows: the written one within one rounding of the reference's rotation, every other row untouched
    others = torch.ones(kc.shape[2], dtype=torch.bool)
    others[pos] = False
    assert torch.equal(kc[:, :, others], ref_kc[:, :, others]) and torch.equal(vc, ref_vc)
    torch.testing.assert_close(kc[:, :, pos].float(), ref_kc[:, :, pos].float(), rtol=2 ** -7, atol=1e-2)
    # the output: against fp64 attention of the reference's rotated q over the kernel's own cache
    if norms is not None:
        q = lowbit.ops.rms_norm_reference(q, norms[0], norms[2])
    qr = lowbit.ops.rope_reference(q, cos, sin)
    err = _rel(out, _ref(qr, kc, vc, mask, scale))
    assert err <= BOUND[dtype], f"rel err {err:.2e}"
    assert _rel(want, _ref(qr, kc, vc, mask, scale)) <= BOUND[dtype]
    return out


@pytest.mark.parametrize("kernel,d,g", _kernel_shapes(lowbit.ops.DECODE_ATTENTION_SHAPES), indirect=["kernel"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_append_matches_reference(d, g, dtype, gen, kernel):
    for b, hkv, length, pos in ((1, 8, 64, 0), (2, 2, 130, 64), (1, 4, 590, 589), (3, 1, 1000, 517)):
        _append_check(_append_inputs(gen, b, hkv * g, hkv, length, d, dtype, pos), d ** -0.5, dtype)


@pytest.mark.parametrize("kernel,d,g", _kernel_shapes([(128, 2), (128, 8), (64, 4), (256, 1)]), indirect=["kernel"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_append_with_qk_norms(d, g, dtype, gen, kernel):
    """Qwen3's per-head q/k RMSNorms folded into the kernel: within the plain append's bounds of the reference
    (norm, then rotation), every cache row but the new one untouched."""
    for b, hkv, length, pos in ((1, 4, 512, 300), (2, 2, 130, 64)):
        args = _append_inputs(gen, b, hkv * g, hkv, length, d, dtype, pos)
        norms = tuple((torch.rand(d, generator=gen) + 0.5).to(dtype).cuda() for _ in range(2)) + (1e-6,)
        _append_check(args, d ** -0.5, dtype, norms)


@pytest.mark.parametrize("splits", [1, 2, 4, 8])
def test_append_with_query_heads_split(splits, gen, kernel):
    """With a KV head's query heads over several CTAs, each rebuilds the new row and exactly one writes it."""
    from lowbit.kernels import attention as kattn

    args = _append_inputs(gen, 2, 32, 4, 700, 128, torch.bfloat16, 383)
    try:
        kattn.HEAD_SPLITS = splits
        _append_check(args, 0.09, torch.bfloat16)
    finally:
        kattn.HEAD_SPLITS = None


def test_append_position_outside_the_cache_is_nan_and_writes_nothing(gen, kernel):
    q, k_new, v_new, cos, sin, kc, vc, _, mask = _append_inputs(gen, 1, 32, 8, 300, 128, torch.bfloat16, 299)
    kc0, vc0 = kc.clone(), vc.clone()
    for bad in (300, 10 ** 6, -1):
        position = torch.tensor([bad], device="cuda")
        out = lowbit.ops.decode_attention_append(q, k_new, v_new, cos, sin, kc, vc, position, mask, 0.09)
        assert out.isnan().all()
        assert torch.equal(kc, kc0) and torch.equal(vc, vc0) and position.tolist() == [bad]


@pytest.mark.parametrize("early", [False, True], ids=["wait-first", "early-rows"])
def test_append_in_graph_steps_the_position(early, gen, kernel):
    """Captured in a CUDA graph with programmatic launch and a kbit GEMV reading its output (the o_proj
    pattern): each replay appends at the position a device counter holds (advanced by the op itself), and
    matches the same steps run eagerly, bit for bit. early-rows: the kernel loads the cache rows and the
    position before waiting for the mask kernel in front of it (FLAG_EARLY), reading the row the previous
    replay's attention wrote."""
    length = 200
    q, k_new, v_new, cos, sin, kc, vc, _, _ = _append_inputs(gen, 1, 32, 8, length, 128, torch.bfloat16, 0)
    o = lowbit.nn.KbitLinear.from_linear(torch.nn.Linear(4096, 1024, bias=False), bits=4).to("cuda", torch.bfloat16)
    ar = torch.arange(length, device="cuda")

    def run_steps(kc, vc, pos, graph_steps):
        def step():
            mask = (ar <= pos)[None]
            a = lowbit.ops.decode_attention_append(q, k_new, v_new, cos, sin, kc, vc, pos, mask, 0.088, early)
            return o(a.view(1, 4096))

        outs = []
        with torch.no_grad():
            if not graph_steps:
                return [step().clone() for _ in range(6)][1:]  # the first: the graph run's warm-up step
            with lowbit.programmatic_launch():
                o._launcher = None
                step()  # warm-up: position 100
                graph, out = capture(step)  # capture runs nothing
                for _ in range(5):
                    graph.replay()
                    torch.cuda.synchronize()
                    outs.append(out.clone())
        return outs

    kc_e, vc_e = kc.clone(), vc.clone()
    pos_e = torch.tensor([100], device="cuda")
    eager = run_steps(kc_e, vc_e, pos_e, False)
    kc_g, vc_g = kc.clone(), vc.clone()
    pos_g = torch.tensor([100], device="cuda")
    graphed = run_steps(kc_g, vc_g, pos_g, True)
    for a, b in zip(graphed, eager):
        assert torch.equal(a, b)
    assert int(pos_g) == int(pos_e) == 106
    assert torch.equal(kc_g[:, :, 100:106], kc_e[:, :, 100:106]) and torch.equal(vc_g[:, :, 100:106], vc_e[:, :, 100:106])


@pytest.mark.parametrize("name,kw", [("llama", {}), ("llama", {"hidden": 256, "inter": 512}), ("qwen3_moe", {})],
                         ids=["llama-d32", "llama-d64", "qwen3_moe-d32"])
def test_transformers_fused_decode_steps(name, kw, gen, monkeypatch):
    """A tiny Llama (head_dim 32 and 64) and Qwen3-MoE (per-head q/k norms), bf16 on the GPU, under programmatic
    launch: 4 decode steps after a 9-token prompt with the fused op (with its early cache reads) give the model's
    own logits within bf16 rounding and the same caches. head_dim 64 takes the fused op on every layer and step;
    32 has no compiled kernel and keeps the layers' own forward."""
    from transformers import StaticCache

    from lowbit.hf.attention import use_fused_decode_attention, use_gqa_sdpa

    from ..tiny_models import build

    model = build(name, 0, dtype=torch.bfloat16, device="cuda", **kw)
    model.set_attn_implementation("sdpa")
    assert use_gqa_sdpa(model)
    ids = torch.randint(0, 320, (2, 9), generator=gen).cuda()
    steps = torch.randint(0, 320, (4, 2, 1), generator=gen).cuda()
    calls = []
    op = lowbit.ops.decode_attention_append

    def counted(*args):
        calls.append(args[-1])  # early_kv
        return op(*args)

    monkeypatch.setattr(lowbit.ops, "decode_attention_append", counted)

    def run():
        cache = StaticCache(config=model.config, max_cache_len=40)
        out = []
        with torch.no_grad(), lowbit.programmatic_launch():
            model(ids, past_key_values=cache, position_ids=torch.arange(9).expand(2, -1).cuda(), use_cache=True)
            for i, tok in enumerate(steps):
                out.append(model(tok, past_key_values=cache, position_ids=torch.full((2, 1), 9 + i).cuda(),
                                 use_cache=True).logits.float())
        return torch.cat(out, 1), cache

    want, want_cache = run()
    assert use_fused_decode_attention(model) == 2
    got, got_cache = run()
    assert calls == ([True] * 8 if model.config.hidden_size // model.config.num_attention_heads == 64 else [])
    assert torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 2e-2
    for a, b in zip(got_cache.layers, want_cache.layers):
        assert ((a.keys.float() - b.keys.float()).norm() / b.keys.float().norm()).item() < 1e-2
        assert int(a.cumulative_length) == 13


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("chunk", [16, 48, 64, 0], ids=["c16", "c48", "c64", "one-chunk"])
def test_mma_warps_and_chunks(warps, chunk, gen, monkeypatch):
    """The tensor-core kernel with 4 and 8 warps per CTA and chunks of any multiple of 16 positions (or one per
    sequence), on a cache that ends mid-step and a mask, fp16 and bf16: within the bounds, bit-equal when repeated."""
    from lowbit.kernels import attention as kattn

    length = 301
    monkeypatch.setattr(kattn, "KERNEL", "mma")
    monkeypatch.setattr(kattn, "MMA_WARPS", warps)
    monkeypatch.setattr(kattn, "CHUNK", chunk or 320)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v, mask = _case(gen, 2, 32, 8, length, 128, dtype)
        out = lowbit.ops.decode_attention(q, k, v, mask, 0.09)
        assert _rel(out, _ref(q, k, v, mask, 0.09)) <= BOUND[dtype]
        assert torch.equal(lowbit.ops.decode_attention(q, k, v, mask, 0.09), out)


@pytest.mark.parametrize("g", [3, 5, 6, 7, 12, 16])
def test_mma_takes_any_group_size(g, gen):
    """Query heads per KV head the CUDA-core kernel has no instance for (it falls back to the reference) run on
    tensor cores, up to 8 per CTA (12 and 16 split over 2 CTAs): plain and append mode within the bounds."""
    from lowbit.kernels import attention as kattn

    assert kattn.mma_supported(128, g) and kattn.supported_shape(torch.bfloat16, 2 * g, 2, 128)
    q, k, v, mask = _case(gen, 3, 2 * g, 2, 333, 128, torch.bfloat16)
    out = lowbit.ops.decode_attention(q, k, v, mask, 0.09)
    assert _rel(out, _ref(q, k, v, mask, 0.09)) <= BOUND[torch.bfloat16]
    _append_check(_append_inputs(gen, 2, 2 * g, 2, 300, 128, torch.bfloat16, 257), 0.09, torch.bfloat16)


def test_resident_ctas_and_the_grid_plan():
    """The occupancy each instance reports (>= 1; fewer CTAs for more heads per CTA at one head dim) and the
    plan built on it: the batch-4 Llama-3-8B grid fits one wave."""
    from lowbit.kernels import attention as kattn
    from lowbit.kernels.library import library_or_none

    lib = library_or_none(torch.device("cuda"))
    dev = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for dtype in (torch.float16, torch.bfloat16):
        for append in (False, True):
            per = {g: kattn.resident_ctas(lib, dev, dtype, 128, g, append) for g in (1, 2, 4, 8)}
            assert all(n >= 1 for n in per.values()) and per[1] >= per[2] >= per[4] >= per[8], per
    per_sm = lambda g: kattn.resident_ctas(lib, dev, torch.bfloat16, 128, g, True)  # noqa: E731
    splits = kattn.head_splits(4, 8, 4, 128, sms, per_sm)
    chunk = kattn.chunk_size(4, 8 * splits, 590, 128, sms, per_sm(4 // splits))
    assert 4 * 8 * splits * -(-590 // chunk) <= per_sm(4 // splits) * sms


@pytest.mark.parametrize("d,g", sorted(lowbit.ops.DECODE_ATTENTION_SHAPES))
def test_one_tree_for_eight_scores_is_bit_identical(d, g, gen, monkeypatch):
    """warp_sum8 (one butterfly for a step's 8 scores) against the reduction it replaced, one score at a time
    (FLAG_REDUCE_EACH): the same additions in the same order, so the outputs are equal bit for bit -- with a
    mask, a partial last step and a NaN row."""
    from lowbit.kernels import attention as kattn

    b, hkv, length = 2, 2, 203
    q = torch.randn(b, hkv * g, d, generator=gen).to(torch.bfloat16).cuda()
    k = torch.randn(b, hkv, length, d, generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn(b, hkv, length, d, generator=gen).to(torch.bfloat16).cuda()
    v[1, :, 17] = float("nan")
    mask = torch.rand(b, length, generator=gen).cuda() < 0.8
    outs = []
    for each in (False, True):
        monkeypatch.setattr(kattn, "REDUCE_EACH", each)
        outs.append(lowbit.ops.decode_attention(q, k, v, mask, d ** -0.5))
    assert torch.equal(outs[0].nan_to_num(7.0), outs[1].nan_to_num(7.0))
    assert outs[0][0].isfinite().all()
