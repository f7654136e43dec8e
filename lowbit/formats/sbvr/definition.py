"""SBVR (summation of bitvectors, arXiv 2509.18172): the format, defined in PyTorch.

A weight row is cut into groups of ``group`` consecutive input elements (128 by default). A group
holds ``num_sums`` bitvectors (one bit per element each) and one index into the weight's coefficient
cache, a table of ``num_sums``-long fp16 coefficient vectors. Element i of a group is

    w_i = sum_j c_j * bit_j(i)          (c = cache[index of the group]),

so a group has 2^num_sums representation points: the subset sums of its coefficients (the empty
subset gives 0). The element's code ``sum_j bit_j(i) << j`` picks its point; the decoded value is
that sum of the fp16 coefficients computed in fp32 (:func:`points`, the one definition every path uses).

Storage (:class:`SbvrWeight`): ``bitvectors`` int32 ``[N, K / 32, num_sums]`` (word w of plane j of
row n holds bit j of elements 32w .. 32w + 31, element 32w + i in bit i), ``coeff_idx`` int16
``[N, K / group]`` (the cache row, read as unsigned: up to 65,536 lines) and ``cache`` fp16
``[lines, num_sums]``. Bits per weight: ``num_sums + 16 / group`` plus the cache, amortized.

The encoder (:func:`encode`) follows the paper's idea -- each group's coefficients come from a geometric
family c_j = beta + r^j (scaled), chosen to minimise the group's squared error, and groups share
cached coefficient vectors -- in a vectorized form: the family is a fixed grid of ``SHAPES`` shapes
(r, beta) normalised to a unit span of subset sums, times a per-tensor ladder of ``SCALES`` scales
(2^(1/16) apart), so a cache line *is* a (shape, scale) pair and the cache holds the pairs some group
uses. Each group: every shape at the scale its span suggests (one bucketize per shape over the whole
tensor), then the best shape at +-``SCALE_SEARCH`` ladder steps; codes are the nearest points of the
fp16 coefficients actually stored.

The activation side of the authors' kernel (:func:`encode_activations`, :func:`linear_bitplane_reference`):
x is rounded per group to ``act_bits``-bit unsigned integers (x ~ m + s q, RTN, asymmetric), so the
group's inner product is sum_{j,l} c_j s 2^l popc(w_j & x_l) + m sum_j c_j popc(w_j). That is W4A7-style
(weights and activations quantized), not weight-only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

WORD = 32
GROUP = 128
SUPPORTED_NUM_SUMS = (2, 3, 4, 5, 6)
SHAPES = 64          # (r, beta) grid of the coefficient family
SCALES = 256         # scale ladder, 2^(1/16) apart: 16 octaves
SCALE_STEPS_PER_OCTAVE = 16
SCALE_SEARCH = 3     # ladder steps tried around the span's scale
MAX_LINES = 1 << 16  # coeff_idx is 16-bit
ACT_GROUP = 128     # largest activation group of the bit-plane product


def check_num_sums(num_sums: object) -> int:
    if isinstance(num_sums, bool) or num_sums not in SUPPORTED_NUM_SUMS:
        raise ValueError(f"num_sums must be one of {SUPPORTED_NUM_SUMS}, got {num_sums!r}")
    return int(num_sums)


def check_group(group: object) -> int:
    # a power of two: the kernels turn group indices into shifts (32, 64 and 128 are what models use)
    if isinstance(group, bool) or not isinstance(group, int) or group < WORD or group & (group - 1):
        raise ValueError(f"group must be a power of two >= {WORD}, got {group!r}")
    return group


def subsets(num_sums: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """``[2^num_sums, num_sums]``: row k holds the bits of k (bit j in column j)."""
    k = torch.arange(1 << num_sums, device=device)
    return ((k[:, None] >> torch.arange(num_sums, device=device)) & 1).to(dtype)


def points(coeffs: torch.Tensor) -> torch.Tensor:
    """Subset sums ``[..., 2^num_sums]`` of coefficient vectors ``[..., num_sums]``, in fp32; point k is
    what code k decodes to."""
    c = coeffs.to(torch.float32)
    return c @ subsets(c.shape[-1], c.device).t()


def shape_family(num_sums: int, device=None) -> torch.Tensor:
    """The ``SHAPES`` normalised coefficient vectors ``[SHAPES, num_sums]`` (fp32): c_j = beta + r^j over a
    grid of negative ratios r (|r| in [0.5, 0.95] and [1.1, 2.1], the ranges the authors search) and
    offsets beta in [-0.6, 0.6], each scaled so its subset sums span 1. Coefficients sorted by magnitude
    (the bit order of the codes)."""
    r = torch.cat([-torch.linspace(0.5, 0.95, 4), -torch.linspace(1.1, 2.1, 4)]).to(torch.float64)
    beta = torch.linspace(-0.6, 0.6, SHAPES // len(r), dtype=torch.float64)
    j = torch.arange(num_sums, dtype=torch.float64)
    c = (beta[:, None, None] + r[None, :, None] ** j).reshape(-1, num_sums)
    p = c @ subsets(num_sums, dtype=torch.float64).t()
    span = p.amax(-1) - p.amin(-1)
    c = c / span[:, None]
    order = c.abs().argsort(-1)
    return torch.gather(c, -1, order).to(torch.float32).to(device)


def scale_ladder(top: float, device=None) -> torch.Tensor:
    """``SCALES`` scales, ``top`` down by 2^(1/16) per step (fp32)."""
    return top * torch.exp2(-torch.arange(SCALES, device=device, dtype=torch.float32) / SCALE_STEPS_PER_OCTAVE)


def _nearest(values: torch.Tensor, pts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(code, squared error) of each value against its row's points: values ``[R, L]``, pts ``[R, P]``
    (any order). Ties go to the lower point."""
    srt, order = pts.sort(-1)
    mids = (srt[..., 1:] + srt[..., :-1]) * 0.5
    pos = torch.searchsorted(mids.contiguous(), values.contiguous(), right=False)
    code = torch.gather(order, -1, pos)
    err = (values - torch.gather(srt, -1, pos)) ** 2
    return code, err


class Lines:
    """The candidate cache lines of one tensor: ``SHAPES`` shapes x ``SCALES`` ladder scales, as stored
    (fp16), the ladder's top fixed from the tensor as given (1.25 x its largest group span)."""

    def __init__(self, weight: torch.Tensor, num_sums: int, group: int):
        self.num_sums, self.group = check_num_sums(num_sums), check_group(group)
        w = weight.detach().to(torch.float32)
        dev = w.device
        span = w.reshape(-1, group).aminmax(dim=-1)
        self.top = float((span.max - span.min).max()) * 1.25 or 1.0
        self.ladder = scale_ladder(self.top, dev)
        self.family = shape_family(num_sums, dev)
        self.family_points = points(self.family)  # [SHAPES, P], span 1
        self.values = (self.ladder[None, :, None] * self.family[:, None, :]).to(torch.float16).reshape(-1, num_sums)

    def choose(self, g: torch.Tensor, importance: torch.Tensor | None = None) -> torch.Tensor:
        """The line (shape * SCALES + scale) for each group ``g [G, group]``: every shape at the scale the
        group's span suggests (one bucketize per shape, shared boundaries), then the best shape at
        +-SCALE_SEARCH ladder steps with the stored fp16 coefficients; squared error weighted by
        ``importance [group]`` when given."""
        dev = g.device
        span = (g.amax(-1) - g.amin(-1)).clamp_min(self.top * 2.0 ** (-SCALES / SCALE_STEPS_PER_OCTAVE))
        b0 = torch.round(torch.log2(self.top / span) * SCALE_STEPS_PER_OCTAVE).clamp(0, SCALES - 1).to(torch.int64)
        gn = g / self.ladder[b0][:, None]
        imp = torch.ones(g.shape[-1], device=dev) if importance is None else importance.to(dev, torch.float32)
        best_err = torch.full((g.shape[0],), float("inf"), device=dev)
        best_shape = torch.zeros(g.shape[0], dtype=torch.int64, device=dev)
        for a in range(self.family.shape[0]):
            srt = self.family_points[a].sort().values
            err = (((gn - srt[torch.bucketize(gn, (srt[1:] + srt[:-1]) * 0.5)]) ** 2) * imp).sum(-1)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_shape = torch.where(better, a, best_shape)
        best_err = torch.full((g.shape[0],), float("inf"), device=dev)
        best_b = b0.clone()
        for db in range(-SCALE_SEARCH, SCALE_SEARCH + 1):
            b = (b0 + db).clamp(0, SCALES - 1)
            _, err = _nearest(g, points(self.values[best_shape * SCALES + b]))
            err = (err * imp).sum(-1)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_b = torch.where(better, b, best_b)
        return best_shape * SCALES + best_b

    def nearest(self, values: torch.Tensor, lines: torch.Tensor) -> torch.Tensor:
        """Codes of ``values [R, L]`` against the points of ``lines [R]``."""
        return _nearest(values, points(self.values[lines]))[0]

    def cache(self, lines: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(coeff_idx int64 like ``lines``, cache fp16 [used lines, num_sums]): the lines some group uses."""
        used, idx = torch.unique(lines, return_inverse=True)
        return idx, self.values[used]


def encode(weight: torch.Tensor, num_sums: int = 4, group: int = GROUP, *, chunk_groups: int = 1 << 16,
           progress: Callable[[int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode ``weight [N, K]`` (K a multiple of ``group``): returns ``(codes uint8 [N, K], coeff_idx int64
    [N, K / group], cache fp16 [lines, num_sums])``. ``progress(rows_done)`` is called per chunk."""
    num_sums, group = check_num_sums(num_sums), check_group(group)
    if weight.dim() != 2 or weight.shape[1] % group:
        raise ValueError(f"weight must be [N, K] with K a multiple of group={group}, got {tuple(weight.shape)}")
    w = weight.detach().to(torch.float32)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weight has NaN or Inf entries")
    n, k = w.shape
    lines = Lines(w, num_sums, group)
    groups = w.reshape(-1, group)
    line_of = torch.empty(groups.shape[0], dtype=torch.int64, device=w.device)
    codes = torch.empty(groups.shape, dtype=torch.uint8, device=w.device)
    for g0 in range(0, groups.shape[0], chunk_groups):
        g = groups[g0:g0 + chunk_groups]
        line = lines.choose(g)
        line_of[g0:g0 + chunk_groups] = line
        codes[g0:g0 + chunk_groups] = lines.nearest(g, line).to(torch.uint8)
        if progress is not None:
            progress(min(g0 + chunk_groups, groups.shape[0]) // (k // group))
    idx, cache = lines.cache(line_of)
    return codes.reshape(n, k), idx.reshape(n, k // group), cache


def pack_bits(codes: torch.Tensor, num_sums: int) -> torch.Tensor:
    """``codes uint8 [N, K]`` (K a multiple of 32) -> bitvectors int32 ``[N, K / 32, num_sums]``."""
    n, k = codes.shape
    if k % WORD:
        raise ValueError(f"K must be a multiple of {WORD}, got {k}")
    c = codes.to(torch.int64).reshape(n, k // WORD, WORD)
    shifts = torch.arange(WORD, device=codes.device, dtype=torch.int64)
    planes = [(((c >> j) & 1) << shifts).sum(-1) for j in range(num_sums)]
    words = torch.stack(planes, -1)  # < 2^32
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def unpack_bits(bitvectors: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: codes uint8 ``[N, K]``."""
    n, words, num_sums = bitvectors.shape
    v = bitvectors.to(torch.int64) & 0xFFFFFFFF
    bits = (v[:, :, None, :] >> torch.arange(WORD, device=v.device)[None, None, :, None]) & 1  # [N, W, 32, ns]
    code = (bits << torch.arange(num_sums, device=v.device)).sum(-1)
    return code.reshape(n, words * WORD).to(torch.uint8)


def check_sbvr_tensors(bitvectors: torch.Tensor, coeff_idx: torch.Tensor, cache: torch.Tensor, group: int) -> None:
    """Shapes, dtypes and values a stored SBVR weight must have (ValueError / TypeError naming the tensor)."""
    check_group(group)
    for name, t, dt in (("bitvectors", bitvectors, torch.int32), ("coeff_idx", coeff_idx, torch.int16),
                        ("cache", cache, torch.float16)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dt:
            raise TypeError(f"{name} must have dtype {str(dt).removeprefix('torch.')}, got {str(t.dtype).removeprefix('torch.')}")
    if bitvectors.dim() != 3:
        raise ValueError(f"bitvectors must be [N, K/32, num_sums], got {tuple(bitvectors.shape)}")
    n, words, num_sums = bitvectors.shape
    check_num_sums(num_sums)
    k = words * WORD
    if k % group:
        raise ValueError(f"K = {k} (from bitvectors) is not a multiple of group={group}")
    if tuple(coeff_idx.shape) != (n, k // group):
        raise ValueError(f"coeff_idx must be [N, K/group] = {(n, k // group)}, got {tuple(coeff_idx.shape)}")
    if cache.dim() != 2 or cache.shape[1] != num_sums or not 1 <= cache.shape[0] <= MAX_LINES:
        raise ValueError(f"cache must be [1..{MAX_LINES} lines, num_sums={num_sums}], got {tuple(cache.shape)}")
    if not bool(torch.isfinite(cache).all()):
        raise ValueError("cache has NaN or Inf coefficients")
    if coeff_idx.numel() and int((coeff_idx.to(torch.int32) & 0xFFFF).max()) >= cache.shape[0]:
        raise ValueError(f"coeff_idx points past the cache ({cache.shape[0]} lines)")


def decode(bitvectors: torch.Tensor, coeff_idx: torch.Tensor, cache: torch.Tensor, group: int,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight ``[N, K]``: each element's subset sum in fp32, rounded once to ``dtype``."""
    codes = unpack_bits(bitvectors).to(torch.int64)
    n, k = codes.shape
    lines = (coeff_idx.to(torch.int64) & 0xFFFF)
    pts = points(cache)[lines]                                   # [N, K/group, P]
    w = torch.gather(pts, -1, codes.reshape(n, k // group, group))
    return w.reshape(n, k).to(dtype)


def encode_activations(x: torch.Tensor, bits: int = 7, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The authors' activation encoding: per group of ``group`` elements, x ~ m + s q with q in
    [0, 2^bits - 1] rounded to nearest (asymmetric RTN). Returns ``(q int64 [..., K], s, m)`` with s and
    m fp32 ``[..., K / group]``; a constant group gets s = 1 and q = 0."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
        raise ValueError(f"bits must be an int in 1..16, got {bits!r}")
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"x's last dimension {k} is not a multiple of group={group}")
    g = x.to(torch.float32).reshape(*x.shape[:-1], k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    s = (hi - lo) / torch.full_like(hi, (1 << bits) - 1)  # a tensor divisor: IEEE division on every device
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round((g - lo[..., None]) / s[..., None]).clamp(0, (1 << bits) - 1).to(torch.int64)
    return q.reshape(x.shape), s, lo


def rtn_activations(x: torch.Tensor, bits: int = 7, group: int = GROUP) -> torch.Tensor:
    """x as the bit-plane product sees it: ``m + s q`` (:func:`encode_activations`), fp32, x's shape."""
    q, s, lo = encode_activations(x, bits, group)
    return (lo.repeat_interleave(group, -1) + s.repeat_interleave(group, -1) * q.to(torch.float32)).reshape(x.shape)


def linear_reference(x: torch.Tensor, bitvectors, coeff_idx, cache, group: int, bias=None) -> torch.Tensor:
    """``x @ W^T (+ bias)`` in fp32 from the decoded weight, rounded once to x's dtype (exact product)."""
    w = decode(bitvectors, coeff_idx, cache, group)
    y = x.to(torch.float32) @ w.t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def act_group(group: int) -> int:
    """The activations' group of the bit-plane product: the weight group up to 128 (the GEMV's binary MMA
    covers 128 inputs and takes one (s, m) each)."""
    return min(check_group(group), ACT_GROUP)


def linear_bitplane_reference(x: torch.Tensor, bitvectors, coeff_idx, cache, group: int, act_bits: int = 7) -> torch.Tensor:
    """The authors' product, written as it computes: activations as ``act_bits`` bit-planes per activation
    group (:func:`act_group`), each group's result sum_{j,l} c_j s 2^l popc(w_j & x_l) + m sum_j c_j popc(w_j),
    in fp32, rounded once to x's dtype. Equals ``x_hat @ W^T`` with x_hat the RTN activations
    (:func:`encode_activations`)."""
    if x.shape[-1] != bitvectors.shape[1] * WORD:
        raise ValueError(f"x must have shape [..., K={bitvectors.shape[1] * WORD}], got {tuple(x.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    ag = act_group(group)
    q, s, m = encode_activations(x2, act_bits, ag)
    n, words, num_sums = bitvectors.shape
    k = words * WORD
    na = k // ag
    codes = unpack_bits(bitvectors).to(torch.int64).reshape(n, na, ag)
    wbits = ((codes[..., None] >> torch.arange(num_sums, device=codes.device)) & 1).to(torch.float32)  # [N, A, L, ns]
    xbits = ((q.reshape(-1, na, ag)[..., None] >> torch.arange(act_bits, device=q.device)) & 1).to(torch.float32)
    popc = torch.einsum("naij,mail->mnajl", wbits, xbits)        # popc(w_j & x_l) per act group: [M, N, A, ns, bits]
    popw = wbits.sum(2)                                          # popc(w_j): [N, A, ns]
    weight_group = torch.arange(na, device=x.device) * ag // group
    c = cache.to(torch.float32)[coeff_idx.to(torch.int64)[:, weight_group] & 0xFFFF]  # [N, A, ns]
    pow2 = torch.exp2(torch.arange(act_bits, dtype=torch.float32, device=x.device))
    y = torch.einsum("mnajl,naj,l,ma->mn", popc, c, pow2, s) + torch.einsum("naj,naj,ma->mn", popw, c, m)
    return y.reshape(*lead, n).to(x.dtype)


__all__ = ["ACT_GROUP", "GROUP", "act_group", "SUPPORTED_NUM_SUMS", "WORD", "check_group", "check_num_sums",
           "MAX_LINES", "check_sbvr_tensors", "decode", "encode", "encode_activations", "linear_bitplane_reference",
           "linear_reference", "pack_bits", "points", "rtn_activations", "scale_ladder", "shape_family", "subsets", "unpack_bits"]
