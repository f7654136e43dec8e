"""What the bits cost: teacher-forced comparison of a quantized model with its unquantized original.

Metrics over the next-token distributions at every position of a fixed text:
perplexity of each model, mean KL(p_unquantized || p_quantized), and top-1 agreement.
The default text is the docstrings of a fixed list of Python standard-library modules (present
on every machine, tuned to nobody; the exact text depends on the Python version, recorded with
the results).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys

import torch
import torch.nn.functional as F

STDLIB_MODULES = ("argparse", "collections", "functools", "itertools", "json", "pathlib", "string", "textwrap",
                  "re", "heapq", "bisect", "fractions", "statistics", "shutil", "tempfile", "random")


def stdlib_docstrings(max_chars: int = 400_000) -> str:
    """The docstrings of ``STDLIB_MODULES`` and their public members, in a fixed order."""
    parts = []
    for name in STDLIB_MODULES:
        mod = importlib.import_module(name)
        if mod.__doc__:
            parts.append(inspect.cleandoc(mod.__doc__))
        for attr in sorted(vars(mod)):
            obj = getattr(mod, attr)
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            doc = inspect.getdoc(obj)
            if doc:
                parts.append(doc)
    return "\n\n".join(parts)[:max_chars]


def text_info() -> str:
    return f"stdlib docstrings ({', '.join(STDLIB_MODULES)}), Python {sys.version.split()[0]}"


@torch.no_grad()
def logits_over(model, ids: torch.Tensor, window: int = 512) -> torch.Tensor:
    """fp32 next-token logits ``[T - 1, V]`` for a 1-D token sequence, in independent windows."""
    device = next(model.parameters()).device
    outs = []
    for lo in range(0, ids.numel() - 1, window):
        chunk = ids[lo:lo + window + 1]
        if chunk.numel() < 2:
            break
        out = model(chunk[None, :-1].to(device), use_cache=False).logits[0].float().cpu()
        outs.append(out)
    return torch.cat(outs)


def compare(ref_logits: torch.Tensor, q_logits: torch.Tensor, targets: torch.Tensor) -> dict:
    """Perplexities, mean KL(ref || q) in nats, top-1 agreement; all over the same positions."""
    n = min(ref_logits.shape[0], q_logits.shape[0], targets.numel())
    ref, q, t = ref_logits[:n], q_logits[:n], targets[:n].cpu()
    lp_ref, lp_q = F.log_softmax(ref, -1), F.log_softmax(q, -1)
    kl = (lp_ref.exp() * (lp_ref - lp_q)).sum(-1)
    return {
        "tokens": n,
        "ppl_ref": float(torch.exp(-lp_ref.gather(1, t[:, None]).mean())),
        "ppl": float(torch.exp(-lp_q.gather(1, t[:, None]).mean())),
        "kl": float(kl.mean()),
        "top1": float((ref.argmax(-1) == q.argmax(-1)).float().mean()),
    }


@contextlib.contextmanager
def upcast(model, dtype: torch.dtype = torch.float32):
    """Inside the block every floating parameter and buffer of ``model`` is in ``dtype`` (activations follow:
    the same quantized weights computed in fp32, the yardstick for a half-precision model's own rounding);
    after it each tensor is back in its own dtype, exactly (fp16 / bf16 -> fp32 -> back is lossless), buffers
    kept in fp32 on purpose (rotary frequencies) included."""
    saved = []
    for mod in model.modules():
        for store in (mod._parameters, mod._buffers):
            for t in store.values():
                if t is not None and t.is_floating_point() and t.dtype != dtype:
                    saved.append((t, t.dtype))
                    t.data = t.data.to(dtype)
    try:
        yield model
    finally:
        for t, old in saved:
            t.data = t.data.to(old)
