"""kbit dequantize kernel on CUDA: bit-for-bit equal to the reference, every output written."""

import warnings

import pytest
import torch

import lowbit
from lowbit.formats import kbit
from lowbit.kernels.library import get_library, ptr, stream_of

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _random_weight(gen, bits):
    n = int(torch.randint(1, 300, (1,), generator=gen))
    k_in = 32 * int(torch.randint(1, 48, (1,), generator=gen))
    # rows of very different magnitude exercise every E4M4 binade, subnormals included
    w = torch.randn(n, k_in, generator=gen) * 2.0 ** torch.randint(-20, 4, (n, 1), generator=gen).float()
    return lowbit.quantize_kbit(w, bits=bits)


def test_library_loads_for_this_gpu():
    lib = get_library()
    assert lib.path.exists()


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_kernel_bit_exact_with_poisoned_output(bits, dtype, gen):
    """Call the C entry directly on a NaN-poisoned buffer with a poisoned guard tail."""
    for _ in range(3):
        q = _random_weight(gen, bits).to("cuda")
        n, k_in = q.shape
        guard = 64
        buf = torch.full((n * k_in + guard,), float("nan"), dtype=dtype, device="cuda")
        lib = get_library()
        planes, absmax, codebook, scale = q.tensors()
        lib.call(
            "kbit_dequant",
            [ptr(planes), ptr(absmax), ptr(codebook), ptr(scale), ptr(buf), n * (k_in // 32), stream_of(buf.device)],
            bits=bits,
            dtype=dtype,
        )
        torch.cuda.synchronize()
        out = buf[: n * k_in].view(n, k_in)
        ref = kbit.dequantize_reference(*q.to("cpu").tensors(), bits, dtype)
        assert not out.isnan().any(), "some outputs were never written"
        assert torch.equal(out.cpu(), ref), f"mismatch at N={n} K_in={k_in}"
        assert buf[n * k_in :].isnan().all(), "kernel wrote past the end of the output"


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
def test_op_on_cuda_uses_kernel_and_matches(bits, gen):
    q = _random_weight(gen, bits).to("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to the reference would warn
        out = lowbit.dequantize_kbit(q, torch.float16)
    assert out.device.type == "cuda"
    assert torch.equal(out.cpu(), kbit.dequantize_reference(*q.to("cpu").tensors(), bits, torch.float16))


def test_large_tensor_grid_stride(gen):
    """More blocks than one grid pass covers (grid is capped), 8192 x 28672 at K=4."""
    w = torch.randn(8192, 28672, device="cuda", dtype=torch.float16)
    q = lowbit.quantize_kbit(w, bits=4)
    out = lowbit.dequantize_kbit(q, torch.bfloat16)
    ref = kbit.dequantize_reference(*q.tensors(), 4, torch.bfloat16)  # reference runs on CUDA too
    assert torch.equal(out, ref)


def test_cuda_graph_capture(gen):
    q = _random_weight(gen, 4).to("cuda")
    lowbit.dequantize_kbit(q, torch.float16)  # warm-up (loads the library) outside capture
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            out = lowbit.dequantize_kbit(q, torch.float16)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, kbit.dequantize_reference(*q.tensors(), 4, torch.float16))


def test_linear_on_cuda_matches_cpu(gen):
    q = _random_weight(gen, 3)
    x = torch.randn(4, q.shape[1], generator=gen).half()
    y_cpu = lowbit.kbit_linear(x, q)
    y_gpu = lowbit.kbit_linear(x.cuda(), q.to("cuda"))
    ref = x.double() @ lowbit.dequantize_kbit(q, torch.float32).double().t()
    for y in (y_cpu, y_gpu.cpu()):
        assert not y.isnan().any()
        assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3  # fp16 output rounding
