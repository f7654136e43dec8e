"""MoE routers of transformers models through :func:`lowbit.ops.moe_router` (one kernel at decode instead of
a GEMV, a softmax and torch.topk's two kernels).

transformers 5.x keeps a MoE block's router as its own module returning ``(router_logits, scores,
indices)``. The routers listed in :data:`ROUTERS` compute ``softmax(x W^T)``, its top-k and (always, or
when ``norm_topk_prob``) their renormalization; :func:`use_lowbit_router` gives each such module of a
model a subclass whose forward calls the op. Parameters, state dict names and ``isinstance`` stay as
they were, and the op's reference is the same computation, so CPU, prefill and unsupported shapes
compute what transformers does. (``tests/test_router.py`` checks every listed class that this
transformers has against its own forward.)
"""

from __future__ import annotations

import torch
from torch import nn

#: router class name -> (renormalize: True or the attribute that says so, scores in the logits' dtype)
ROUTERS = {
    "Qwen3MoeTopKRouter": ("norm_topk_prob", True),
    "Qwen2MoeTopKRouter": ("norm_topk_prob", True),
    "Qwen3NextTopKRouter": ("norm_topk_prob", True),
    "OlmoeTopKRouter": ("norm_topk_prob", True),
    "FlexOlmoTopKRouter": ("norm_topk_prob", True),
    "Qwen3_5MoeTopKRouter": (True, True),
    "Qwen3VLMoeTextTopKRouter": (True, True),
    "MixtralTopKRouter": (True, False),
}

_classes: dict[type, type] = {}


def _forward(self, hidden_states):
    from .. import ops

    normalize, cast = ROUTERS[self._lowbit_router_of]
    if isinstance(normalize, str):
        normalize = bool(getattr(self, normalize))
    x = hidden_states.reshape(-1, self.hidden_dim).contiguous()  # the op takes contiguous rows (F.linear any)
    return ops.moe_router(x, self.weight.contiguous(), self.top_k, normalize, not cast)


def _fast_class(cls: type) -> type:
    if cls not in _classes:
        _classes[cls] = type(f"Lowbit{cls.__name__}", (cls,), {"forward": _forward, "_lowbit_router_of": cls.__name__,
                                                                 "__module__": __name__})
    return _classes[cls]


def use_lowbit_router(model: nn.Module) -> int:
    """Route every router of ``model`` listed in :data:`ROUTERS` through lowbit's op; returns how many."""
    n = 0
    for mod in model.modules():
        cls = type(mod)
        if (cls.__name__ in ROUTERS and cls.__module__.startswith("transformers.")  # that class, not a namesake
                and cls not in _classes.values() and isinstance(getattr(mod, "weight", None), torch.Tensor)):
            mod.__class__ = _fast_class(cls)
            n += 1
    return n
