"""Decode attention for transformers models: lowbit's decode kernel for one query token, else SDPA with
grouped K/V heads read in place; for Llama-pattern attention layers, the decode step's rotary embedding,
KV-cache append and attention in one kernel (:func:`use_fused_decode_attention`).

A decode step (one query token per sequence, a plain boolean mask, no dropout, softcapping or sinks)
runs :func:`lowbit.ops.decode_attention` (csrc/attention/decode.cu): one kernel instead of cuDNN's two,
and one that lets the output projection's GEMV start early (programmatic launch). Everything else goes
to SDPA:

transformers' SDPA path copies K and V to every query head (``repeat_kv``) whenever an attention
mask is present -- always so with a static cache -- because older torch fell back to the math kernel
for masked GQA. torch >= 2.5 takes ``enable_gqa=True`` with a mask; on the H100 that halves a
Llama-3-8B decode attention call (28.2 -> 13.9 us per layer at a 590-token cache,
``benchmarks/tools/attn_decode_bench.py``). ``use_gqa_sdpa(model)`` switches a model that runs
"sdpa" to this function; every other case goes to transformers' own SDPA function unchanged.
"""

from __future__ import annotations

import os

import torch

NAME = "lowbit_sdpa"


#: take decode steps through lowbit's kernel (False: always torch's SDPA; benchmarks compare the two)
DECODE_KERNEL = True

#: attention arguments that change the softmax beyond a mask and a scale: such calls keep torch's SDPA
_SDPA_ONLY = ("position_bias", "softcap", "s_aux", "sinks")


def decode_mask(attention_mask, batch: int, length: int):
    """A transformers SDPA mask for one query token as lowbit's decode attention takes it: ``[B, L]`` bool
    (a view), None for no mask, or False when it is not a plain boolean mask of that shape."""
    if attention_mask is None:
        return None
    if attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or attention_mask.shape[-1] != length:
        return False
    if attention_mask.shape[1] != 1 or attention_mask.shape[2] != 1 or attention_mask.stride(-1) != 1:
        return False
    return attention_mask[:, 0, 0, :].expand(batch, length)


def lowbit_decode_attention(query, key, value, attention_mask, scaling):
    """One decode step's attention through :func:`lowbit.ops.decode_attention` (the output in
    transformers' ``[B, 1, Hq, D]`` layout), or None when the call is not one it takes."""
    from ..kernels.attention import supported
    from ..ops import decode_attention

    b, hq, q_len, d = query.shape
    if q_len != 1 or key.dim() != 4 or key.shape[0] != b or hq % key.shape[1] or not supported(query[:, :, 0], key):
        return None
    if key.stride(-1) != 1 or key.stride(-2) != d or value.stride(-1) != 1 or value.stride(-2) != d or value.shape != key.shape:
        return None
    mask = decode_mask(attention_mask, b, key.shape[2])
    if mask is False:
        return None
    scale = float(scaling) if scaling is not None else d ** -0.5
    out = decode_attention(query.reshape(b, hq, d).contiguous(), key, value, mask, scale)
    return out.view(b, 1, hq, d)


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                       is_causal=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (DECODE_KERNEL and query.device.type == "cuda" and query.shape[2] == 1 and not (dropout and module.training)
            and not any(kwargs.get(k) is not None for k in _SDPA_ONLY) and not kwargs.get("output_attentions", False)):
        out = lowbit_decode_attention(query, key, value, attention_mask, scaling)
        if out is not None:
            return out, None
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


# ---- the whole attention core of a decode step in one op (rotary embedding, cache append, attention)

#: attention classes whose forward is Llama's -- q/k/v projections, (optional per-head q and k RMSNorm),
#: rotate-half RoPE with the model's (cos, sin), a cache update, attention, o_proj -- and whether they
#: norm q and k per head
FUSED_CLASSES = {"LlamaAttention": False, "MistralAttention": False, "Qwen2Attention": False,
                 "Qwen3Attention": True, "Qwen3MoeAttention": True}

_fused_classes: dict[type, type] = {}


def _fused_step(self, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs):
    """The decode step through :func:`lowbit.ops.decode_attention_append`, or None when this call is not
    one it takes (prefill, a cache other than a filled static layer, extra attention arguments, ...)."""
    from transformers.cache_utils import StaticLayer

    from ..kernels.attention import supported_shape
    from ..ops import decode_attention_append

    if (not DECODE_KERNEL or self.training or hidden_states.dim() != 3 or hidden_states.shape[1] != 1
            or getattr(self.config, "_attn_implementation", None) != NAME or position_embeddings is None
            or past_key_values is None or kwargs.get("output_attentions", False)
            or any(kwargs.get(k) is not None for k in _SDPA_ONLY)):
        return None
    layers = getattr(past_key_values, "layers", None)
    if layers is None or self.layer_idx >= len(layers):
        return None
    layer = layers[self.layer_idx]
    if type(layer) is not StaticLayer or not layer.is_initialized:
        return None
    b, d = hidden_states.shape[0], self.head_dim
    cos, sin = position_embeddings
    keys, values = layer.keys, layer.values
    if (cos.shape != (b, 1, d) or sin.shape != (b, 1, d) or keys.dim() != 4 or keys.shape[0] != b
            or keys.shape[-1] != d or hidden_states.dtype != keys.dtype):
        return None
    # under tensor parallelism a rank holds heads / world query heads and the cache its K/V heads: the ratio
    # of the two is the model's
    kv_heads = keys.shape[1]
    group = self.config.num_attention_heads // (getattr(self.config, "num_key_value_heads", None)
                                                or self.config.num_attention_heads)
    heads = kv_heads * group
    if heads % kv_heads or (keys.is_cuda and not supported_shape(keys.dtype, heads, kv_heads, d)):
        return None
    if decode_mask(attention_mask, b, keys.shape[2]) is False:
        return None
    mask = attention_mask
    q = self.q_proj(hidden_states).view(b, heads, d)
    k = self.k_proj(hidden_states).view(b, kv_heads, d)
    v = self.v_proj(hidden_states).view(b, kv_heads, d)
    if self._lowbit_qk_norm:
        q, k = self.q_norm(q), self.k_norm(k)
    # cos, sin and the mask go in as the model made them, once for every layer; the op advances the layer's
    # length as StaticLayer.update does
    plan = getattr(self, "_lowbit_prefetch", ())
    prefetch = [getattr(mod, name) for mod, name, _ in plan] if keys.is_cuda else []
    nbytes = [n for _, _, n in plan] if prefetch else []
    out = decode_attention_append(q, k, v, cos, sin, keys, values, layer.cumulative_length, mask, float(self.scaling),
                                  prefetch, nbytes)
    return self.o_proj(out.view(b, 1, -1))


def _fused_forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
    out = _fused_step(self, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs)
    if out is None:
        return super(type(self), self).forward(hidden_states, position_embeddings=position_embeddings,
                                               attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)
    return out, None


#: L2 prefetch budget of a fused attention step, MB (None: ``$LOWBIT_L2_PREFETCH_MB``, else
#: :data:`DEFAULT_L2_PREFETCH_MB`); at most half the GPU's L2 is used; 0 turns it off
L2_PREFETCH_MB: float | None = None
DEFAULT_L2_PREFETCH_MB = 24.0

#: a module's tensors smaller than this are not worth a prefetch slot (codebooks, tensor scales)
_MIN_PREFETCH_TENSOR = 1 << 16


def l2_prefetch_budget(device: torch.device) -> int:
    """Bytes one fused attention step asks L2 for (see :data:`L2_PREFETCH_MB`)."""
    mb = L2_PREFETCH_MB
    if mb is None:
        env = os.environ.get("LOWBIT_L2_PREFETCH_MB")
        try:
            mb = float(env) if env else DEFAULT_L2_PREFETCH_MB
        except ValueError:
            raise ValueError(f"LOWBIT_L2_PREFETCH_MB must be a number of MB, got {env!r}") from None
    if mb < 0:
        raise ValueError(f"the L2 prefetch budget must be >= 0 MB, got {mb}")
    budget = int(mb * 2**20)
    if device.type == "cuda":
        budget = min(budget, torch.cuda.get_device_properties(device).L2_cache_size // 2)
    return budget


def _weights(mod) -> list[tuple[str, int]]:
    """(name, bytes) of a module's own large tensors (a quantized linear's codes and scales, a linear's
    weight), largest first."""
    out = [(name, t.numel() * t.element_size()) for name, t in [*mod.named_buffers(recurse=False),
                                                               *mod.named_parameters(recurse=False)]
           if t is not None and t.numel() * t.element_size() >= _MIN_PREFETCH_TENSOR]
    return sorted(out, key=lambda x: -x[1])


def _after_attention(layer) -> list:
    """The modules a decoder layer runs after attention, in order, whose weights do not depend on the token:
    the output projection, then the MLP's input projection(s) (one fused gate|up, or gate and up) unless the
    MLP routes tokens to experts."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    mods = [getattr(attn, "o_proj", None)]
    if mlp is not None and not hasattr(mlp, "experts"):
        fused = [m for name, m in mlp.named_children() if name.startswith("lowbit_fused_")]
        mods += fused or [getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)]
    return [m for m in mods if m is not None]


def plan_l2_prefetch(model, budget: int | None = None) -> int:
    """Give every fused attention layer of ``model`` its L2 prefetch list: ``budget`` bytes (default
    :func:`l2_prefetch_budget`) of the weights its decoder layer reads next -- the output projection first,
    then the MLP's input projection, each module's share spread over its tensors by size. The attention
    kernel leaves DRAM idle for ~9 us a layer; those projections then read part of their weights from L2.
    Returns the bytes planned per layer (the largest)."""
    from ..ops import MAX_PREFETCH

    most = 0
    for layer in model.modules():
        attn = getattr(layer, "self_attn", None)
        if attn is None or type(attn) not in _fused_classes.values():
            continue
        device = next(attn.parameters(), torch.empty(0)).device
        left = l2_prefetch_budget(device) if budget is None else budget
        plan = []
        for mod in _after_attention(layer):
            tensors = _weights(mod)
            total = sum(n for _, n in tensors)
            share = min(total, left)
            if share <= 0 or len(plan) + len(tensors) > MAX_PREFETCH:
                break
            plan += [(mod, name, share * n // total) for name, n in tensors]
            left -= share
        attn._lowbit_prefetch = tuple(plan)
        most = max(most, sum(n for _, _, n in plan))
    return most


def use_fused_decode_attention(model) -> int:
    """Give every attention layer of ``model`` listed in :data:`FUSED_CLASSES` a subclass whose decode step
    (one token, a filled static cache, lowbit's attention function) runs the rotary embedding, the cache
    append and attention as one op; every other call runs the layer's own forward. Parameters and state
    dict names stay; returns how many layers it switched. Each layer's step also prefetches the next
    projections' weights into L2 (:func:`plan_l2_prefetch`; planned again on every call)."""
    n = 0
    for mod in model.modules():
        cls = type(mod)
        if cls.__name__ in FUSED_CLASSES and cls.__module__.startswith("transformers.") and cls not in _fused_classes.values():
            if cls not in _fused_classes:
                _fused_classes[cls] = type(f"LowbitFused{cls.__name__}", (cls,), {
                    "forward": _fused_forward, "_lowbit_qk_norm": FUSED_CLASSES[cls.__name__], "__module__": __name__})
            mod.__class__ = _fused_classes[cls]
            n += 1
    plan_l2_prefetch(model)
    return n
