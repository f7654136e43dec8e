"""lowbit's MoE router op (softmax top-k routing): its reference against every transformers router class it
stands in for, its argument checks, and the module swap (parameters and state dict unchanged)."""

import importlib

import pytest
import torch

from lowbit import ops
from lowbit.hf import router as hf_router

# (transformers module, class) of each listed router; skipped when this transformers lacks it
CLASSES = {
    "Qwen3MoeTopKRouter": "qwen3_moe", "Qwen2MoeTopKRouter": "qwen2_moe", "Qwen3NextTopKRouter": "qwen3_next",
    "OlmoeTopKRouter": "olmoe", "FlexOlmoTopKRouter": "flex_olmo", "Qwen3_5MoeTopKRouter": "qwen3_5_moe",
    "Qwen3VLMoeTextTopKRouter": "qwen3_vl_moe", "MixtralTopKRouter": "mixtral",
}


def _router_class(name):
    try:
        mod = importlib.import_module(f"transformers.models.{CLASSES[name]}.modeling_{CLASSES[name]}")
    except ImportError:
        pytest.skip(f"transformers has no {CLASSES[name]}")
    cls = getattr(mod, name, None)
    if cls is None:
        pytest.skip(f"transformers has no {name}")
    return cls


class _Cfg:
    num_experts = num_local_experts = 24
    num_experts_per_tok = 5
    hidden_size = 64


def test_every_listed_router_is_tested():
    assert set(CLASSES) == set(hf_router.ROUTERS)


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swapped_router_computes_what_transformers_does(name, norm, dtype, gen):
    cls = _router_class(name)
    cfg = _Cfg()
    cfg.norm_topk_prob = norm
    router = cls(cfg).to(dtype)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
    x = torch.randn(3, 2, 64, generator=gen).to(dtype)
    want = router(x)
    model = torch.nn.Sequential(router)
    keys = set(model.state_dict())
    assert hf_router.use_lowbit_router(model) == 1 and isinstance(router, cls) and type(router) is not cls
    assert set(model.state_dict()) == keys and hf_router.use_lowbit_router(model) == 0  # once
    got = router(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)
    strided = torch.randn(3, 2, 128, generator=gen).to(dtype)[..., ::2]  # a non-contiguous input, as F.linear takes
    assert all(torch.equal(a, b) for a, b in zip(router(strided), cls.forward(router, strided)))


def test_a_namesake_outside_transformers_is_left_alone():
    Qwen3MoeTopKRouter = type("Qwen3MoeTopKRouter", (torch.nn.Module,), {})  # a user's own class of that name
    mod = Qwen3MoeTopKRouter()
    mod.weight = torch.nn.Parameter(torch.zeros(4, 8))
    assert hf_router.use_lowbit_router(torch.nn.Sequential(mod)) == 0 and type(mod) is Qwen3MoeTopKRouter


def test_reference_ranks_and_renormalizes(gen):
    x = torch.randn(4, 32, generator=gen)
    w = torch.randn(10, 32, generator=gen)
    logits, scores, idx = ops.moe_router(x, w, 3, True, True)
    probs = torch.softmax(x @ w.t(), -1)
    assert torch.allclose(logits, x @ w.t(), atol=1e-5)
    assert torch.equal(idx, probs.argsort(-1, descending=True)[:, :3])
    assert torch.allclose(scores.sum(-1), torch.ones(4)) and scores.dtype == torch.float32
    _, raw, _ = ops.moe_router(x, w, 3, False, True)
    assert torch.allclose(raw, probs.gather(1, idx))
    x[1, 0] = float("nan")
    _, s, _ = ops.moe_router(x, w, 3, True, False)
    assert s[1].isnan().all() and not s[[0, 2, 3]].isnan().any()


def test_argument_errors():
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match="top_k"):
        ops.moe_router(x, w, 9, True, False)
    with pytest.raises(ValueError, match="top_k"):
        ops.moe_router(x, w, 0, True, False)
    with pytest.raises(ValueError, match="hidden=16"):
        ops.moe_router(x, torch.randn(8, 12), 2, True, False)
    with pytest.raises(TypeError, match="weight must have dtype"):
        ops.moe_router(x, w.half(), 2, True, False)
    with pytest.raises(ValueError, match="2-D"):
        ops.moe_router(x[None], w, 2, True, False)


def test_fake_matches_reference_shapes():
    x, w = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.lowbit.moe_router, (x, w, 4, True, False))
    torch.library.opcheck(torch.ops.lowbit.moe_router, (x, w, 4, False, True))
