"""Device facts the launchers need (name, compute capability) and the programmatic-dependent-launch switch."""

from __future__ import annotations

import contextlib
import os

import torch

_props: dict[int, tuple[str, int]] = {}  # device index -> (name, compute capability major)
_pdl = os.environ.get("LOWBIT_PDL", "0") == "1"


@contextlib.contextmanager
def programmatic_launch(enabled: bool = True):
    """Launch lowbit's GEMVs (dense fp16/bf16 and kbit, grouped included) with programmatic
    dependent launch (sm_90+) inside the block.

    Each kernel then starts while its predecessor still runs: its first weight loads (and the kbit
    lookup table) overlap the predecessor's tail, and it waits for the predecessor only before
    reading x (and expert offsets) / writing y; right after that wait it lets the next kernel in
    the stream start. It pays where the neighbours take part too: torch.compile's Triton kernels do
    with ``torch._inductor.config.triton.enable_pdl``, and :func:`lowbit.hf.decode.greedy_decode`
    turns both on for compiled decoding (Llama-3-8B, H100: +4-5% tokens/s; lowbit's kernels alone
    measured no gain). Off by default elsewhere (``LOWBIT_PDL=1`` turns it on); CUDA graphs captured
    inside the block keep the setting.
    """
    global _pdl
    prev, _pdl = _pdl, bool(enabled)
    try:
        yield
    finally:
        _pdl = prev


def _device_props(device: torch.device) -> tuple[str, int]:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _props:
        _props[idx] = (torch.cuda.get_device_name(idx), torch.cuda.get_device_capability(idx)[0])
    return _props[idx]


def gpu_name(device: torch.device) -> str:
    return _device_props(device)[0]


def pdl_supported(device: torch.device) -> bool:
    return _device_props(device)[1] >= 9


def pdl_enabled() -> bool:
    """Whether launches use programmatic dependent launch now (see :func:`programmatic_launch`)."""
    return _pdl
