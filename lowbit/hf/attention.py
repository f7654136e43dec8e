"""Decode attention for transformers models: SDPA with grouped K/V heads read in place.

transformers' SDPA path copies K and V to every query head (``repeat_kv``) whenever an attention
mask is present -- always so with a static cache -- because older torch fell back to the math kernel
for masked GQA. torch >= 2.5 takes ``enable_gqa=True`` with a mask; on the H100 that halves a
Llama-3-8B decode attention call (28.2 -> 13.9 us per layer at a 590-token cache,
``benchmarks/tools/attn_decode_bench.py``). ``use_gqa_sdpa(model)`` switches a model that runs
"sdpa" to this function; every other case goes to transformers' own SDPA function unchanged.
"""

from __future__ import annotations

import torch

NAME = "lowbit_sdpa"


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                       is_causal=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = (groups <= 1 or kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False)
             or query.device.type != "cuda" or key.shape[-1] != value.shape[-1] or key.shape[-1] > 256)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, is_causal=is_causal, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_gqa_sdpa(model) -> bool:
    """Switch ``model`` (and its sub-configs) from "sdpa" to :func:`sdpa_gqa_attention`; True if it did."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # a transformers without attention/mask registries: keep its own attention
        return False

    AttentionInterface.register(NAME, sdpa_gqa_attention)
    # the mask must be SDPA's: transformers builds none for an attention name it has no mask function for
    # (padding and the unfilled static-cache slots would be attended)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(NAME)
    return True
