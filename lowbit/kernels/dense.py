"""CUDA implementation of ``lowbit::dense_gemv`` (fp16/bf16 decode GEMV, tuned launch configs)."""

from __future__ import annotations

import ctypes

import torch

from .. import ops, tuning
from .device import gpu_name, pdl_enabled, pdl_supported
from .library import library_or_none, ptr, register_signatures, stream_of

_P, _I = ctypes.c_void_p, ctypes.c_int
register_signatures({
    # x, w, y, n, k, tpr, threads, pdl (0/1), stream
    "dense_gemv": [_P, _P, _P, _I, _I, _I, _I, _I, _P],
    # x, w, y, n, k, stream
    "dense_gemv_scalar": [_P, _P, _P, _I, _I, _P],
})

def vector_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The tuned vector kernel reads 16-byte vectors: K % 8 == 0 and 16-byte aligned x and W."""
    return weight.shape[1] % 8 == 0 and x.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0


def launch(lib, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, cfg: tuning.GemvConfig | None,
           pdl: bool | None = None) -> None:
    """Run the vector kernel with ``cfg`` (or the scalar kernel when cfg is None) into y.
    ``pdl``: programmatic dependent launch (None: the :func:`programmatic_launch` setting;
    ignored below sm_90 and by the scalar kernel)."""
    m = x.shape[0]
    n, k = weight.shape
    stream = stream_of(x.device)
    if cfg is None:
        lib.call("dense_gemv_scalar", [ptr(x), ptr(weight), ptr(y), n, k, stream], dtype=x.dtype, m=m)
    else:
        use_pdl = (pdl_enabled() if pdl is None else pdl) and pdl_supported(x.device)
        lib.call("dense_gemv", [ptr(x), ptr(weight), ptr(y), n, k, cfg.tpr, cfg.threads, int(use_pdl), stream],
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
