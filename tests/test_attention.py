"""lowbit's decode attention op (one query token against a KV cache): the reference against torch's
math attention, its argument checks, and the transformers glue (mask conversion, which calls it takes)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
import torch

import lowbit
from lowbit.hf import attention as hf_attention
from lowbit.kernels import attention as kattn


def _case(gen, b=2, hq=8, hkv=2, length=37, d=64, dtype=torch.float32):
    q = torch.randn(b, hq, d, generator=gen).to(dtype)
    k = torch.randn(b, hkv, length, d, generator=gen).to(dtype)
    v = torch.randn(b, hkv, length, d, generator=gen).to(dtype)
    mask = torch.rand(b, length, generator=gen) < 0.7
    mask[:, 0] = True
    return q, k, v, mask


@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 4), (6, 1)])
def test_reference_is_grouped_query_attention(hq, hkv, gen):
    """The op on CPU = torch SDPA (math) with K/V repeated per query-head group and the same mask."""
    q, k, v, mask = _case(gen, hq=hq, hkv=hkv)
    got = lowbit.ops.decode_attention(q, k, v, mask, 0.125)
    rep = hq // hkv
    want = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask[:, None, None, :],
        scale=0.125)[:, :, 0]
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    full = lowbit.ops.decode_attention(q, k, v, None, 0.125)
    assert torch.allclose(full, lowbit.ops.decode_attention(q, k, v, torch.ones_like(mask), 0.125))


def test_fully_masked_sequence_is_nan_and_strided_cache(gen):
    q, k, v, mask = _case(gen, b=3, length=50)
    mask[1] = False
    out = lowbit.ops.decode_attention(q, k, v, mask, 0.1)
    assert out[1].isnan().all() and torch.isfinite(out[[0, 2]]).all()
    big_k, big_v = torch.randn(3, 2, 80, 64, generator=gen), torch.randn(3, 2, 80, 64, generator=gen)
    big_k[:, :, :50], big_v[:, :, :50] = k, v
    strided = lowbit.ops.decode_attention(q, big_k[:, :, :50], big_v[:, :, :50], mask, 0.1)  # a cache's first 50 slots
    assert torch.equal(strided[[0, 2]], out[[0, 2]])


def test_decode_attention_errors(gen):
    q, k, v, mask = _case(gen)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        lowbit.ops.decode_attention(q[:, :7].contiguous(), k, v, mask, 0.1)
    with pytest.raises(ValueError, match="head_dim"):
        lowbit.ops.decode_attention(q, k.transpose(2, 3), v, mask, 0.1)
    with pytest.raises(ValueError, match="mask must be bool"):
        lowbit.ops.decode_attention(q, k, v, mask[:, :5], 0.1)
    with pytest.raises(TypeError, match="mask"):
        lowbit.ops.decode_attention(q, k, v, mask.float(), 0.1)
    with pytest.raises(TypeError, match="dtype"):
        lowbit.ops.decode_attention(q, k.half(), v, mask, 0.1)
    with pytest.raises(ValueError, match="scale"):
        lowbit.ops.decode_attention(q, k, v, mask, float("nan"))
    with pytest.raises(ValueError, match="alike"):
        lowbit.ops.decode_attention(q, k, v[:, :, :5], mask, 0.1)


def test_decode_mask_conversion():
    m = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    assert hf_attention.decode_mask(None, 2, 9) is None
    assert torch.equal(hf_attention.decode_mask(m, 2, 9), torch.ones(2, 9, dtype=torch.bool))
    assert hf_attention.decode_mask(torch.ones(1, 1, 1, 9, dtype=torch.bool), 3, 9).shape == (3, 9)  # broadcast batch
    assert hf_attention.decode_mask(m.float(), 2, 9) is False  # additive masks stay with SDPA
    assert hf_attention.decode_mask(torch.ones(2, 1, 2, 9, dtype=torch.bool), 2, 9) is False
    assert hf_attention.decode_mask(m[..., :8], 2, 9) is False


def test_cpu_attention_still_sdpa(gen):
    """On the CPU the transformers glue never takes the decode kernel's path."""
    q = torch.randn(1, 4, 1, 32, generator=gen)
    k = torch.randn(1, 2, 10, 32, generator=gen)

    class M(torch.nn.Module):
        num_key_value_groups = 2
        is_causal = True

    assert hf_attention.lowbit_decode_attention(q, k, k, None, None) is None
    out, _ = hf_attention.sdpa_gqa_attention(M(), q, k, k, None)
    assert out.shape == (1, 1, 4, 32)


#: resident CTAs per SM of the D = 128 instances on the H100 (their registers: 93, 128, 153, 194 for 1, 2, 4, 8 heads)
H100_D128 = {1: 2, 2: 2, 4: 1, 8: 1}.get


def test_head_split_rule():
    def splits(b, hkv, g):
        return kattn.head_splits(b, hkv, g, 128, 132, H100_D128)

    assert splits(1, 8, 4) == 2  # Llama-3-8B, batch 1: 2 heads per CTA
    assert splits(4, 8, 4) == 2  # batch 4: 64 head groups, still one wave
    assert splits(1, 4, 8) == 4  # Qwen3-30B-A3B
    assert splits(64, 8, 4) == 2  # 512 CTAs of one per SM or 1024 of two: 4 waves either way, half the heads each
    assert splits(40, 8, 4) == 2  # 320 CTAs of one per SM or 640 of two: 3 waves either way
    assert splits(1, 8, 1) == 1  # one query head per KV head: nothing to split
    assert splits(1, 2, 6) == 1  # 6 = 2 x 3: groups of 3 are not compiled
    assert kattn.head_splits(40, 8, 4, 128, 132, {2: 2, 4: 2}.get) == 1  # equal occupancy: 320 -> 640 CTAs adds waves


def test_chunk_size_rule():
    assert kattn.chunk_size(1, 16, 590, 128, 132, 2) == 64  # 10 chunks x 16 head groups: 160 CTAs
    assert kattn.chunk_size(4, 16, 590, 128, 132, 2) == 192  # 4 chunks x 64 head groups: 256 CTAs, one wave
    assert kattn.chunk_size(4, 8, 590, 128, 132, 1) == 192  # one CTA per SM: 4 chunks x 32 = 128 CTAs
    assert kattn.chunk_size(1, 8, 1, 128, 132, 2) == 64
    assert kattn.chunk_size(64, 8, 512, 128, 132, 2) == 512  # a large batch: one chunk each
    for b, groups in ((1, 16), (4, 16), (8, 16), (2, 8)):
        for per_sm in (1, 2, 3):
            for length in (1, 63, 590, 4096, 32768):
                c = kattn.chunk_size(b, groups, length, 128, 132, per_sm)
                chunks = -(-length // c)
                assert c % 64 == 0 and (chunks == 1 or b * groups * chunks <= per_sm * 132)
    for length, d in ((100000, 64), (5000, 64), (10**6, 256)):
        c = kattn.chunk_size(1, 1, length, d, 132, 2)
        assert c % 64 == 0 and -(-length // c) <= 2 * d


@given(batch=st.integers(1, 96), kv_heads=st.sampled_from([1, 2, 4, 8, 16]), group=st.sampled_from([1, 2, 3, 4, 6, 8]),
       head_dim=st.sampled_from([64, 128, 256]), length=st.integers(1, 40000), sms=st.sampled_from([16, 78, 108, 132]),
       per_sm=st.lists(st.integers(1, 4), min_size=4, max_size=4))
def test_grid_plan_invariants(batch, kv_heads, group, head_dim, length, sms, per_sm):
    """Whatever the shapes and occupancies: a compiled head group per CTA, splits that add no wave, chunks of
    whole 64-position steps, at most 2 x head_dim of them, and a grid of one wave unless one chunk per head
    group is already more."""
    occ = dict(zip((1, 2, 4, 8), sorted(per_sm, reverse=True)))  # more heads per CTA: never more CTAs per SM
    cap = lambda g: occ.get(g, 1)  # noqa: E731
    splits = kattn.head_splits(batch, kv_heads, group, head_dim, sms, cap)
    g = group // splits
    assert group % splits == 0
    if (head_dim, group) in lowbit.ops.DECODE_ATTENTION_SHAPES:
        assert (head_dim, g) in lowbit.ops.DECODE_ATTENTION_SHAPES
        if splits > 1:
            rows = batch * kv_heads
            assert kattn._waves(rows * splits, cap(g), sms) <= kattn._waves(rows, cap(group), sms)
    chunk = kattn.chunk_size(batch, kv_heads * splits, length, head_dim, sms, cap(g))
    chunks = -(-length // chunk)
    assert chunk % 64 == 0 and chunk >= 64 and chunks <= 2 * head_dim
    if chunks > 1 and chunks < 2 * head_dim:
        assert batch * kv_heads * splits * chunks <= cap(g) * sms


def test_mma_plan_and_head_splits():
    """The tensor-core kernel: one chunk per (sequence, head group) once those CTAs fill a quarter of the SMs, else
    chunks of >= 256 positions up to one CTA per SM, 8 warps each (4 past one CTA per SM); groups past 8 query heads
    split in powers of two, others have no instance; the plan takes it from 17,000 K/V rows per layer."""
    assert kattn.mma_plan(16, 8, 590, 132) == (8, 640)  # Llama-3-8B batch 16: 128 CTAs, one chunk each
    assert kattn.mma_plan(32, 8, 590, 132) == (4, 640)  # 256 CTAs: two per SM
    assert kattn.mma_plan(1, 8, 4096, 132) == (8, 256)  # batch 1, a long cache: 16 chunks x 8 head groups
    assert kattn.mma_plan(4, 8, 590, 132) == (8, 256)  # 32 CTAs: 3 chunks of 256
    assert kattn.mma_plan(4, 8, 4096, 132) == (8, 1024)  # 4 chunks x 32 CTAs
    assert not kattn.use_mma(1, 8, 590, 128, 4) and kattn.use_mma(4, 8, 590, 128, 4)  # Llama-3-8B: batch 1 / 4
    assert kattn.use_mma(1, 8, 4096, 128, 4) and not kattn.use_mma(64, 8, 4096, 256, 4)
    assert not kattn.use_mma(1, 8, 2048, 128, 4) and not kattn.use_mma(2, 8, 590, 128, 4)  # 16,384 / 9,440 rows
    assert kattn.use_mma(1, 1, 16, 128, 6)  # no CUDA-core instance for 6 heads per KV head
    assert [kattn.mma_head_splits(g) for g in (1, 7, 8, 12, 16, 24, 9, 18)] == [1, 1, 1, 2, 2, 4, None, None]
    assert kattn.mma_supported(128, 16) and kattn.mma_supported(64, 3) and not kattn.mma_supported(256, 1)
    assert kattn.supported_shape(torch.bfloat16, 48, 8, 128)  # 6 heads per KV head: tensor cores only
    assert not kattn.supported_shape(torch.float32, 32, 8, 128) and not kattn.supported_shape(torch.bfloat16, 9, 1, 256)


@given(batch=st.integers(1, 96), groups=st.integers(1, 64), length=st.integers(1, 40000),
       sms=st.sampled_from([16, 78, 108, 132]), warps=st.sampled_from([None, 4, 8]))
def test_mma_plan_invariants(batch, groups, length, sms, warps):
    """Whatever the shapes: 4 or 8 warps, chunks of whole 64-position steps (at least one step of every warp), at
    most 128 of them (the workspace's cap for head dim 64), more than one only for a grid under a quarter of the
    SMs, and then within one CTA per SM."""
    old = kattn.MMA_WARPS
    kattn.MMA_WARPS = warps
    try:
        w, chunk = kattn.mma_plan(batch, groups, length, sms)
    finally:
        kattn.MMA_WARPS = old
    chunks = -(-length // chunk)
    assert w in (4, 8) and (warps is None or w == warps)
    assert chunk % 64 == 0 and chunk >= 16 * w and chunks <= 2 * 64
    if chunks > 1:
        assert 4 * batch * groups < sms and batch * groups * chunks <= sms


# ---- rotary embedding + cache append + attention in one op

def _append_case(gen, b=2, hq=4, hkv=2, length=12, d=32, pos=5, dtype=torch.float32):
    # q, k, v as row views of one fused projection output (batch stride (hq + 2 hkv) d)
    qkv = torch.randn(b, (hq + 2 * hkv) * d, generator=gen, dtype=dtype)
    q, k_new, v_new = (t.view(b, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=1))
    ang = torch.rand(b, d // 2, generator=gen) * 6
    cos, sin = torch.cat((ang, ang), -1).cos().to(dtype), torch.cat((ang, ang), -1).sin().to(dtype)
    kc = torch.randn(b, hkv, length, d, generator=gen, dtype=dtype)
    vc = torch.randn(b, hkv, length, d, generator=gen, dtype=dtype)
    mask = torch.arange(length)[None].expand(b, length) <= pos
    return q, k_new, v_new, cos, sin, kc, vc, torch.tensor([pos]), mask.contiguous()


def test_append_op_is_rope_then_cache_write_then_attention(gen):
    """The op's definition, spelled out with transformers' own apply_rotary_pos_emb: the caches gain the
    rotated k and v at the position (nothing else changes) and the output is attention of the rotated q."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k_new, v_new, cos, sin, kc, vc, pos, mask = _append_case(gen)
    kc0, vc0 = kc.clone(), vc.clone()
    out = lowbit.ops.decode_attention_append(q, k_new, v_new, cos, sin, kc, vc, pos, mask, 0.2)
    assert pos.tolist() == [6]  # advanced, as the static cache's length
    qr, kr = apply_rotary_pos_emb(q[:, :, None], k_new[:, :, None], cos[:, None], sin[:, None])
    want_k, want_v = kc0.clone(), vc0.clone()
    want_k[:, :, 5], want_v[:, :, 5] = kr[:, :, 0], v_new
    torch.testing.assert_close(kc, want_k, rtol=1e-6, atol=1e-6)
    assert torch.equal(vc, want_v)
    want = lowbit.ops.decode_attention_reference(qr[:, :, 0], want_k, want_v, mask, 0.2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


def test_append_op_norms_q_and_k_first(gen):
    """q_norm / k_norm: each head RMS-normalized (transformers' Qwen3RMSNorm) before the rotation."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    q, k_new, v_new, cos, sin, kc, vc, pos, mask = _append_case(gen)
    d = q.shape[-1]
    qn, kn = Qwen3RMSNorm(d, eps=1e-6), Qwen3RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        qn.weight.copy_(torch.rand(d, generator=gen) + 0.5)
        kn.weight.copy_(torch.rand(d, generator=gen) + 0.5)
    kc2, vc2, pos2 = kc.clone(), vc.clone(), pos.clone()
    with torch.no_grad():
        got = lowbit.ops.decode_attention_append(q, k_new, v_new, cos, sin, kc, vc, pos, mask, 0.2, q_norm=qn.weight,
                                                 k_norm=kn.weight, norm_eps=1e-6)
        want = lowbit.ops.decode_attention_append(qn(q), kn(k_new), v_new, cos, sin, kc2, vc2, pos2, mask, 0.2)
    assert torch.equal(got, want) and torch.equal(kc, kc2) and torch.equal(vc, vc2)
    op = lowbit.ops.decode_attention_append
    with pytest.raises(ValueError, match="q_norm must be"):
        op(q, k_new, v_new, cos, sin, kc, vc, pos, mask, 0.2, q_norm=qn.weight[:-2])
    with pytest.raises(TypeError, match="k_norm"):
        op(q, k_new, v_new, cos, sin, kc, vc, pos, mask, 0.2, k_norm=kn.weight.half())
    with pytest.raises(ValueError, match="norm_eps"):
        op(q, k_new, v_new, cos, sin, kc, vc, pos, mask, 0.2, q_norm=qn.weight, norm_eps=-1.0)


def test_append_op_errors(gen):
    q, k_new, v_new, cos, sin, kc, vc, pos, mask = _append_case(gen)
    op = lowbit.ops.decode_attention_append
    with pytest.raises(ValueError, match="one cache index"):
        op(q, k_new, v_new, cos, sin, kc, vc, torch.tensor([1, 2]), mask, 0.2)
    with pytest.raises(TypeError, match="int64"):
        op(q, k_new, v_new, cos, sin, kc, vc, pos.int(), mask, 0.2)
    with pytest.raises(ValueError, match="cos must be"):
        op(q, k_new, v_new, cos[:1], sin, kc, vc, pos, mask, 0.2)
    with pytest.raises(ValueError, match="KV heads"):
        op(q, k_new[:, :1], v_new[:, :1], cos, sin, kc, vc, pos, mask, 0.2)
    past = torch.tensor([12])
    with pytest.raises(IndexError):
        op(q, k_new, v_new, cos, sin, kc, vc, past, mask, 0.2)  # past the cache: the reference raises
    assert past.tolist() == [12]


@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fused_decode_attention_in_a_model(name, compiled, gen):
    """A tiny Llama and a Qwen3-MoE (per-head q/k norms) decoding 3 tokens after a 7-token prompt in a static
    cache: with the attention layers switched, the decode steps go through the op, and logits and caches match
    the model's own forward."""
    from transformers import StaticCache

    from .tiny_models import build

    torch._dynamo.reset()
    model = build(name, 0)
    model.set_attn_implementation("sdpa")
    assert hf_attention.use_gqa_sdpa(model)
    ids = torch.randint(0, 320, (2, 7), generator=gen)
    steps = torch.randint(0, 320, (3, 2, 1), generator=gen)

    def run():
        cache = StaticCache(config=model.config, max_cache_len=16)
        fwd = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model
        out = []
        with torch.no_grad():
            model(ids, past_key_values=cache, position_ids=torch.arange(7).expand(2, -1), use_cache=True)
            for i, tok in enumerate(steps):
                out.append(fwd(tok, past_key_values=cache, position_ids=torch.full((2, 1), 7 + i), use_cache=True).logits)
        return torch.cat(out, 1), cache

    want, want_cache = run()
    assert hf_attention.use_fused_decode_attention(model) == len(model.model.layers)
    calls = []
    real = lowbit.ops.decode_attention_append
    mp = pytest.MonkeyPatch()
    mp.setattr(lowbit.ops, "decode_attention_append", lambda *a, **kw: calls.append(sorted(kw)) or real(*a, **kw))
    try:
        torch._dynamo.reset()
        got, got_cache = run()
    finally:
        mp.undo()
    assert len(calls) == 3 * len(model.model.layers)  # every decode step of every layer (dynamo replays the append)
    # Qwen3's per-head q/k RMSNorms go into the op
    assert all(kw == (["k_norm", "norm_eps", "q_norm"] if name == "qwen3_moe" else []) for kw in calls)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(got_cache.layers, want_cache.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)
        assert int(a.cumulative_length) == int(b.cumulative_length) == 10
