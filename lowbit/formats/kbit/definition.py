"""kbit: K-bit (K = 2..5) codebook quantization in blocks of 32 — the reference implementation.

This module is the single source of truth for the format. Every kernel is tested against
:func:`dequantize_reference` and :func:`linear_reference`; nothing here needs a GPU.

Format of a weight ``W[N, K_in]`` (``K_in`` a multiple of 32; other sizes are rejected — pad
the weight with zero columns and the activations to match if you need it):

* Block ``(n, b)`` holds the 32 consecutive elements ``W[n, 32*b : 32*b + 32]``.
* ``codebook``: fp32 ``[2**K]``, values in [-1, 1] (default: :func:`normal_float_codebook`).
* ``scale``: one fp32 value per tensor, ``max_block_absmax / e4m4.MAX_VALUE`` (1.0 for an
  all-zero tensor), so every block absmax fits the E4M4 range with the largest one exact.
* ``absmax``: uint8 ``[N, K_in/32]``, E4M4 code of ``block_absmax / scale`` (see ``e4m4``).
* ``planes``: int32 ``[N, K_in/32, K]`` — K bit-planes per block: bit ``j`` of word ``b``
  is bit ``b`` of element ``j``'s code (words are raw 32-bit patterns held in int32).

Dequantization, in exactly this fp32 order (kernels reproduce it bit for bit)::

    block_scale = e4m4.decode(absmax) * scale           # fp32 multiply
    W[n, 32*b + j] = codebook[code(n, b, j)] * block_scale[n, b]   # fp32 multiply

Quantization computes ``block_scale`` the same way (from the *encoded* absmax, so it uses the
scale the dequantizer will see) and gives each element the codebook entry nearest to
``w / block_scale`` (exact ties go to the lower entry). Blocks whose scale encodes to 0 become 0.
"""

from __future__ import annotations

import math

import torch

from ..._checks import FLOAT_DTYPES, check_finite, check_same_device, check_tensor
from .. import e4m4

BLOCK = 32
SUPPORTED_BITS = (2, 3, 4, 5)


def check_bits(bits: object) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    return bits


# --------------------------------------------------------------------------- codebooks
def normal_float_codebook(bits: int) -> torch.Tensor:
    """Symmetric normal-float codebook: 2**bits normal quantiles scaled to [-1, 1], ascending.

    ``n = 2**K`` levels at the standard-normal quantiles of ``n`` evenly spaced probabilities
    from ``1 - p`` to ``p``, divided by the largest so the ends are exactly -1 and +1. The outer
    probability ``p = 1 - (1/(2n) + 1/(2(n-1)))/2`` is the one QLoRA's NF4 uses (0.9677 at K=4).
    Values are rounded to the nearest bf16 (exact in fp16 too). Unlike NF4 the levels are symmetric and have no exact zero: with few levels NF4's asymmetric
    layout wastes one (at K=2 it keeps only {-1, 0} for negatives). Measured on Gaussian weights
    (tests/test_kbit_quant.py) the relative RMS error is 0.43 / 0.18 / 0.087 / 0.048 for K = 2..5,
    against 0.52 / 0.18 / 0.088 / 0.049 for the asymmetric NF layout.
    """
    check_bits(bits)
    n = 2**bits
    p = 1.0 - 0.5 * (1.0 / (2 * n) + 1.0 / (2 * (n - 1)))
    values = torch.special.ndtri(torch.linspace(1.0 - p, p, n, dtype=torch.float64))
    values = (values - values.flip(0)) / 2  # exact antisymmetry despite rounding in ndtri
    # Rounded to bf16-representable values (8 significant bits; also exact in fp16), so the
    # tensor-core kernels, which hold codebook entries as fp16/bf16, use them without rounding.
    return (values / values.abs().max()).to(torch.bfloat16).to(torch.float32)


def fit_codebook(normalized: torch.Tensor, bits: int, iters: int = 25, sample: int = 1 << 22) -> torch.Tensor:
    """Lloyd-Max (1-D k-means) codebook for block-normalized weights (values in [-1, 1]).

    Starts from :func:`normal_float_codebook`, runs on an evenly strided sample of at most
    ``sample`` values, keeps entries in [-1, 1], rounds them to bf16 (what the tensor-core
    kernels hold) and keeps them distinct; deterministic for a given tensor.
    """
    return weighted_codebook(normalized, None, bits, iters, sample)


def weighted_codebook(normalized: torch.Tensor, weights: torch.Tensor | None, bits: int, iters: int = 25,
                      sample: int = 1 << 22) -> torch.Tensor:
    """:func:`fit_codebook` with a weight per value (GPTQ passes each column's Hessian diagonal: the
    output error a unit of rounding error in that column costs); None: every value counts once."""
    v = normalized.reshape(-1)
    w = None if weights is None else weights.reshape(-1)
    if v.numel() > sample:
        step = v.numel() // sample
        v = v[::step][:sample]
        w = None if w is None else w[::step][:sample]
    v = v.to(torch.float32)
    w = torch.ones_like(v) if w is None else w.to(torch.float32)
    c = normal_float_codebook(bits).to(v.device)
    for _ in range(iters):
        idx = torch.bucketize(v, (c[1:] + c[:-1]) / 2)
        sums = torch.zeros_like(c).index_add_(0, idx, v * w)
        mass = torch.zeros_like(c).index_add_(0, idx, w)
        c = torch.where(mass > 0, sums / mass.clamp_min(1e-30), c).clamp(-1, 1).sort().values
    return bf16_codebook(c, bits)


def bf16_codebook(c: torch.Tensor, bits: int) -> torch.Tensor:
    """Sorted fitted entries in [-1, 1] rounded to bf16 (what the tensor-core kernels hold), kept
    distinct (bf16 rounding may merge neighbours: each moves up past the previous one); the
    normal-float codebook if that pushes the top entries past +1."""
    vals = c.to(torch.bfloat16).to(torch.float32).tolist()
    for i in range(1, len(vals)):
        if vals[i] <= vals[i - 1]:
            step = max(abs(vals[i - 1]) * 2.0**-7, 2.0**-20)
            vals[i] = float(torch.tensor(vals[i - 1] + step).to(torch.bfloat16))
    out = torch.tensor(vals, dtype=torch.float32, device=c.device)
    if bool((out.abs() > 1).any()):
        return normal_float_codebook(bits).to(c.device)
    return out.contiguous()


def check_codebook(codebook: object, bits: int) -> torch.Tensor:
    check_tensor("codebook", codebook, dtypes=(torch.float32,), dim=1)
    assert isinstance(codebook, torch.Tensor)
    if codebook.numel() != 2**bits:
        raise ValueError(f"codebook must have 2**bits = {2**bits} entries for bits={bits}, got {codebook.numel()}")
    return codebook


def _check_codebook_values(codebook: torch.Tensor) -> None:
    check_finite("codebook", codebook)
    if bool((codebook.abs() > 1).any()):
        raise ValueError("codebook values must lie in [-1, 1]")
    if codebook.unique().numel() != codebook.numel():
        raise ValueError("codebook values must be distinct")


# --------------------------------------------------------------------------- bit planes
def pack_planes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[..., 32]`` (each < 2**bits) -> int32 planes ``[..., bits]``."""
    check_bits(bits)
    check_tensor("codes", codes, dtypes=(torch.uint8,), contiguous=False)
    if codes.dim() == 0 or codes.shape[-1] != BLOCK:
        raise ValueError(f"codes must have a last dimension of {BLOCK}, got shape {tuple(codes.shape)}")
    c = codes.to(torch.int64)
    if c.numel() and int(c.max()) >= 2**bits:
        raise ValueError(f"codes must be < 2**bits = {2**bits}")
    shifts = torch.arange(bits, device=codes.device)
    words = torch.zeros(*codes.shape[:-1], bits, dtype=torch.int64, device=codes.device)
    for j in range(BLOCK):  # 32 vector ops over [..., bits]; memory stays at bits words/block
        words |= ((c[..., j, None] >> shifts) & 1) << j
    words = torch.where(words >= 2**31, words - 2**32, words)  # uint32 pattern -> int32
    return words.to(torch.int32)


def unpack_planes(planes: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 planes ``[..., bits]`` -> uint8 codes ``[..., 32]`` (inverse of :func:`pack_planes`)."""
    check_bits(bits)
    check_tensor("planes", planes, dtypes=(torch.int32,), contiguous=False)
    if planes.dim() == 0 or planes.shape[-1] != bits:
        raise ValueError(f"planes must have a last dimension of bits={bits}, got shape {tuple(planes.shape)}")
    j = torch.arange(BLOCK, dtype=torch.int32, device=planes.device)
    codes = torch.zeros(*planes.shape[:-1], BLOCK, dtype=torch.int32, device=planes.device)
    for b in range(bits):
        codes |= ((planes[..., b, None] >> j) & 1) << b  # arithmetic shift keeps bit j intact
    return codes.to(torch.uint8)


def check_kbit_tensors(planes, absmax, codebook, scale, bits) -> None:
    """Metadata checks for a kbit weight's tensors (cheap; also valid on fake tensors)."""
    check_bits(bits)
    check_tensor("planes", planes, dtypes=(torch.int32,), dim=3)
    n, nblk, nb = planes.shape
    if nb != bits:
        raise ValueError(f"planes must have shape [N, K_in/32, bits={bits}], got {tuple(planes.shape)}")
    if n == 0 or nblk == 0:
        raise ValueError(f"kbit weight must not be empty, got planes of shape {tuple(planes.shape)}")
    check_tensor("absmax", absmax, dtypes=(torch.uint8,), dim=2)
    if tuple(absmax.shape) != (n, nblk):
        raise ValueError(f"absmax must have shape [N, K_in/32] = {(n, nblk)}, got {tuple(absmax.shape)}")
    check_codebook(codebook, bits)
    check_tensor("scale", scale, dtypes=(torch.float32,))
    if scale.numel() != 1 or scale.dim() != 0:
        raise ValueError(f"scale must be a 0-d fp32 tensor, got shape {tuple(scale.shape)}")
    check_same_device(planes=planes, absmax=absmax, codebook=codebook, scale=scale)


# --------------------------------------------------------------------------- quantize
def quantize_codes(weight: torch.Tensor, bits: int = 4, codebook: torch.Tensor | str | None = None):
    """Quantize ``weight[..., N, K_in]`` to codes; one fp32 scale per leading index (per tensor / expert).

    ``codebook``: a tensor of 2**bits values, None (:func:`normal_float_codebook`), or ``"fit"``
    (:func:`fit_codebook` on this tensor's block-normalized weights; one codebook per call).

    Returns ``(codes uint8 [..., N, K_in/32, 32], absmax uint8 [..., N, K_in/32], codebook fp32 [2**bits],
    scale fp32 [...])``. :func:`quantize` packs the codes into bit planes; the modules pack them
    straight into the GPU layout (``tiled.pack_codes``).
    """
    check_bits(bits)
    check_tensor("weight", weight, dtypes=FLOAT_DTYPES, contiguous=False)
    if weight.dim() < 2:
        raise ValueError(f"weight must be [..., N, K_in], got shape {tuple(weight.shape)}")
    n, k_in = weight.shape[-2:]
    if weight.numel() == 0:
        raise ValueError(f"weight must not be empty, got shape {tuple(weight.shape)}")
    if k_in % BLOCK:
        raise ValueError(
            f"weight's input dimension K_in={k_in} must be a multiple of {BLOCK}; "
            f"pad it with zero columns (and the activations with zeros) to {math.ceil(k_in / BLOCK) * BLOCK}"
        )
    check_finite("weight", weight)
    fit = isinstance(codebook, str)
    if fit and codebook != "fit":
        raise ValueError(f"codebook must be a tensor, None (default) or 'fit', got {codebook!r}")
    if codebook is None or fit:
        codebook = normal_float_codebook(bits)
    check_codebook(codebook, bits)
    _check_codebook_values(codebook)
    codebook = codebook.to(weight.device).contiguous()

    lead = weight.shape[:-2]
    w = weight.detach().to(torch.float32).reshape(*lead, n, k_in // BLOCK, BLOCK)
    block_absmax = w.abs().amax(dim=-1)
    gmax = block_absmax.reshape(*lead, -1).amax(dim=-1)
    # Divide by a tensor: CUDA turns `tensor / python_scalar` into a multiply by the rounded
    # reciprocal, which can differ from the CPU's true division in the last bit.
    scale = torch.where(gmax > 0, gmax / torch.full_like(gmax, e4m4.MAX_VALUE), torch.ones_like(gmax)).to(torch.float32)
    absmax = e4m4.encode(block_absmax / scale[..., None, None])
    block_scale = e4m4.decode(absmax) * scale[..., None, None]  # the dequantizer's scale, same fp32 ops

    normalized = torch.where(block_scale[..., None] > 0, w / block_scale[..., None].clamp_min(1e-38), 0.0)
    if fit:
        codebook = fit_codebook(normalized, bits)
    sorted_cb, order = codebook.sort()
    mids = (sorted_cb[1:] + sorted_cb[:-1]) / 2
    codes = order[torch.bucketize(normalized, mids)].to(torch.uint8)  # nearest entry
    return codes, absmax.contiguous(), codebook, scale


# --------------------------------------------------------------------------- reference math
def dequantize_reference(planes, absmax, codebook, scale, bits, dtype=torch.float32) -> torch.Tensor:
    """Reference dequantization -> ``[N, K_in]`` in ``dtype`` (computed in fp32, then rounded)."""
    codes = unpack_planes(planes, bits)  # [N, B, 32]
    block_scale = e4m4.decode(absmax) * scale
    w = codebook[codes.long()] * block_scale[..., None]
    return w.reshape(planes.shape[0], -1).to(dtype)


def linear_reference(x, planes, absmax, codebook, scale, bits) -> torch.Tensor:
    """Reference ``x[M, K_in] @ W^T -> [M, N]`` in x's dtype, accumulated in fp32."""
    w = dequantize_reference(planes, absmax, codebook, scale, bits)
    return (x.to(torch.float32) @ w.t()).to(x.dtype)
