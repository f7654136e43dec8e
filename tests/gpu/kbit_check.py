"""What the kbit kernel tests (GEMV, GEMM) check against: an fp64 product of the reference-dequantized
weights, and a relative norm error that NaN never passes.

Bounds: fp16 <= 1e-3 and bf16 <= 8e-3 (the output's own rounding is ~2.4e-4 / ~2e-3 rms); the default
codebook is exact in fp16/bf16.
"""

import torch

from lowbit.formats import kbit

DTYPES = [torch.float16, torch.bfloat16]
BOUND = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


def dtype_id(d) -> str:
    return str(d).removeprefix("torch.")


def ref(x, q):
    w = kbit.dequantize_reference(*q.to("cpu").tensors(), q.bits).double()
    return x.cpu().double() @ w.t()


def rel(y, expected):
    y = y.cpu().double()
    assert not y.isnan().any(), "NaN in output"
    return ((y - expected).norm() / expected.norm()).item()


def capture(run):
    """Capture ``run()`` in a CUDA graph on a side stream: (graph, the output tensor replays write)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        out = run()
    return g, out

