"""A decode step's glue inside lowbit's GEMVs, for Llama-pattern decoder layers.

transformers' decoder layer runs, per token::

    h2 = h + o_proj(attention(input_norm(h)))
    h3 = h2 + down_proj(act(gate_proj(post_norm(h2))) * up_proj(post_norm(h2)))

With kbit or NVFP4 projections each line is a chain of kernels: the GEMVs, and between them the RMSNorms
(each fused by inductor with the residual add before it) and the activation. :func:`use_fused_decode_layers`
gives such a layer a subclass whose decode step moves the adds and the norms into the GEMVs' outputs
(:func:`lowbit.ops.kbit_gemv_epilogue`, :func:`lowbit.ops.nvfp4_gemv_epilogue`), using
``W (h * rstd * w) = rstd * W (h * w)``:

* ``o_proj`` adds the residual ``h`` and also writes ``h2 * post_norm.weight``;
* the gate|up GEMV reads that and scales its output rows by the norm's ``rstd = rsqrt(mean(h2^2) + eps)``,
  which each of its CTAs computes from ``h2``; when gate|up is one fused ``[gate; up]`` module and the activation
  SiLU, that GEMV also writes ``silu(gate) * up`` instead of gate|up (its CTAs own gate and up tiles in pairs);
* ``down_proj`` adds the residual ``h2`` and, when the next layer takes it, also writes
  ``h3 * next.input_norm.weight``; the next layer's q|k|v GEMV reads that and applies its input norm's factor
  the same way (layer 0 runs its input norm as a kernel).

Per layer the step is then q|k|v, attention (lowbit's fused op), o_proj, gate|up with the activation,
down_proj: five kernels, no norm or activation kernels, each a lowbit kernel that starts under its predecessor
(programmatic launch). The rounding differs from transformers' in where it happens, not in how much: one
rounding of each residual instead of two, the norm's factor applied in fp32 to the product instead of to its input
(``tests/test_layers.py`` bounds the logits against the model's own layers).

It takes the decode step only: one token per sequence, at most 8 sequences, the layer's attention through
:func:`lowbit.hf.attention.use_fused_decode_attention`, unrotated kbit or NVFP4 projections (NVFP4: through its
tiled GEMV, also where its checkpoint-layout GEMV would take the call) on a GPU, the model's plain
RMSNorm, and no forward hooks or instance-level forwards on the modules it would not call (offloading,
profilers). Every other call runs the layer's own forward.

Under tensor parallelism (:mod:`lowbit.hf.tp`: q|k|v and gate|up split by rows, o_proj and down_proj by columns)
each rank runs the same step on its parts, with two differences: the residual goes into rank 0's o_proj and
down_proj outputs only, and each of those partial outputs is summed over the ranks
(:func:`lowbit.hf.tp.all_reduce`) before the norm weight multiplies it. The input norm's factor and the SwiGLU
product stay in the column splits' GEMVs (their input is whole on every rank).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import dispatch
from ..nn.base import hooked, is_plain_silu
from .attention import _PLAIN_RMS_NORMS, _fused_step

#: decoder layers whose forward is Llama's (pre-norm attention and gated MLP, two residual adds)
LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")
#: MLPs whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``
MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")

#: take decode steps through the fused layer (False: the layer's own forward; comparisons)
FUSED = True
#: run the fused step on CPU too, through the op's reference (tests: the same code path without a GPU)
CPU_REFERENCE = False
#: a fused [gate; up] module with SiLU computes ``silu(gate) * up`` in its GEMV's output (the op's ``swiglu``; False:
#: the GEMV writes gate|up and the product is a kernel of its own; comparisons)
SWIGLU = True

_fused_classes: dict[type, type] = {}


def _is_transformers(mod, names) -> bool:
    cls = type(mod)
    return any(c.__name__ in names and c.__module__.startswith("transformers.") for c in cls.__mro__)


def _norm_eps(norm) -> float | None:
    """The epsilon of transformers' plain RMSNorm (its forward not overridden, a 1-D weight), else None."""
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", None)
    if not (_is_transformers(norm, _PLAIN_RMS_NORMS) and type(norm).forward.__qualname__.split(".")[0] in _PLAIN_RMS_NORMS
            and isinstance(w, torch.Tensor) and w.dim() == 1 and isinstance(eps, float)):
        return None
    return eps


def _group(mods):
    """Projections that read one x: ``(fused module, [(start, end) columns of each])`` when they are parts of one
    fused module, ``(modules, None)`` when each is a module of its own, None when some are parts and some not."""
    from ..nn.fused import LinearPart

    if any(m is None for m in mods):
        return None
    if all(isinstance(m, LinearPart) for m in mods) and all(m.fused is mods[0].fused for m in mods):
        f = mods[0].fused
        return f, [(f.offsets[p.index], f.offsets[p.index] + f.out_sizes[p.index]) for p in mods]
    if any(isinstance(m, LinearPart) for m in mods):
        return None
    return list(mods), None


def _widths(group) -> list[int]:
    mods, cols = group
    return [e - s for s, e in cols] if cols is not None else [m.out_features for m in mods]


def _launches(group) -> list:
    return [group[0]] if group[1] is not None else group[0]


def _project(group, x, rms_x, eps) -> list:
    """Each projection of the group of ``x``, with the norm's factor of ``rms_x`` (one launch when fused)."""
    op = dispatch.gemv_epilogue_op
    mods, cols = group
    if cols is not None:
        y, _ = op(mods, x, rms_x=rms_x, eps=eps)
        return [y[:, s:e] for s, e in cols]
    return [op(m, x, rms_x=rms_x, eps=eps)[0] for m in mods]


def _gated(group, mlp, x, rms_x, eps) -> torch.Tensor:
    """``act_fn(gate) * up`` of the gate|up group (the norm's factor of ``rms_x`` in the GEMV): one launch with the
    SwiGLU epilogue where the group is one fused ``[gate; up]`` module and the activation SiLU, else the
    projections and then the product."""
    mods, cols = group
    act = mlp.act_fn
    if (SWIGLU and cols is not None and is_plain_silu(act)
            and cols == [(0, cols[0][1]), (cols[0][1], mods.out_features)] and 2 * cols[0][1] == mods.out_features):
        return dispatch.gemv_epilogue_op(mods, x, rms_x=rms_x, eps=eps, swiglu=True)[0]
    gate, up = _project(group, x, rms_x, eps)
    return (act(gate) * up).contiguous()


def _takes(mod, rows: int, like: torch.Tensor, k: int) -> bool:
    return dispatch.epilogue_ok(mod, rows, k, like.dtype, like.device, reference=CPU_REFERENCE)


def _norm_ok(norm, eps, like) -> bool:
    w = getattr(norm, "weight", None) if eps is not None else None
    return w is not None and w.dtype == like.dtype and w.shape[0] == like.shape[-1]


def _sharded(mod):
    """How tensor parallelism split ``mod`` (:class:`lowbit.hf.tp.LocalSplit`) while the forward its style installed
    is the only wrapping it has; None for a module nobody split; False for one wrapped in any other way."""
    info = getattr(mod, "_lowbit_tp_local", None)
    if info is None:
        return None
    if mod._forward_hooks or mod._forward_pre_hooks or mod.__dict__.get("forward") is not info.forward:
        return False
    return info


def _unwrapped(*mods) -> bool:
    """Whether the fused step may stand in for calling each of ``mods``: no hooks or forward of its own, or only the
    tensor-parallel wrapping :func:`_tp_plan` checks (separate projections under TP are called through it)."""
    return all(not hooked(m) or _sharded(m) for m in mods)


def _tp_plan(col: list, row: list):
    """Whether the fused step can stand in for tensor parallelism's wrapping of a layer's column-split (``col``) and
    row-split (``row``) projections: None where none of them is split (one device), False where it cannot (only some
    split, other styles or wrappings, a row split with a bias, transformers' own ``dtensor`` all-reduce), else the
    split of the first of them (its group and this rank). A column split's forward on local tensors is the module's
    own; a row split's adds the partial outputs of the ranks, which the fused step then does itself."""
    infos = [_sharded(m) for m in (*col, *row)]
    if all(i is None for i in infos):
        return None
    if not all(infos):
        return False
    from .tp import allreduce_kind

    if (allreduce_kind() == "dtensor" or any(i.style != "colwise" for i in infos[:len(col)])
            or any(i.style != "rowwise" for i in infos[len(col):]) or any(m.bias is not None for m in row)):
        return False
    return infos[0]


def _plan(self, hidden_states):
    """What the fused step needs from this layer for this call (the post-attention norm's eps, the gate|up group,
    the q|k|v group or None where the input norm cannot go into its GEMV, the tensor-parallel split or None), or None
    when it does not take it."""
    if not FUSED or self.training or hidden_states.dim() != 3 or hidden_states.shape[1] != 1:
        return None
    attn, mlp, eps = getattr(self, "self_attn", None), getattr(self, "mlp", None), self._lowbit_post_eps
    if getattr(attn, "_lowbit_qk_norm", None) is None or not self._lowbit_plain_mlp:
        return None  # the attention layer is not lowbit's fused one, or the MLP not the plain gated one
    b, d = hidden_states.shape[0], hidden_states.shape[2]
    if not _norm_ok(self.post_attention_layernorm, eps, hidden_states):
        return None
    gu = _group([getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)])
    o, down = getattr(attn, "o_proj", None), getattr(mlp, "down_proj", None)
    if gu is None or o is None or down is None or not all(
            map(dispatch.has_epilogue_gemv, (o, down, *_launches(gu)))):
        return None  # a projection the epilogue GEMV cannot run (another library's, a user's wrapper)
    inter = _widths(gu)
    tp = _tp_plan([mlp.gate_proj, mlp.up_proj], [o, down])
    if tp is False or not _unwrapped(attn, mlp, self.post_attention_layernorm, o, down, mlp.gate_proj, mlp.up_proj,
                                     *_launches(gu)):
        return None
    if not (_takes(o, b, hidden_states, o.in_features) and o.out_features == d
            and all(_takes(m, b, hidden_states, d) for m in _launches(gu))
            and inter[0] == inter[1] and _takes(down, b, hidden_states, inter[0]) and down.out_features == d):
        return None
    qkv = _group([getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")])
    if qkv is not None:
        qkv_tp = _tp_plan([attn.q_proj, attn.k_proj, attn.v_proj], [])
        if (qkv_tp is False or (qkv_tp is None) != (tp is None)
                or not _norm_ok(self.input_layernorm, self._lowbit_in_eps, hidden_states)
                or not all(_takes(m, b, hidden_states, d) for m in _launches(qkv))
                or hooked(self.input_layernorm)
                or not _unwrapped(attn.q_proj, attn.k_proj, attn.v_proj, *_launches(qkv))):
            qkv = None
    return eps, gu, qkv, tp


def _row_sum(y: torch.Tensor, tp) -> torch.Tensor:
    """A row split's output summed over its ranks (the all-reduce kind :func:`lowbit.hf.tp.set_allreduce` chose)."""
    from .tp import all_reduce

    return all_reduce(y, tp.group)


def _fused_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                   position_embeddings=None, **kwargs):
    # what the layer before left for this one: (its output, that output 2-D, output * this input norm's weight)
    stash, self._lowbit_in = self._lowbit_in, None
    plan = _plan(self, hidden_states)
    if plan is None:
        return super(type(self), self).forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                               past_key_values=past_key_values, use_cache=use_cache,
                                               position_embeddings=position_embeddings, **kwargs)
    eps, gate_up, qkv, tp = plan
    attn, mlp, post = self.self_attn, self.mlp, self.post_attention_layernorm
    b, d = hidden_states.shape[0], hidden_states.shape[2]
    step_kwargs = {"position_ids": position_ids, "use_cache": use_cache, **kwargs}
    if qkv is not None and stash is not None and stash[0] is hidden_states:
        # the input norm in the q|k|v GEMV: x = h * weight (written by the last GEMV), its factor from h
        x, project = hidden_states, lambda: _project(qkv, stash[2], stash[1], self._lowbit_in_eps)
    else:
        x, project = self.input_layernorm(hidden_states), None
    a = _fused_step(attn, x, position_embeddings, attention_mask, past_key_values, step_kwargs, project=False, qkv=project)
    if a is None:  # the attention op does not take this call: the layer's own computation from here
        x = self.input_layernorm(hidden_states) if project is not None else x
        a, _ = attn(hidden_states=x, attention_mask=attention_mask, position_ids=position_ids,
                    past_key_values=past_key_values, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        h2 = hidden_states + a
        return h2 + mlp(post(h2))
    h = hidden_states.reshape(b, d).contiguous()
    op = dispatch.gemv_epilogue_op
    nxt = self._lowbit_next
    nxt_plan = _plan(nxt, hidden_states) if nxt is not None else None
    nw = nxt.input_layernorm.weight if nxt_plan is not None and nxt_plan[2] is not None else None
    if tp is None:
        # o_proj + the residual add; hw = h2 * the post-attention norm's weight, the gate|up GEMV's x
        h2, hw = op(attn.o_proj, a.reshape(b, -1).contiguous(), residual=h, norm_weight=post.weight)
        act = _gated(gate_up, mlp, hw, h2, eps)  # the norm's factor from h2, in the output
        # down_proj + the residual add; and the next layer's x when it takes its input norm the same way
        h3, h3w = op(mlp.down_proj, act, residual=h2, norm_weight=nw)
    else:
        # Tensor parallel: this rank's heads and intermediate features. A row split's output is a partial sum, so
        # the residual goes into rank 0's part only and the norm weight's product follows the all-reduce.
        first = tp.rank == 0
        h2 = _row_sum(op(attn.o_proj, a.reshape(b, -1).contiguous(), residual=h if first else None)[0], tp)
        act = _gated(gate_up, mlp, h2 * post.weight, h2, eps)
        h3 = _row_sum(op(mlp.down_proj, act, residual=h2 if first else None)[0], tp)
        h3w = h3 * nw if nw is not None else None
    out = h3.view(b, 1, d)
    if nw is not None:
        nxt._lowbit_in = (out, h3, h3w)
    return out


def use_fused_decode_layers(model) -> int:
    """Give every decoder layer of ``model`` listed in :data:`LAYERS` a subclass whose decode step runs the
    residual adds and the RMSNorms inside its kbit or NVFP4 GEMVs (module docstring); every other call
    runs the layer's own forward. Needs the layers' attention switched by
    :func:`lowbit.hf.attention.use_fused_decode_attention` (else nothing changes at run time). Parameters and
    state dict names stay; NVFP4 projections get their tiled layout (kept beside the checkpoint layout, as their
    first tiled call would); returns how many layers it switched."""
    n = 0
    for mod in model.modules():
        cls = type(mod)
        if cls.__name__ in LAYERS and cls.__module__.startswith("transformers.") and cls not in _fused_classes.values():
            if cls not in _fused_classes:
                _fused_classes[cls] = type(f"LowbitFused{cls.__name__}", (cls,), {"forward": _fused_forward,
                                                                                 "__module__": __name__})
            mod.__class__ = _fused_classes[cls]
            # what does not change between calls, decided here (dynamo does not trace class introspection)
            mod._lowbit_post_eps = _norm_eps(getattr(mod, "post_attention_layernorm", None))
            mod._lowbit_in_eps = _norm_eps(getattr(mod, "input_layernorm", None))
            mod._lowbit_plain_mlp = _is_transformers(getattr(mod, "mlp", None), MLPS)
            mod._lowbit_in = None
            # NVFP4 projections decode through their tiled layout here (the epilogue GEMV), which a prefill through
            # dequantize-and-matmul never builds: built now, so that a compiled step does not trace the packing
            # and then recompile once it exists (Llama-3-8B: a 3-minute first compile)
            for m in mod.modules():
                if getattr(m, "format_name", None) == "nvfp4" and hasattr(m, "nvfp4_weight"):
                    m.nvfp4_weight().tiled()
            n += 1
    # each switched layer's successor in its model's layer list (a plain attribute, not a child module)
    for lst in model.modules():
        if isinstance(lst, nn.ModuleList):
            layers = list(lst)
            for i, mod in enumerate(layers):
                if type(mod) in _fused_classes.values():
                    nxt = layers[i + 1] if i + 1 < len(layers) else None
                    mod.__dict__["_lowbit_next"] = nxt if type(nxt) in _fused_classes.values() else None
    return n
