"""Calibration token ids: from the caller's tensor, the caller's texts, or the default text.

The default text is the Python language reference as every CPython ships it (``pydoc_data.topics``:
79 topics, ~465,000 characters of English prose with code; works offline). It is deliberately not
the text ``lowbit eval`` scores on (the docstrings of 16 standard-library modules), so quality
measured there is measured on text the calibration did not see.
"""

from __future__ import annotations

import sys

import torch

DEFAULT_SAMPLES = 64
DEFAULT_SEQ_LEN = 512


def default_text() -> str:
    """The Python language reference (``pydoc_data.topics``), topics in sorted order."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def default_text_info() -> str:
    return f"the Python {sys.version.split()[0]} language reference (pydoc_data.topics)"


def token_windows(ids: torch.Tensor, samples: int, seq_len: int) -> torch.Tensor:
    """``samples`` non-overlapping windows of ``seq_len`` tokens spread evenly over ``ids`` (fewer if the
    text is shorter; one window of all of it if it is shorter than ``seq_len``)."""
    total = ids.numel()
    if total < 2:
        raise ValueError(f"the calibration text gives {total} token(s); it needs at least 2")
    fit = total // seq_len
    if fit == 0:
        return ids[None, :].clone()
    n = min(samples, fit)
    starts = [(i * fit // n) * seq_len for i in range(n)]
    return torch.stack([ids[s:s + seq_len] for s in starts])


def calibration_ids(calibration, tokenizer, vocab_size: int | None, *, samples: int = DEFAULT_SAMPLES,
                    seq_len: int = DEFAULT_SEQ_LEN) -> tuple[torch.Tensor, str]:
    """``(ids LongTensor [n, seq], description)`` from ``calibration``:

    * a LongTensor ``[n, seq]`` of token ids (used as given);
    * a string or a list of strings (``tokenizer`` required): joined by blank lines, tokenized, cut into
      ``samples`` windows of ``seq_len`` tokens;
    * None: the default text (:func:`default_text`; ``tokenizer`` required), cut the same way.

    Ids outside ``[0, vocab_size)`` are refused (a tokenizer of another model).
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an int >= 2, got {seq_len!r}")
    if isinstance(calibration, torch.Tensor):
        if calibration.dtype not in (torch.int64, torch.int32) or calibration.dim() != 2:
            raise ValueError(f"calibration ids must be an int64/int32 tensor [samples, seq_len], got "
                             f"{str(calibration.dtype).removeprefix('torch.')} {tuple(calibration.shape)}")
        if calibration.shape[0] < 1 or calibration.shape[1] < 2:
            raise ValueError(f"calibration ids must hold >= 1 sample of >= 2 tokens, got shape {tuple(calibration.shape)}")
        ids, desc = calibration.to(torch.int64), "the given token ids"
    else:
        if calibration is None:
            text, desc = default_text(), default_text_info()
        elif isinstance(calibration, str) or (isinstance(calibration, (list, tuple))
                                              and all(isinstance(t, str) for t in calibration)):
            texts = [calibration] if isinstance(calibration, str) else list(calibration)
            if not texts or not any(t.strip() for t in texts):
                raise ValueError("calibration texts are empty: give at least one non-empty string")
            text, desc = "\n\n".join(texts), f"{len(texts)} given text{'s' if len(texts) != 1 else ''}"
        else:
            raise TypeError("calibration must be a LongTensor [samples, seq_len] of token ids, a list of strings, "
                            f"or None (the default text); got {type(calibration).__name__}")
        if tokenizer is None:
            raise ValueError("calibration from text needs the model's tokenizer: pass tokenizer=..., or token ids "
                             "as a LongTensor [samples, seq_len]")
        ids = token_windows(torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64).reshape(-1), samples, seq_len)
    if vocab_size is not None:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"calibration token ids must lie in [0, {vocab_size}) (the model's vocabulary), got "
                             f"ids from {lo} to {hi}: a tokenizer of another model?")
    n, s = ids.shape
    return ids, f"{desc}: {n} x {s} = {n * s} tokens"
