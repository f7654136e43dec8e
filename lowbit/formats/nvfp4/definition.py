"""NVFP4: E2M1 values with an FP8 (E4M3) scale per 16 elements and an fp32 scale per tensor -- the
reference implementation (CPU or any device; kernels are tested against it).

Format of a weight ``W[N, K]`` (``K`` a multiple of 16):

* ``packed``: uint8 ``[N, K/2]``, two E2M1 codes per byte, element ``2i`` in the low nibble.
  E2M1 code ``s eem``: sign bit 3, magnitudes ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` for codes 0..7.
* ``scales``: float8_e4m3fn ``[N, K/16]``, one non-negative block scale per 16 consecutive elements
  (the "plain" layout; :func:`to_blocked` gives the 128x4-swizzled layout cuBLAS / CUTLASS read).
* ``scale_2``: one fp32 per tensor, the *multiplier* (ModelOpt's ``weight_scale_2``)::

      W[n, k] = e2m1(code[n, k]) * float(scales[n, k // 16]) * scale_2     # fp32, in this order

Global-scale conventions (accepted explicitly, never guessed): ModelOpt stores ``scale_2 = amax /
(6 * 448)`` and multiplies; compressed-tensors / vLLM / FlashInfer / TRT-LLM store the inverse,
``global_scale = 448 * 6 / amax``, and divide. :class:`NvFp4Weight` keeps the multiplier; the
``"inverse"`` convention is converted as ``scale_2 = fp32(1 / global_scale)`` (<= 0.5 ulp of fp32
from dividing, so outputs differ from the dividing definition by at most one fp32 rounding).

Quantization (ModelOpt's recipe):

1. ``amax = max |W|``; ``scale_2 = amax / (6 * 448)`` (1.0 for an all-zero W).
2. Block scale ``s = (block_amax / 6) / scale_2`` encoded to E4M3 with round to nearest even,
   saturating at 448 (never NaN); below half the smallest subnormal (2^-10) it is 0.
3. Each element ``w / (float(s_e4m3) * scale_2)`` is rounded to the E2M1 grid, nearest, ties to the
   even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating at
   +-6; the sign is the input's sign bit (a negative value that rounds to 0 is stored as -0, code 8).
   A block whose scale encodes to 0 stores zeros.
"""

from __future__ import annotations

import torch

from ..._checks import FLOAT_DTYPES, check_finite, check_same_device, check_tensor

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
#: the 16 E2M1 values by code (code 8 is -0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: midpoints between consecutive E2M1 magnitudes; a tie at midpoint i goes to the even code
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
CONVENTIONS = ("modelopt", "inverse")
#: the 128x4 tile of the swizzled ("blocked") scale layout
BLOCKED_ROWS, BLOCKED_COLS = 128, 4


def e2m1_values(device=None) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """fp32 values (already divided by their scale) -> E2M1 codes (uint8 0..15), see the module doc."""
    a = x.abs()
    mids = _midpoints(x.device)
    code = torch.bucketize(a, mids)  # index of the first midpoint >= a: a tie lands on the lower code
    code = code + ((a == mids[code.clamp(max=mids.numel() - 1)]) & (code % 2 == 1))  # odd-midpoint ties go up to even
    return code.to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)


_MIDS: dict = {}


def _midpoints(device) -> torch.Tensor:
    m = _MIDS.get(device)
    if m is None:
        m = _MIDS[device] = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=device)
    return m


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) -> fp32 values (exact)."""
    return e2m1_values(codes.device)[codes.long()]


def encode_e4m3(s: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 block scales -> float8_e4m3fn, nearest even, saturating at 448."""
    return s.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes ``[..., K]`` (K even) -> uint8 ``[..., K/2]``, element 2i in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack needs an even last dimension, got {tuple(codes.shape)}")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., K/2]`` -> E2M1 codes ``[..., K]``."""
    out = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Plain block scales ``[N, K/16]`` -> the swizzled layout cuBLAS / CUTLASS block-scaled GEMMs
    read, flat: rows padded to a multiple of 128 and columns to a multiple of 4 (padding = 0), tiles
    of 128 x 4 in row-block-major order, each tile 512 bytes where scale ``(r, c)`` of the tile
    (``r = 32 i + j``) sits at byte ``16 j + 4 i + c``."""
    if scales.dim() != 2:
        raise ValueError(f"scales must be [N, K/16], got {tuple(scales.shape)}")
    n, c = scales.shape
    rb, cb = -(-n // BLOCKED_ROWS), -(-c // BLOCKED_COLS)
    raw = scales.view(torch.uint8) if scales.dtype == torch.float8_e4m3fn else scales
    padded = raw.new_zeros((rb * BLOCKED_ROWS, cb * BLOCKED_COLS))
    padded[:n, :c] = raw
    tiles = padded.view(rb, 4, 32, cb, BLOCKED_COLS).permute(0, 3, 2, 1, 4)  # (rb, cb, j, i, c)
    out = tiles.reshape(-1)
    return out.view(torch.float8_e4m3fn) if scales.dtype == torch.float8_e4m3fn else out


def from_blocked(blocked: torch.Tensor, n: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`to_blocked` for ``[n, cols]`` scales."""
    rb, cb = -(-n // BLOCKED_ROWS), -(-cols // BLOCKED_COLS)
    if blocked.dim() != 1 or blocked.numel() != rb * cb * BLOCKED_ROWS * BLOCKED_COLS:
        raise ValueError(f"blocked scales for [{n}, {cols}] must be flat with {rb * cb * 512} entries, "
                         f"got {tuple(blocked.shape)}")
    raw = blocked.view(torch.uint8) if blocked.dtype == torch.float8_e4m3fn else blocked
    plain = raw.view(rb, cb, 32, 4, BLOCKED_COLS).permute(0, 3, 2, 1, 4).reshape(rb * BLOCKED_ROWS, cb * BLOCKED_COLS)
    plain = plain[:n, :cols].contiguous()
    return plain.view(torch.float8_e4m3fn) if blocked.dtype == torch.float8_e4m3fn else plain


def scale_2_from(global_scale: torch.Tensor | float, convention: str) -> torch.Tensor:
    """The fp32 multiplier from a global scale in ``convention`` ("modelopt": it *is* the multiplier;
    "inverse": 448 * 6 / amax, as compressed-tensors / vLLM store it)."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS} (the checkpoint's library decides), got {convention!r}")
    g = torch.as_tensor(global_scale, dtype=torch.float32)
    if g.numel() != 1:
        raise ValueError(f"the global scale must be one value, got shape {tuple(g.shape)}")
    g = g.reshape(())
    if not bool(torch.isfinite(g)) or not bool(g > 0):
        raise ValueError(f"the global scale must be finite and > 0, got {g.item()}")
    return g.clone() if convention == "modelopt" else torch.reciprocal(g)


def check_nvfp4_tensors(packed, scales, scale_2) -> None:
    check_tensor("packed", packed, dtypes=(torch.uint8,), dim=2)
    check_tensor("scales", scales, dtypes=(torch.float8_e4m3fn,), dim=2)
    check_tensor("scale_2", scale_2, dtypes=(torch.float32,))
    n, half = packed.shape
    if (2 * half) % BLOCK:
        raise ValueError(f"packed must be [N, K/2] with K a multiple of {BLOCK}, got {tuple(packed.shape)}")
    if tuple(scales.shape) != (n, 2 * half // BLOCK):
        raise ValueError(f"scales must be [N, K/16] = [{n}, {2 * half // BLOCK}] for packed {tuple(packed.shape)}, "
                         f"got {tuple(scales.shape)}")
    if scale_2.numel() != 1:
        raise ValueError(f"scale_2 must be one fp32 value, got shape {tuple(scale_2.shape)}")
    check_same_device(packed=packed, scales=scales, scale_2=scale_2)
    if scales.numel() and bool((scales.view(torch.uint8) >= 0x7F).any()):  # 0x7F: NaN; >= 0x80: negative
        raise ValueError("scales must be non-negative finite E4M3 values (UE4M3): found NaN or negative codes")
    s2 = scale_2.reshape(()).item()
    if not (s2 > 0 and s2 != float("inf")):
        raise ValueError(f"scale_2 must be finite and > 0, got {s2}")


def dequantize_reference(packed, scales, scale_2, dtype=torch.float32) -> torch.Tensor:
    """``[N, K]`` in ``dtype``: e2m1 * float(scale) * scale_2 in fp32, rounded once."""
    check_nvfp4_tensors(packed, scales, scale_2)
    n = packed.shape[0]
    vals = decode_e2m1(unpack(packed)).reshape(n, -1, BLOCK)
    w = vals * (scales.to(torch.float32) * scale_2.reshape(()).to(torch.float32))[..., None]
    return w.reshape(n, -1).to(dtype)


# ------------------------------------------------------------------ W4A4 (both operands NVFP4)
def quantize_blocks(x: torch.Tensor, scale_2: torch.Tensor | float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 codes and block scales of ``x [..., K]`` (K a multiple of 16) with a given tensor scale
    (multiplier; 1.0 = none, as GPU MODE's ``nvfp4_gemv`` operands have): the quantize rules of the
    module doc with ``scale_2`` fixed. Returns (packed uint8 [..., K/2], scales float8_e4m3fn [..., K/16]).
    The activation side of W4A4: block scales beyond 448 saturate (the block's values then clip at
    +-6 * 448 * scale_2), below 2^-10 they are 0."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] % BLOCK:
        raise ValueError(f"x's last dimension must be a multiple of {BLOCK}, got {tuple(x.shape)}")
    check_finite("x", x)
    s2 = torch.as_tensor(scale_2, dtype=torch.float32, device=x.device).reshape(())
    if not bool(torch.isfinite(s2)) or not bool(s2 > 0):
        raise ValueError(f"scale_2 must be finite and > 0, got {s2.item()}")
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], -1, BLOCK)
    scales = encode_e4m3((blocks.abs().amax(dim=-1) / E2M1_MAX) / s2)
    step = scales.to(torch.float32) * s2
    safe = torch.where(step > 0, step, torch.ones_like(step))
    scaled = torch.where(step[..., None] > 0, blocks / safe[..., None], torch.zeros_like(blocks))
    return pack(encode_e2m1(scaled).reshape(x.shape)), scales


def decode_blocks(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 values of NVFP4 ``packed [..., K/2]`` with block ``scales [..., K/16]`` (no tensor scale)."""
    vals = decode_e2m1(unpack(packed))
    k = vals.shape[-1]
    if tuple(scales.shape) != (*packed.shape[:-1], k // BLOCK):
        raise ValueError(f"scales must be {(*packed.shape[:-1], k // BLOCK)} for packed {tuple(packed.shape)}, "
                         f"got {tuple(scales.shape)}")
    return (vals.reshape(*vals.shape[:-1], -1, BLOCK) * scales.to(torch.float32)[..., None]).reshape(vals.shape)


def w4a4_gemv_reference(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """GPU MODE ``nvfp4_gemv`` semantics: ``a [M, K/2, L]`` and ``b [1, K/2, L]`` packed E2M1 (uint8, or
    torch.float4_e2m1fn_x2 viewed as uint8; K-major, element 2i in the low nibble), ``sfa [M, K/16, L]``,
    ``sfb [1, K/16, L]`` float8_e4m3fn -> ``c [M, 1, L]`` fp16: ``c[m, 0, l] = sum_k A[m, k, l] B[0, k, l]``
    with both operands decoded exactly (e2m1 * scale), products and sums in fp32, one rounding to fp16."""
    a, b = (t.view(torch.uint8) if t.dtype != torch.uint8 and t.element_size() == 1 else t for t in (a, b))
    check_tensor("a", a, dtypes=(torch.uint8,), dim=3, contiguous=False)
    check_tensor("b", b, dtypes=(torch.uint8,), dim=3, contiguous=False)
    check_tensor("sfa", sfa, dtypes=(torch.float8_e4m3fn,), dim=3, contiguous=False)
    check_tensor("sfb", sfb, dtypes=(torch.float8_e4m3fn,), dim=3, contiguous=False)
    m, half, l_ = a.shape
    if tuple(b.shape) != (1, half, l_):
        raise ValueError(f"b must be [1, K/2, L] = [1, {half}, {l_}], got {tuple(b.shape)}")
    if (2 * half) % BLOCK or tuple(sfa.shape) != (m, 2 * half // BLOCK, l_) or tuple(sfb.shape) != (1, 2 * half // BLOCK, l_):
        raise ValueError(f"K = {2 * half} must be a multiple of {BLOCK} and sfa / sfb [M or 1, K/16, L]; got "
                         f"sfa {tuple(sfa.shape)}, sfb {tuple(sfb.shape)}")
    A = decode_blocks(a.permute(2, 0, 1).contiguous(), sfa.permute(2, 0, 1).contiguous())  # [L, M, K]
    B = decode_blocks(b.permute(2, 0, 1).contiguous(), sfb.permute(2, 0, 1).contiguous())  # [L, 1, K]
    c = torch.bmm(A, B.transpose(1, 2))  # [L, M, 1] fp32
    return c.permute(1, 2, 0).to(torch.float16)
