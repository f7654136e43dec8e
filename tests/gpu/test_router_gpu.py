"""lowbit's MoE router kernel (csrc/moe/router.cu) against the op's reference.

Bounds: logits are an fp32 dot product rounded once to fp16/bf16, like cuBLAS's, but summed in another order:
relative norm error vs fp64 <= 1e-3 (fp16) / 8e-3 (bf16). The selection and the scores are a function of those
rounded logits: fed the kernel's own logits, the reference must pick the same probabilities (indices may differ
only between equal probabilities) and give the same scores to 1e-6 (fp32; exp and sum order differ) or within
one rounding of the output dtype. NaN never passes, except in a token whose logits hold a NaN: all NaN there.
"""

import pytest
import torch

import lowbit
from lowbit import ops
from lowbit.hf.router import use_lowbit_router

from ..tiny_models import build, rel_err
from .kbit_check import capture

pytestmark = pytest.mark.gpu
BOUND = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
ids_ = lambda d: str(d).removeprefix("torch.")  # noqa: E731


def _check(x, w, top_k, normalize, fp32_scores, out):
    logits, scores, idx = out
    want = x.cpu().double() @ w.cpu().double().t()
    assert not logits.isnan().any() and rel_err(logits.double().cpu(), want) <= BOUND[x.dtype]
    # the selection, from the kernel's own logits
    probs = torch.softmax(logits.cpu().float(), -1)
    top, _ = torch.topk(probs, top_k, -1)
    assert torch.equal(probs.gather(1, idx.cpu()), top), "picked probabilities are not the top k, highest first"
    assert all(len(set(r)) == top_k for r in idx.cpu().tolist()), "an expert picked twice"
    ref = top / top.sum(-1, keepdim=True) if normalize else top
    assert scores.dtype == (torch.float32 if fp32_scores else x.dtype) and not scores.isnan().any()
    if fp32_scores:
        assert torch.allclose(scores.cpu(), ref, rtol=1e-5, atol=1e-6)
    else:
        assert torch.allclose(scores.float().cpu(), ref.to(x.dtype).float(), rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=ids_)
@pytest.mark.parametrize("tokens,experts,hidden,top_k", [(1, 128, 2048, 8), (4, 128, 2048, 8), (8, 512, 2048, 10),
                                                         (3, 60, 1032, 4), (1, 8, 64, 2), (2, 1024, 4096, 64), (8, 1024, 256, 8),
                                                         (5, 64, 8, 1), (1, 200, 512, 6), (2, 64, 12288, 4)])
@pytest.mark.parametrize("normalize,fp32_scores", [(True, False), (False, False), (True, True)])
def test_kernel_matches_reference(dtype, tokens, experts, hidden, top_k, normalize, fp32_scores, gen):
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).cuda()
    w = (torch.randn(experts, hidden, generator=gen) / hidden ** 0.5).to(dtype).cuda()
    out = ops.moe_router(x, w, top_k, normalize, fp32_scores)
    _check(x, w, top_k, normalize, fp32_scores, out)
    again = ops.moe_router(x, w, top_k, normalize, fp32_scores)
    assert all(torch.equal(a, b) for a, b in zip(out, again)), "not deterministic"


def test_nan_token_is_nan_and_others_are_not(gen):
    x = torch.randn(3, 256, generator=gen).bfloat16().cuda()
    w = torch.randn(32, 256, generator=gen).bfloat16().cuda()
    x[1, 7] = float("nan")
    logits, scores, idx = ops.moe_router(x, w, 4, True, False)
    assert scores[1].isnan().all() and not scores[[0, 2]].isnan().any()
    assert ((idx >= 0) & (idx < 32)).all()


def test_beyond_the_kernel_runs_the_reference(gen):
    """9 tokens (prefill), hidden % 8 != 0: torch's computation, same results as the reference."""
    for tokens, hidden in [(9, 64), (2, 60)]:
        x = torch.randn(tokens, hidden, generator=gen).bfloat16().cuda()
        w = torch.randn(16, hidden, generator=gen).bfloat16().cuda()
        got = ops.moe_router(x, w, 3, True, False)
        want = ops.moe_router_reference(x, w, 3, True, False)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_graph_and_pdl_chain_with_a_gemv(gen):
    """In a CUDA graph under programmatic launch, between kbit GEMVs that share the counter buffer: every
    replay gives the eager result."""
    x = torch.randn(2, 2048, generator=gen).bfloat16().cuda()
    w = (torch.randn(128, 2048, generator=gen) * 0.02).bfloat16().cuda()
    q = lowbit.quantize_kbit(torch.randn(4096, 2048, generator=gen).bfloat16().cuda(), bits=4)
    want = ops.moe_router(x, w, 8, True, False)

    y_want = lowbit.kbit_linear(x, q)

    def run():
        return lowbit.kbit_linear(x, q), ops.moe_router(x, w, 8, True, False), lowbit.kbit_linear(x, q)

    with lowbit.programmatic_launch(True):
        run()
        torch.cuda.synchronize()
        g, (y0, r, y1) = capture(run)
        for _ in range(3):
            g.replay()
            torch.cuda.synchronize()
            assert all(torch.equal(a, b) for a, b in zip(r, want))
            assert torch.equal(y0, y_want) and torch.equal(y1, y_want)


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_model_with_lowbit_router_matches(name, gen):
    """A tiny MoE model's logits with its routers swapped = without, on the tokens routed alike."""
    model = build(name, int(torch.randint(0, 2**31 - 1, (1,), generator=gen)), dtype=torch.bfloat16, device="cuda")
    ids = torch.randint(0, 320, (2, 1), generator=gen).cuda()
    with torch.no_grad():
        want = model(ids).logits.float()
        assert use_lowbit_router(model) > 0
        got = model(ids).logits.float()
    assert not got.isnan().any() and rel_err(got.cpu(), want.cpu()) < 2e-2
