"""Tiny random-init transformers models (no downloads) for the model-level tests."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")


def llama(tie: bool = False, hidden: int = 128, inter: int = 224, layers: int = 2, vocab: int = 320):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
                                   max_position_embeddings=256)
    return cfg, transformers.LlamaForCausalLM


def qwen3_moe(moe_inter: int = 96):
    cfg = transformers.Qwen3MoeConfig(vocab_size=320, hidden_size=128, intermediate_size=256, moe_intermediate_size=moe_inter,
                                      num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32, max_position_embeddings=256)
    return cfg, transformers.Qwen3MoeForCausalLM


def mixtral():
    cfg = transformers.MixtralConfig(vocab_size=320, hidden_size=128, intermediate_size=160, num_local_experts=4,
                                     num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=256)
    return cfg, transformers.MixtralForCausalLM


def glm4_moe_lite():
    """GLM-4.7-Flash's architecture: MLA attention (low-rank q and kv), a dense first layer, routed + shared experts."""
    cfg = transformers.Glm4MoeLiteConfig(vocab_size=320, hidden_size=128, intermediate_size=256, moe_intermediate_size=96,
                                         num_hidden_layers=2, mlp_layer_types=["dense", "sparse"], n_routed_experts=8,
                                         num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=4,
                                         q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                         v_head_dim=32, max_position_embeddings=256)
    return cfg, transformers.Glm4MoeLiteForCausalLM


def qwen3_next():
    """Qwen3-Next / Qwen3-Coder-Next: gated DeltaNet + full attention layers, routed + gated shared expert."""
    cfg = transformers.Qwen3NextConfig(vocab_size=320, hidden_size=128, intermediate_size=256, moe_intermediate_size=96,
                                       shared_expert_intermediate_size=96, num_hidden_layers=4, num_experts=8,
                                       num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                                       linear_value_head_dim=32, max_position_embeddings=256)
    return cfg, transformers.Qwen3NextForCausalLM


MODELS = {"llama": llama, "qwen3_moe": qwen3_moe, "mixtral": mixtral, "glm4_moe_lite": glm4_moe_lite,
          "qwen3_next": qwen3_next}


def build(name: str, seed: int, dtype=torch.float32, device="cpu", **kw):
    cfg, cls = MODELS[name](**kw)
    torch.manual_seed(seed)
    model = cls(cfg).to(dtype=dtype, device=device).eval()
    return model


def reference_copy(quantized, original):
    """``original`` with every quantized layer's weight replaced by the reference dequantization."""
    import lowbit

    for name, mod in quantized.named_modules():
        if isinstance(mod, lowbit.nn.KbitLinearPart):  # its rows of the fused weight
            f, lin = mod.fused, original.get_submodule(name)
            w = f.dequantize(torch.float32)[f.offsets[mod.index]:f.offsets[mod.index] + mod.out_features]
            lin.weight.data = w.to(lin.weight.device, lin.weight.dtype)
        elif (isinstance(mod, (lowbit.nn.KbitLinear, lowbit.nn.NvFp4Linear))
              and not isinstance(mod, lowbit.nn.FusedParts)):
            lin = original.get_submodule(name)
            lin.weight.data = mod.dequantize(torch.float32).to(lin.weight.device, lin.weight.dtype)
        elif isinstance(mod, lowbit.nn.KbitMoeExperts):
            ex = original.get_submodule(name)
            gu, dn = mod.dequantize(torch.float32)
            ex.gate_up_proj.data = gu.to(ex.gate_up_proj.device, ex.gate_up_proj.dtype)
            ex.down_proj.data = dn.to(ex.down_proj.device, ex.down_proj.dtype)
    return original


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    assert torch.isfinite(a).all(), "NaN/Inf in the result"
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class RoutingRecorder:
    """Records the experts every MoE router picks (transformers' *Router modules return (logits, weights,
    indices)), so a test can tell a routing flip -- a near-tie decided differently by rounding, legitimate
    in any precision -- from a wrong result. Use as a context manager around one forward."""

    def __init__(self, model):
        self.model, self.picks, self._hooks = model, [], []

    def __enter__(self):
        self.picks.clear()
        for mod in self.model.modules():
            if type(mod).__name__.lower().endswith("router"):
                self._hooks.append(mod.register_forward_hook(
                    lambda m, i, out: self.picks.append(out[2].detach().sort(-1).values.cpu())))
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def flipped_rows(a: RoutingRecorder, b: RoutingRecorder, batch: int) -> set[int]:
    """Batch rows in which some token was routed to different experts by ``a`` and ``b`` (a flip changes that
    token and, through attention in later layers, the rest of its sequence)."""
    assert len(a.picks) == len(b.picks), "the two models ran different numbers of routers"
    rows = set()
    for x, y in zip(a.picks, b.picks):
        tokens = (x != y).any(-1).nonzero().flatten()
        rows.update((tokens // (x.shape[0] // batch)).tolist())
    return rows


def decode_logits(model, ids, steps, compiled: bool = False) -> torch.Tensor:
    """The logits of each decode step (``steps [n, batch, 1]`` tokens) after a prefill of ``ids [batch, prompt]``,
    through a static cache as greedy_decode runs them; ``compiled``: the steps through ``torch.compile``."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=16)
    fwd = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model
    out = []
    b, p = ids.shape
    with torch.no_grad():
        model(ids, past_key_values=cache, position_ids=torch.arange(p, device=ids.device).expand(b, -1), use_cache=True)
        for i, tok in enumerate(steps):
            pos = torch.full((b, 1), p + i, device=ids.device)
            out.append(fwd(tok, past_key_values=cache, position_ids=pos, use_cache=True).logits)
    return torch.cat(out, 1).float()
