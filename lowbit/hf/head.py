"""A decode step's unquantized output projection (``lm_head``) through lowbit's dense GEMV.

``quantize_model`` leaves the head in bf16/fp16 unless asked (``bits_for={"lm_head": B}``); at batch 1-4 it is
then one ``[rows, hidden] x [vocab, hidden]^T`` GEMV over the largest weight of the model (Llama-3-8B: 1.05 GB,
a sixth of a kbit4 step). :func:`use_dense_head` gives such a head a subclass whose forward takes 1..4 rows
through :func:`lowbit.dense_linear` (the tuned GEMV of ``csrc/dense/gemv.cu``) instead of cuBLAS; every other
call (prefill, more rows, CPU, :data:`DENSE` off) runs ``nn.Linear``'s own forward. Parameters, state dict names,
tied embeddings and ``isinstance(head, nn.Linear)`` stay. The head is the same weight in a bf16 model and in a
quantized one, so :func:`lowbit.hf.decode.greedy_decode` switches it in both: a bf16 baseline measured through
it runs the same head kernel as the quantized model beside it.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import dispatch
from ..nn.base import hooked

#: take 1..DENSE_GEMV_MAX_M rows through lowbit's GEMV (False: cuBLAS, as nn.Linear; comparisons)
DENSE = True


class LowbitDenseHead(nn.Linear):
    """An ``nn.Linear`` output projection whose decode rows run lowbit's tuned dense GEMV."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
        if DENSE and x.is_cuda and 1 <= rows <= dispatch.DENSE_GEMV_MAX_M and x.dtype == self.weight.dtype:
            from .. import dense_linear

            y = dense_linear(x, self.weight)
            return y if self.bias is None else y + self.bias
        return super().forward(x)


def refusal(head) -> str | None:
    """Why :func:`use_dense_head` would leave ``head`` alone, or None where it takes it: exactly ``nn.Linear`` (not a
    subclass), no hooks and no instance ``forward`` (tensor parallelism's sharded heads, offloading and profilers
    keep their own forward), over a plain contiguous fp16/bf16 tensor on a GPU."""
    if type(head) is not nn.Linear:
        return f"not an nn.Linear but {type(head).__name__}"
    if hooked(head):
        return "it has forward hooks or a forward of its own"
    w = head.weight
    if type(w.data) is not torch.Tensor:
        return f"its weight is a {type(w.data).__name__}"
    if w.dtype not in dispatch.GEMV_DTYPES or not w.is_contiguous():
        return f"its weight is {w.dtype}{'' if w.is_contiguous() else ', not contiguous'}"
    if not w.is_cuda:
        return f"its weight is on {w.device}"
    return None


def use_dense_head(model: nn.Module) -> bool:
    """Switch ``model``'s output embeddings (``get_output_embeddings()``) to :class:`LowbitDenseHead` where it is a
    plain fp16/bf16 ``nn.Linear`` on a GPU; returns whether the model's head is (now) one."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if isinstance(head, LowbitDenseHead):
        return True
    if head is None or refusal(head) is not None:
        return False
    head.__class__ = LowbitDenseHead
    return True
