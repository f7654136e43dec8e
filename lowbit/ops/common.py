"""What the op schemas of every format share: output dtypes, bias, expert-by-expert references."""

from __future__ import annotations

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
