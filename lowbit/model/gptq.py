"""GPTQ (Frantar et al., 2022): quantize a weight column by column and move each column's rounding
error onto the columns not yet quantized, in the direction that least changes the layer's output on
the calibration inputs.

For a linear ``y = x W^T`` with calibration inputs ``X [n, K]`` the Hessian of the output error is
``H = 2 X^T X / n``. With ``U`` the upper Cholesky factor of ``H^-1``, quantizing column ``i`` to
``q`` and applying ``W[:, i:] -= ((w_i - q) / U[i, i]) U[i, i:]`` keeps the optimal compensation of
the remaining columns (the OBS update), without ever re-inverting ``H``. The blocked form here
applies the updates inside a block of ``block_size`` columns eagerly and to the columns right of it
once per block (one matrix product): the same arithmetic in another order.

The format is a :class:`ColumnQuantizer` (``lowbit/formats/<name>/columns.py``): ``group`` (columns
sharing a scale), ``set_block(b, columns)``, ``quantize(col, w) -> dequantized`` and ``result()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


class ColumnQuantizer(Protocol):
    group: int

    def set_block(self, b: int, columns: torch.Tensor) -> None: ...
    def quantize(self, col: int, w: torch.Tensor) -> torch.Tensor: ...
    def result(self) -> Any: ...


@dataclass
class GptqStats:
    error: float          # sum over columns of ||w_i - q_i||^2 / U[i, i]^2 (GPTQ's loss, before the 1/2)
    damp: float           # the damping added to H's diagonal, relative to its mean
    dead: int             # input columns that were always zero in the calibration data


class HessianAccumulator:
    """``H = 2 X^T X / n`` of a linear's inputs, summed in fp32 over calls (rows of any leading shape)."""

    def __init__(self, k: int, device):
        self.h = torch.zeros((k, k), dtype=torch.float32, device=device)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).to(torch.float32)
        self.h.addmm_(x.t(), x)
        self.rows += x.shape[0]

    def hessian(self) -> torch.Tensor:
        return self.h * (2.0 / max(1, self.rows))


def _prepare(weight: torch.Tensor, hessian: torch.Tensor, damp: float, act_order: bool):
    w = weight.detach().to(torch.float32).clone()
    h = hessian.detach().to(torch.float32, copy=True)
    k = w.shape[1]
    if tuple(h.shape) != (k, k):
        raise ValueError(f"hessian must be [{k}, {k}] for a weight of shape {tuple(w.shape)}, got {tuple(h.shape)}")
    if not bool(torch.isfinite(h).all()):
        raise ValueError("the Hessian has NaN or inf entries: the calibration activations are not finite")
    diag = torch.diagonal(h)
    dead = diag == 0
    # A column no calibration input reaches: GPTQ cannot say where its error should go, so it is
    # rounded alone (unit Hessian entry, nothing propagated) and keeps its weights.
    h[dead, dead] = 1.0
    perm = torch.argsort(torch.diagonal(h), descending=True, stable=True) if act_order else None
    if perm is not None:
        h = h[perm][:, perm]
    mean = float(torch.diagonal(h).mean())
    rel = damp
    eye = torch.eye(k, dtype=torch.float32, device=h.device)
    for _ in range(6):  # more damping until H is positive definite in fp32
        chol, info = torch.linalg.cholesky_ex(h + rel * mean * eye)
        if int(info) == 0:
            hinv = torch.cholesky_inverse(chol)
            u, info = torch.linalg.cholesky_ex(hinv, upper=True)
            if int(info) == 0:
                return w, u, perm, int(dead.sum()), rel
        rel = max(rel * 10, 1e-4)
    raise ValueError(f"the Hessian is not positive definite even with damping {rel / 10:g} x its mean diagonal")


def gptq(weight: torch.Tensor, hessian: torch.Tensor, quantizer: ColumnQuantizer, *, damp: float = 0.01,
         block_size: int = 128, act_order: bool = False) -> GptqStats:
    """Quantize ``weight [N, K]`` with ``quantizer`` (which records the result), GPTQ's blocked loop.

    ``damp``: added to H's diagonal as a fraction of its mean (raised x10 while H is not positive definite).
    ``act_order``: columns in decreasing H diagonal (most important first); the block scales are then
    fixed beforehand from the weight as given ("static groups", so every 32/16-column block keeps one
    scale); without it each block's scale comes from the error-updated weights when the walk reaches it.
    """
    g = quantizer.group
    if block_size % g:
        raise ValueError(f"block_size must be a multiple of the format's block ({g}), got {block_size}")
    w, u, perm, dead, rel = _prepare(weight, hessian, damp, act_order)
    n, k = w.shape
    if perm is not None:
        for b in range(k // g):
            quantizer.set_block(b, w[:, b * g:(b + 1) * g])
        w = w[:, perm]
        cols = perm.tolist()
    else:
        cols = range(k)
    err_total = torch.zeros((), dtype=torch.float32, device=w.device)
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        w1 = w[:, i1:i2].clone()
        u1 = u[i1:i2, i1:i2]
        e1 = torch.empty_like(w1)
        for i in range(i2 - i1):
            c = cols[i1 + i]
            if perm is None and c % g == 0:
                quantizer.set_block(c // g, w1[:, i:i + g])
            col = w1[:, i]
            d = u1[i, i]
            e = (col - quantizer.quantize(c, col)) / d
            err_total += e.square().sum()
            w1[:, i + 1:].addr_(e, u1[i, i + 1:], alpha=-1.0)
            e1[:, i] = e
        if i2 < k:
            w[:, i2:].addmm_(e1, u[i1:i2, i2:], alpha=-1.0)
    return GptqStats(error=float(err_total), damp=rel, dead=dead)


def gptq_stack(weight: torch.Tensor, hessian: torch.Tensor, quantizer: ColumnQuantizer, *, damp: float = 0.01,
               block_size: int = 128, act_order: bool = False) -> GptqStats:
    """:func:`gptq` for a stack of independent weights ``[E, N, K]`` with their own Hessians ``[E, K, K]``
    (MoE experts) in one walk: every step works on all E at once (the quantizer takes ``[E, N]``
    columns and, with act-order, a column index per weight). Same arithmetic per weight as :func:`gptq`."""
    g = quantizer.group
    if block_size % g:
        raise ValueError(f"block_size must be a multiple of the format's block ({g}), got {block_size}")
    w = weight.detach().to(torch.float32).clone()
    h = hessian.detach().to(torch.float32, copy=True)
    e_, n, k = w.shape
    if tuple(h.shape) != (e_, k, k):
        raise ValueError(f"hessian must be [{e_}, {k}, {k}] for weights of shape {tuple(w.shape)}, got {tuple(h.shape)}")
    if not bool(torch.isfinite(h).all()):
        raise ValueError("the Hessian has NaN or inf entries: the calibration activations are not finite")
    diag = torch.diagonal(h, dim1=-2, dim2=-1)
    dead = diag == 0
    diag[dead] = 1.0  # a view: H's diagonal (see gptq's _prepare)
    perm = torch.argsort(diag, dim=-1, descending=True, stable=True) if act_order else None
    if perm is not None:
        h = h.gather(1, perm[:, :, None].expand(e_, k, k)).gather(2, perm[:, None, :].expand(e_, k, k))
    mean = torch.diagonal(h, dim1=-2, dim2=-1).mean(-1)[:, None, None]
    eye = torch.eye(k, dtype=torch.float32, device=h.device)
    rel = damp
    for _ in range(6):
        chol, info = torch.linalg.cholesky_ex(h + rel * mean * eye)
        if not bool(info.any()):
            u, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(chol), upper=True)
            if not bool(info.any()):
                break
        rel = max(rel * 10, 1e-4)
    else:
        raise ValueError(f"a Hessian is not positive definite even with damping {rel / 10:g} x its mean diagonal")
    if perm is not None:
        for b in range(k // g):
            quantizer.set_block(b, w[..., b * g:(b + 1) * g])
        w = w.gather(2, perm[:, None, :].expand(e_, n, k))
    err_total = torch.zeros((), dtype=torch.float32, device=w.device)
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        w1 = w[..., i1:i2].clone()
        u1 = u[:, i1:i2, i1:i2]
        e1 = torch.empty_like(w1)
        for i in range(i2 - i1):
            c = perm[:, i1 + i] if perm is not None else i1 + i
            if perm is None and c % g == 0:
                quantizer.set_block(c // g, w1[..., i:i + g])
            col = w1[..., i]
            err = (col - quantizer.quantize(c, col)) / u1[:, i, i, None]
            err_total += err.square().sum()
            w1[..., i + 1:] -= err[..., None] * u1[:, i, None, i + 1:]
            e1[..., i] = err
        if i2 < k:
            w[..., i2:] -= torch.bmm(e1, u[:, i1:i2, i2:])
    return GptqStats(error=float(err_total), damp=rel, dead=int(dead.sum()))


def gptq_reference(weight: torch.Tensor, hessian: torch.Tensor, quantizer: ColumnQuantizer, *,
                   damp: float = 0.01) -> None:
    """The unblocked loop, the algorithm as written (tests compare :func:`gptq` with it)."""
    w, u, _, _, _ = _prepare(weight, hessian, damp, False)
    g = quantizer.group
    for c in range(w.shape[1]):
        if c % g == 0:
            quantizer.set_block(c // g, w[:, c:c + g])
        e = (w[:, c] - quantizer.quantize(c, w[:, c])) / u[c, c]
        w[:, c:] -= e[:, None] * u[c, c:][None, :]
