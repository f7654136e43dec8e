"""E4M4: the one-byte unsigned float that stores each kbit block's absmax.

Layout of a code byte ``c``: ``eeee mmmm`` (exponent ``e = c >> 4``, mantissa ``m = c & 15``).

* Bias 15. Normal codes (``e >= 1``): ``(1 + m/16) * 2**(e - 15)``, i.e. 2**-14 ... 1.9375.
* Subnormal codes (``e == 0``): ``(m/16) * 2**-14 = m * 2**-18``; code 0 is exactly 0.
* No sign (an absmax is never negative), no Inf, no NaN: all 256 codes are finite, and the
  decoded value increases strictly with the code, so encoding is a nearest-neighbour search
  over a sorted table.
* Encoding rounds to the nearest code, ties to the even code (even mantissa). Values above
  the largest code (1.9375) saturate to it; kbit never produces those because the per-tensor
  fp32 ``scale`` maps the largest block absmax exactly onto code 0xFF.
* Worst-case relative encoding error on the normal range [2**-14, 1.9375]: **1/33 (3.03%)**.
  Within a binade [2**e, 2**(e+1)) the codes are 2**e/16 apart, so the error is at most
  2**e/32; relative to the value it peaks at the midpoint 2**e * (1 + 1/32), giving
  (1/32) / (1 + 1/32) = 1/33. Below 2**-14 (subnormals) the bound is absolute: 2**-19.
  ``tests/test_e4m4.py`` checks both over all 256 codes and every midpoint.

Every decoded value is an integer times a power of two with at most 5 significant bits, so it
is exact in fp16, bf16 and fp32; kernels decode it with integer ops and one multiply.
"""

from __future__ import annotations

import torch

BIAS = 15
MAX_VALUE = 1.9375  # code 0xFF
MIN_NORMAL = 2.0**-14
SUBNORMAL_STEP = 2.0**-18
NORMAL_REL_ERROR_BOUND = 1.0 / 33.0
SUBNORMAL_ABS_ERROR_BOUND = SUBNORMAL_STEP / 2


def _table() -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.int64)
    e = codes >> 4
    m = codes & 15
    mant = torch.where(e > 0, m + 16, m).to(torch.float64)
    exp = torch.clamp(e, min=1) - BIAS - 4
    return (mant * torch.pow(2.0, exp.to(torch.float64))).to(torch.float32)


#: decoded value of every code, ascending (index = code).
TABLE = _table()
# Rounding boundaries between consecutive codes (exact in fp64; compared in fp64 below).
_MIDPOINTS = (TABLE[1:].double() + TABLE[:-1].double()) / 2


def decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes -> fp32 values (exact)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"e4m4.decode: codes must be torch.uint8, got {codes.dtype}")
    return _table_on(codes.device)[codes.long()]


_TABLES: dict[torch.device, torch.Tensor] = {}


def _table_on(device: torch.device) -> torch.Tensor:
    """TABLE on ``device``, copied once (a copy per call would be a host->device copy inside CUDA-graph capture)."""
    t = _TABLES.get(device)
    if t is None:
        t = _TABLES[device] = TABLE.to(device)
    return t


def encode(values: torch.Tensor) -> torch.Tensor:
    """Non-negative finite float values -> nearest uint8 code (ties to even, saturating)."""
    if not values.is_floating_point():
        raise TypeError(f"e4m4.encode: values must be floating point, got {values.dtype}")
    v = values.detach().double()
    if not bool(torch.isfinite(v).all()) or bool((v < 0).any()):
        raise ValueError("e4m4.encode: values must be finite and >= 0")
    mids = _MIDPOINTS.to(v.device)
    idx = torch.bucketize(v, mids)  # mids[idx-1] < v <= mids[idx]
    # An exact tie lands on the lower code; move it up when the lower code is odd (ties to even).
    on_mid = (idx < 255) & (v == mids[idx.clamp(max=254)])
    idx = torch.where(on_mid & (idx % 2 == 1), idx + 1, idx)
    return idx.to(torch.uint8)
