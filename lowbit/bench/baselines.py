"""Reference (fake-)quantizers of other formats, for quality comparisons at similar bytes.

Each maps a weight [N, K] to its dequantized value in fp32 (round to nearest); none is a kernel.
* NF4, blocks of 64 (bitsandbytes' format): absmax per block (fp32 here), the 16 NF4 levels.
* int4 RTN, groups of g (g = 128 or 32): asymmetric min/max per group, 16 levels.
* NVFP4 (lowbit's own format, `lowbit.formats.nvfp4`): E2M1 per element, E4M3 scale per 16, fp32 per
  tensor -- quantize + dequantize of the reference, i.e. exactly the weights an NVFP4 W4A16 kernel uses.
A K not a multiple of the block/group size ends in one shorter group (e.g. SmolLM2's 576 = 4.5 x 128).
"""

from __future__ import annotations

import torch

#: the NF4 levels (QLoRA, Dettmers et al. 2023): normal quantiles with an exact zero.
NF4_LEVELS = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
              -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
              0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
              0.7229568362236023, 1.0)


def _groups(w: torch.Tensor, g: int) -> torch.Tensor:
    """[N, K] -> [N, ceil(K/g), g] in fp32; a ragged last group is padded with NaN (ignored below)."""
    n, k = w.shape
    x = w.detach().float()
    if k % g:
        x = torch.nn.functional.pad(x, (0, g - k % g), value=float("nan"))
    return x.reshape(n, -1, g)


def _ungroup(q: torch.Tensor, shape) -> torch.Tensor:
    return q.reshape(shape[0], -1)[:, : shape[1]]


def nf4(w: torch.Tensor, block: int = 64) -> torch.Tensor:
    x = _groups(w, block)
    absmax = torch.where(x.isnan(), 0.0, x.abs()).amax(-1, keepdim=True).clamp_min(1e-12)
    levels = torch.tensor(NF4_LEVELS, device=w.device)
    idx = torch.bucketize(torch.nan_to_num(x / absmax), (levels[1:] + levels[:-1]) / 2)
    return _ungroup(levels[idx] * absmax, w.shape)


def int4_rtn(w: torch.Tensor, group: int = 128) -> torch.Tensor:
    x = _groups(w, group)
    lo = torch.where(x.isnan(), float("inf"), x).amin(-1, keepdim=True)
    hi = torch.where(x.isnan(), float("-inf"), x).amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    zero = torch.round(-lo / scale)
    q = torch.clamp(torch.round(torch.nan_to_num(x) / scale) + zero, 0, 15)
    return _ungroup((q - zero) * scale, w.shape)


def nvfp4(w: torch.Tensor) -> torch.Tensor:
    from ..formats import nvfp4 as fmt

    return fmt.quantize(w.detach().float()).dequantize(torch.float32)


#: name -> (fake quantizer, bits per weight incl. scales at fp16 metadata)
BASELINES = {
    "nvfp4": (nvfp4, 4 + 8 / 16),
    "nf4-b64": (lambda w: nf4(w, 64), 4 + 16 / 64),
    "int4-g128": (lambda w: int4_rtn(w, 128), 4 + 32 / 128),
    "int4-g32": (lambda w: int4_rtn(w, 32), 4 + 32 / 32),
}
