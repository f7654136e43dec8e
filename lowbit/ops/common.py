"""What the op schemas of every format share: output dtypes, bias, expert-by-expert references."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import FLOAT_DTYPES, check_offsets_values, check_same_device, check_tensor

#: Rows of x the decode GEMV kernels take (their MMA covers 8 tokens at the cost of 1): the GEMV ops'
#: limit, the dispatcher's GEMV/GEMM boundary and the kernels' largest compiled instance.
GEMV_MAX_M = 8


def _check_out_dtype(dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of float16, bfloat16, float32, got {dtype}")



def check_bias(bias, n, x) -> None:
    if bias is None:
        return
    check_tensor("bias", bias, dtypes=FLOAT_DTYPES, dim=1, contiguous=False)
    if bias.shape[0] != n:
        raise ValueError(f"bias must have shape [N={n}], got {tuple(bias.shape)}")
    check_same_device(x=x, bias=bias)



def per_expert(x, expert_offsets, n: int, experts: int, linear) -> Tensor:
    """The grouped references: rows ``[off[e], off[e+1])`` of x through ``linear(e, rows)`` expert by expert."""
    off = check_offsets_values(expert_offsets, x.shape[0])
    y = x.new_empty((x.shape[0], n))
    for e in range(experts):
        if off[e + 1] > off[e]:
            y[off[e]:off[e + 1]] = linear(e, x[off[e]:off[e + 1]])
    return y


def routed_operand(x, route_ids, k_in: int, rows_per_x, swiglu: bool) -> Tensor:
    """The routed GEMVs' row arguments (kbit's and NVFP4's ``*_routed_gemv``): ``route_ids`` int64 [rows x
    rows_per_x]; ``swiglu``: x is ``[rows, 2 K_in]`` = [gate | up] with one route per row. Returns the operand to check
    against the expert stack: x itself, or a meta stand-in of the product silu(gate) * up ``[rows, K_in]``."""
    operand = x
    if swiglu:  # x holds [gate | up]: the stack is checked against the product silu(gate) * up, [rows, K_in]
        check_tensor("x", x, dtypes=FLOAT_DTYPES, dim=2)
        if x.shape[1] != 2 * k_in:
            raise ValueError(f"swiglu=True: x must be [rows, 2 x K_in = {2 * k_in}] ([gate | up]), got {tuple(x.shape)}")
        if rows_per_x != 1:
            raise ValueError(f"swiglu=True takes one route per x row (rows_per_x=1), got {rows_per_x!r}")
        operand = torch.empty((x.shape[0], k_in), dtype=x.dtype, device="meta")
    check_tensor("route_ids", route_ids, dtypes=(torch.int64,), dim=1)
    if not isinstance(rows_per_x, int) or isinstance(rows_per_x, bool) or rows_per_x < 1:
        raise ValueError(f"rows_per_x must be a positive int, got {rows_per_x!r}")
    if route_ids.shape[0] != x.shape[0] * rows_per_x:
        raise ValueError(f"route_ids must have rows x rows_per_x = {x.shape[0]} x {rows_per_x} = "
                         f"{x.shape[0] * rows_per_x} entries (route r reads x row r // rows_per_x), got {route_ids.shape[0]}")
    return operand


def per_route(x, route_ids, n: int, experts: int, rows_per_x: int, swiglu: bool, linear) -> Tensor:
    """The routed references: row r is x row ``r // rows_per_x`` (``swiglu``: silu(gate) * up of it) through
    ``linear(e, rows)`` for e = ``route_ids[r]``, each expert's rows in one call; ids outside [0, experts): zero rows."""
    if swiglu:
        x = swiglu_reference(x)
    ids = route_ids.tolist()
    y = x.new_zeros((len(ids), n))
    for e in sorted({i for i in ids if 0 <= i < experts}):
        rows = [r for r, i in enumerate(ids) if i == e]
        xr = x[torch.tensor([r // rows_per_x for r in rows], device=x.device)]
        y[torch.tensor(rows, device=x.device)] = linear(e, xr)
    return y


# ------------------------------------------------------------------ the GEMV epilogue (a decode step's glue)
def check_epilogue_parts(x, m: int, n: int, k_in: int, rms_x, residual, norm_weight, swiglu: bool = False) -> None:
    """The epilogue's own arguments of an M-row GEMV ``[M, K_in] -> [M, N]`` (kbit's and NVFP4's
    ``*_gemv_epilogue`` ops)."""
    if swiglu and (n % 32 or residual is not None or norm_weight is not None):
        raise ValueError(f"swiglu=True needs N (gate rows + up rows) a multiple of 32 and no residual or norm_weight, "
                         f"got N={n}{', a residual' if residual is not None else ''}"
                         f"{', a norm_weight' if norm_weight is not None else ''}")
    if rms_x is not None:
        check_tensor("rms_x", rms_x, dtypes=(x.dtype,), dim=2)
        if tuple(rms_x.shape) != (m, k_in) or not rms_x.is_contiguous():
            raise ValueError(f"rms_x must be a contiguous [M={m}, K_in={k_in}] tensor of x's dtype, got {tuple(rms_x.shape)}")
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,), dim=2)
        if tuple(residual.shape) != (m, n) or not residual.is_contiguous():
            raise ValueError(f"residual must be a contiguous [M={m}, N={n}] tensor of x's dtype, got {tuple(residual.shape)}")
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, dtypes=(x.dtype,), dim=1)
        if norm_weight.shape[0] != n or not norm_weight.is_contiguous():
            raise ValueError(f"norm_weight must be a contiguous [N={n}] tensor of x's dtype, got {tuple(norm_weight.shape)}")
    check_same_device(x=x, **{k: v for k, v in (("rms_x", rms_x), ("residual", residual), ("norm_weight", norm_weight))
                              if v is not None})


def apply_epilogue(y32: Tensor, dtype: torch.dtype, bias=None, rms_x=None, eps: float = 1e-6, residual=None,
                   norm_weight=None) -> tuple[Tensor, Tensor]:
    """The epilogue's definition on an fp32 product ``y32 [M, N]`` (see :func:`kbit_gemv_epilogue`)."""
    if rms_x is not None:
        y32 = y32 * torch.rsqrt(rms_x.to(torch.float32).pow(2).mean(-1, keepdim=True) + eps)
    if bias is not None:
        y32 = y32 + bias.to(torch.float32)
    if residual is not None:
        y32 = y32 + residual.to(torch.float32)
    y = y32.to(dtype)
    yw = (y.to(torch.float32) * norm_weight.to(torch.float32)).to(dtype) if norm_weight is not None else y.new_empty((0,))
    return y, yw


def swiglu_reference(y: Tensor) -> Tensor:
    """``silu(g) * u`` of a rounded ``[M, N]`` output's halves ``[g | u]``, in fp32, rounded once."""
    g, u = y.to(torch.float32).chunk(2, dim=-1)
    return (torch.nn.functional.silu(g) * u).to(y.dtype)
