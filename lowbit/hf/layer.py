"""The decode step of a Llama-pattern decoder layer in lowbit's kernels only.

With :func:`lowbit.hf.attention.use_fused_decode_attention` a layer's decode step is eight kernels:
input RMSNorm, q|k|v GEMV, attention (rotary embedding + cache append), o GEMV, RMSNorm, gate|up GEMV,
SiLU-mul, down GEMV. Three of them (the norms, SiLU-mul) and the two residual adds were torch.compile's
Triton kernels, which under programmatic dependent launch trigger the next kernel only after their last
load: the q|k|v, gate|up and down GEMVs could not start loading weights early. Here those three are
lowbit's (:func:`lowbit.ops.rms_norm`, :func:`lowbit.ops.silu_mul`: they trigger right after their wait)
and the residual adds happen in the o and down GEMVs' epilogues (:func:`lowbit.nn.linear_residual`), so
every kernel of the layer starts while its predecessor runs. The arithmetic is transformers' except for
the residual adds, rounded once instead of twice (GEMV output, then the sum).

:func:`use_fused_decode_layers` switches the layers of :data:`FUSED_LAYER_CLASSES`; a call is taken only
when it is a decode step the attention layer takes too, the norms are RMSNorms of the activations' dtype,
the MLP is a SiLU-gated one whose gate and up projections are one fused lowbit module (``quantize_model``'s
default), and no module involved has hooks (tensor parallelism's sums, offloading); every other call runs
the layer's own forward.
"""

from __future__ import annotations

from torch import nn

#: decoder-layer classes whose forward is Llama's (pre-norm attention and gated MLP, residual adds)
FUSED_LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")

#: take decode steps through lowbit's kernels (False: the layer's own forward; benchmarks compare the two)
DECODE_LAYER = True
#: the norms and SiLU-mul trigger the GEMV after them at entry, so that it starts during the previous GEMV's
#: tail (each is followed by one of lowbit's GEMVs here, which wait before reading anything but weights)
EARLY_TRIGGER = True

_layer_classes: dict[type, type] = {}


def _rms_norm_eps(norm, dtype) -> float | None:
    """The epsilon of a transformers RMSNorm that computes LlamaRMSNorm's arithmetic with a weight of the
    activations' dtype, else None."""
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", None)
    if (not type(norm).__name__.endswith("RMSNorm") or type(norm).__name__.startswith("Gemma")
            or not isinstance(w, nn.Parameter) or w.dim() != 1 or w.dtype != dtype or not isinstance(eps, float)):
        return None
    return eps


def _is_silu(act) -> bool:
    """torch's SiLU module or transformers' (``ACT2FN["silu"]``, ``"swish"``)."""
    return isinstance(act, nn.SiLU) or (type(act).__name__ == "SiLUActivation"
                                         and type(act).__module__.startswith("transformers."))


def _gate_up(mlp):
    """The fused gate|up module of a SiLU-gated MLP (gate first, up second, equal widths), else None."""
    from ..nn import FusedParts, LinearPart

    gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
    if not (isinstance(gate, LinearPart) and isinstance(up, LinearPart) and _is_silu(getattr(mlp, "act_fn", None))
            and hasattr(mlp, "down_proj")):
        return None
    fused = gate.fused
    if (up.fused is not fused or not isinstance(fused, FusedParts) or (gate.index, up.index) != (0, 1)
            or len(fused.out_sizes) != 2 or fused.out_sizes[0] != fused.out_sizes[1]):
        return None
    return fused


def _layer_step(self, hidden_states, attention_mask, past_key_values, position_embeddings, kwargs):
    """The layer's decode step in lowbit's kernels, or None when this call is not one it takes."""
    from ..nn import linear_residual, plain_call
    from ..ops import GEMV_MAX_M, rms_norm, silu_mul
    from .attention import fused_plan, fused_run, is_fused_attention

    if (not DECODE_LAYER or self.training or not hidden_states.is_cuda or hidden_states.dim() != 3
            or hidden_states.shape[1] != 1 or hidden_states.shape[0] > GEMV_MAX_M):
        return None
    attn, mlp = self.self_attn, self.mlp
    eps1 = _rms_norm_eps(self.input_layernorm, hidden_states.dtype)
    eps2 = _rms_norm_eps(self.post_attention_layernorm, hidden_states.dtype)
    gate_up = _gate_up(mlp)
    if eps1 is None or eps2 is None or gate_up is None or not is_fused_attention(attn):
        return None
    if not all(plain_call(m) for m in (self.input_layernorm, self.post_attention_layernorm, attn, mlp, gate_up,
                                       mlp.gate_proj, mlp.up_proj)):
        return None
    plan = fused_plan(attn, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs)
    if plan is None:
        return None
    early = EARLY_TRIGGER
    x = rms_norm(hidden_states, self.input_layernorm.weight, eps1, early)
    h = fused_run(attn, x, plan, residual=hidden_states)
    x = rms_norm(h, self.post_attention_layernorm.weight, eps2, early)
    return linear_residual(mlp.down_proj, silu_mul(gate_up(x), early), h)


def _layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                   position_embeddings=None, **kwargs):
    out = _layer_step(self, hidden_states, attention_mask, past_key_values, position_embeddings, kwargs)
    if out is None:
        return super(type(self), self).forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                               past_key_values=past_key_values, use_cache=use_cache,
                                               position_embeddings=position_embeddings, **kwargs)
    return out


def use_fused_decode_layers(model) -> int:
    """Give every decoder layer of ``model`` listed in :data:`FUSED_LAYER_CLASSES` a subclass whose decode step
    runs in lowbit's kernels (the module docstring says when); every other call runs the layer's own forward.
    Parameters and state dict names stay; returns how many layers it switched."""
    n = 0
    for mod in model.modules():
        cls = type(mod)
        if (cls.__name__ in FUSED_LAYER_CLASSES and cls.__module__.startswith("transformers.")
                and cls not in _layer_classes.values()):
            if cls not in _layer_classes:
                _layer_classes[cls] = type(f"LowbitFused{cls.__name__}", (cls,), {"forward": _layer_forward,
                                                                                   "__module__": __name__})
            mod.__class__ = _layer_classes[cls]
            n += 1
    return n
