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


def _fused_step(self, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs, project: bool = True,
                qkv=None):
    """The decode step through :func:`lowbit.ops.decode_attention_append`, or None when this call is not
    one it takes (prefill, a cache other than a filled static layer, extra attention arguments, ...).
    ``project=False``: the attention output before ``o_proj`` (``[B, 1, heads * head_dim]``; the fused decoder
    layer projects it with the residual add, :mod:`lowbit.hf.layers`); ``qkv``: a callable giving the q, k and v
    projections ``[B, n]`` of this step instead of the layer's own projections of ``hidden_states`` (the fused layer's,
    with the input norm in the GEMV), called only once the step is taken."""
    from transformers.cache_utils import StaticLayer

    from ..kernels import attention as kattn
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
    if qkv is not None:
        q, k, v = qkv()
    else:
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
    q, k, v = q.view(b, heads, d), k.view(b, kv_heads, d), v.view(b, kv_heads, d)
    norms = {}
    if self._lowbit_qk_norm:
        eps = getattr(self, "_lowbit_norm_eps", None)  # set by use_fused_decode_attention
        if (not QK_NORM_IN_KERNEL or eps is None or self.q_norm.weight.dtype != q.dtype
                or self.k_norm.weight.dtype != q.dtype):
            # not transformers' plain RMSNorm (or weights in another dtype): its own forward, before the op
            q, k = self.q_norm(q), self.k_norm(k)
        else:  # the op normalizes each head in registers (two small kernels per layer less)
            norms = {"q_norm": self.q_norm.weight, "k_norm": self.k_norm.weight, "norm_eps": eps}
    # cos, sin and the mask go in as the model made them, once for every layer; the op advances the layer's
    # length as StaticLayer.update does
    # the kernel before this op is the q|k|v projection, which writes neither the cache nor its length: the op may
    # read them before waiting for it
    out = decode_attention_append(q, k, v, cos, sin, keys, values, layer.cumulative_length, mask, float(self.scaling),
                                  kattn.EARLY_KV, **norms)
    return self.o_proj(out.view(b, 1, -1)) if project else out.view(b, 1, -1)


#: Qwen3's per-head q/k RMSNorms run inside the fused decode op (False: as the model's own modules before it;
#: comparisons)
QK_NORM_IN_KERNEL = True


def _rms_norm_eps(q_norm, k_norm) -> float | None:
    """The shared epsilon when both norms are transformers' plain RMSNorm (weight * normalized, statistics in fp32:
    Llama's / Qwen3's class, forward not overridden), else None."""
    for m in (q_norm, k_norm):
        if not (type(m).__module__.startswith("transformers.")
                and type(m).forward.__qualname__.split(".")[0] in _PLAIN_RMS_NORMS
                and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 1
                and isinstance(getattr(m, "variance_epsilon", None), float)):
            return None
    if q_norm.variance_epsilon != k_norm.variance_epsilon or q_norm.weight.shape != k_norm.weight.shape:
        return None
    return float(q_norm.variance_epsilon)


#: RMSNorm classes whose forward is ``weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)`` in fp32 statistics
_PLAIN_RMS_NORMS = {"Qwen3RMSNorm", "Qwen3MoeRMSNorm", "LlamaRMSNorm"}


def _fused_forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
    out = _fused_step(self, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs)
    if out is None:
        return super(type(self), self).forward(hidden_states, position_embeddings=position_embeddings,
                                               attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)
    return out, None


def use_fused_decode_attention(model) -> int:
    """Give every attention layer of ``model`` listed in :data:`FUSED_CLASSES` a subclass whose decode step
    (one token, a filled static cache, lowbit's attention function) runs the rotary embedding, the cache
    append and attention as one op; every other call runs the layer's own forward. Parameters and state
    dict names stay; returns how many layers it switched."""
    n = 0
    for mod in model.modules():
        cls = type(mod)
        if cls.__name__ in FUSED_CLASSES and cls.__module__.startswith("transformers.") and cls not in _fused_classes.values():
            if cls not in _fused_classes:
                _fused_classes[cls] = type(f"LowbitFused{cls.__name__}", (cls,), {
                    "forward": _fused_forward, "_lowbit_qk_norm": FUSED_CLASSES[cls.__name__], "__module__": __name__})
            mod.__class__ = _fused_classes[cls]
            if FUSED_CLASSES[cls.__name__]:
                mod._lowbit_norm_eps = _rms_norm_eps(mod.q_norm, mod.k_norm)
            n += 1
    return n
