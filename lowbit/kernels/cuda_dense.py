"""CUDA implementation of ``lowbit::dense_gemv`` (fp16/bf16 decode GEMV, tuned launch configs)."""

from __future__ import annotations

import torch

from .. import ops, tuning
from .library import library_or_none, ptr, stream_of

_gpu_names: dict[int, str] = {}


def gpu_name(device: torch.device) -> str:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _gpu_names:
        _gpu_names[idx] = torch.cuda.get_device_name(idx)
    return _gpu_names[idx]


def vector_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The tuned vector kernel reads 16-byte vectors: K % 8 == 0 and 16-byte aligned x and W."""
    return weight.shape[1] % 8 == 0 and x.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0


def launch(lib, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, cfg: tuning.GemvConfig | None) -> None:
    """Run the vector kernel with ``cfg`` (or the scalar kernel when cfg is None) into y."""
    m = x.shape[0]
    n, k = weight.shape
    stream = stream_of(x.device)
    if cfg is None:
        lib.call("dense_gemv_scalar", [ptr(x), ptr(weight), ptr(y), n, k, stream], dtype=x.dtype, m=m)
    else:
        lib.call("dense_gemv", [ptr(x), ptr(weight), ptr(y), n, k, cfg.tpr, cfg.threads, stream],
                 dtype=x.dtype, m=m, rows=cfg.rows, unroll=cfg.unroll, prefetch=cfg.prefetch)


@ops.dense_gemv.register_kernel("cuda")
def _(x, weight):
    m, n, k = ops.check_dense_gemv_args(x, weight)
    lib = library_or_none(x.device)
    if lib is None:
        return torch.nn.functional.linear(x, weight)  # cuBLAS: correct, just not the tuned kernel
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    cfg = tuning.lookup(gpu_name(x.device), x.dtype, m, n, k)[0] if vector_ok(x, weight) else None
    launch(lib, x, weight, y, cfg)
    return y
