"""Argument checks shared by every format and op.

They read metadata only (dtype, shape, device, strides), so they are cheap, run on every call,
and work unchanged on the fake tensors torch.compile traces with. Messages name the argument
and the expectation.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    dim: int | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            want = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype in ({want}), got {str(t.dtype).replace('torch.', '')}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first); got strides {t.stride()}")
    return t


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on the same device; got {listing}")


def check_finite(name: str, t: torch.Tensor) -> None:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        n_bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} must be finite; found {n_bad} NaN/Inf value(s)")


def check_x(x: object, k: int, device: torch.device, *, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES,
            contiguous: bool = False, what: str = "K_in") -> torch.Tensor:
    """An activation ``x [..., k]`` for a weight with ``k`` input features on ``device``: the one check
    every path runs before choosing a kernel (CPU reference, CUDA kernels, the modules' eager launchers),
    so bad input fails the same way on every device."""
    check_tensor("x", x, dtypes=dtypes, contiguous=contiguous)
    assert isinstance(x, torch.Tensor)
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x must have shape [..., {what}={k}] to match the weight, got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"x is on {x.device} but the weight is on {device}")
    return x


def check_offsets_values(expert_offsets: torch.Tensor, rows: int) -> list[int]:
    """The values of host (CPU) expert offsets: 0 first, non-decreasing, ``rows`` last; returns them as a list.
    Offsets on a GPU are checked there instead (``lowbit::check_expert_offsets``: a device-side assertion,
    no synchronization), the same rule."""
    off = expert_offsets.tolist()
    if off[0] != 0 or off[-1] != rows or any(b < a for a, b in zip(off, off[1:])):
        shown = off if len(off) <= 12 else [*off[:6], "...", *off[-3:]]
        raise ValueError(f"expert_offsets must rise from 0 to the row count {rows} (non-decreasing), got {shown}")
    return off


def offsets_for(expert_offsets: object, x: torch.Tensor, experts: int) -> tuple[torch.Tensor, bool]:
    """Expert offsets ready for a grouped call on x's device, and whether the device must still check their
    values. Offsets from the host are checked there (cheap, exact message) and copied over; offsets already
    on the GPU are checked on the GPU by the op (a device-side assertion: reading them back would synchronize)."""
    check_tensor("expert_offsets", expert_offsets, dtypes=(torch.int64,), dim=1, contiguous=False)
    assert isinstance(expert_offsets, torch.Tensor)
    if expert_offsets.shape[0] != experts + 1:
        raise ValueError(f"expert_offsets must have E + 1 = {experts + 1} entries, got {expert_offsets.shape[0]}")
    if expert_offsets.device.type == "cpu":
        check_offsets_values(expert_offsets, x.shape[0] if x.dim() >= 1 else 0)
        return expert_offsets.to(x.device), False
    return expert_offsets, True
