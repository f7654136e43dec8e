"""Bad input raises a clear ValueError/TypeError naming the argument — never garbage."""

import pytest
import torch

import lowbit
from lowbit import ops


@pytest.fixture
def q(gen):
    return lowbit.quantize_kbit(torch.randn(16, 64, generator=gen), bits=4)


# ------------------------------------------------------------------ quantize
@pytest.mark.parametrize(
    "weight, exc, match",
    [
        (torch.randn(16, 48), ValueError, "multiple of 32"),
        (torch.randn(64), ValueError, "weight must be 2-D"),
        (torch.randn(2, 16, 64), ValueError, "weight must be 2-D"),
        (torch.zeros(0, 64), ValueError, "must not be empty"),
        (torch.zeros(16, 0), ValueError, "must not be empty"),
        (torch.randint(0, 5, (16, 64)), TypeError, "weight must have dtype"),
        (torch.randn(16, 64, dtype=torch.float64), TypeError, "weight must have dtype"),
        ([[1.0] * 32], TypeError, "weight must be a torch.Tensor"),
    ],
)
def test_quantize_bad_weight(weight, exc, match):
    with pytest.raises(exc, match=match):
        lowbit.quantize_kbit(weight, bits=4)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_quantize_rejects_non_finite(bad):
    w = torch.randn(16, 64)
    w[3, 7] = bad
    with pytest.raises(ValueError, match="weight must be finite; found 1 NaN/Inf"):
        lowbit.quantize_kbit(w, bits=4)


@pytest.mark.parametrize("bits", [0, 1, 6, 8, 4.0, "4", True, None])
def test_quantize_rejects_bits(bits):
    with pytest.raises(ValueError, match="bits must be one of"):
        lowbit.quantize_kbit(torch.randn(16, 64), bits=bits)


@pytest.mark.parametrize(
    "codebook, exc, match",
    [
        (torch.linspace(-1, 1, 8), ValueError, "16 entries"),
        (torch.linspace(-2, 2, 16), ValueError, r"\[-1, 1\]"),
        (torch.zeros(16), ValueError, "distinct"),
        (torch.linspace(-1, 1, 16).double(), TypeError, "codebook must have dtype"),
        (torch.full((16,), float("nan")), ValueError, "codebook must be finite"),
    ],
)
def test_quantize_bad_codebook(codebook, exc, match):
    with pytest.raises(exc, match=match):
        lowbit.quantize_kbit(torch.randn(16, 64), bits=4, codebook=codebook)


def test_quantize_accepts_non_contiguous_weight(gen):
    w = torch.randn(64, 32, generator=gen).t()  # [32, 64], transposed view
    assert not w.is_contiguous()
    a = lowbit.dequantize_kbit(lowbit.quantize_kbit(w, bits=4), torch.float32)
    b = lowbit.dequantize_kbit(lowbit.quantize_kbit(w.contiguous(), bits=4), torch.float32)
    assert torch.equal(a, b)


# ------------------------------------------------------------------ linear / dequantize
def test_linear_bad_x(q):
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., K_in=64\] to match the weight"):
        lowbit.kbit_linear(torch.randn(2, 32), q)
    with pytest.raises(TypeError, match="x must have dtype"):
        lowbit.kbit_linear(torch.randn(2, 64).double(), q)
    with pytest.raises(TypeError, match="x must have dtype"):
        lowbit.kbit_linear(torch.ones(2, 64, dtype=torch.int32), q)
    with pytest.raises(ValueError, match="x must be contiguous"):
        lowbit.kbit_linear(torch.randn(64, 2).t(), q)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        lowbit.kbit_linear([1.0] * 64, q)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., K_in=64\]"):
        lowbit.kbit_linear(torch.tensor(1.0), q)


def test_linear_bad_weight_object():
    with pytest.raises(TypeError, match="w must be a lowbit KbitWeight"):
        lowbit.kbit_linear(torch.randn(2, 64), torch.randn(16, 64))


def test_linear_empty_batch_gives_empty_result(q):
    y = lowbit.kbit_linear(torch.randn(0, 64), q)
    assert y.shape == (0, 16)


def test_linear_leading_dims(q, gen):
    x = torch.randn(2, 3, 64, generator=gen)
    y = lowbit.kbit_linear(x, q)
    assert y.shape == (2, 3, 16)
    assert torch.equal(y, lowbit.kbit_linear(x.reshape(6, 64), q).reshape(2, 3, 16))


def test_dequantize_bad_dtype(q):
    with pytest.raises(TypeError, match="dtype must be one of"):
        lowbit.dequantize_kbit(q, torch.int8)


def test_ops_check_tensor_consistency(q):
    p, a, c, s = q.tensors()
    with pytest.raises(ValueError, match="planes must have shape"):
        ops.kbit_dequantize(p, a, c, s, 3, torch.float16)  # bits disagree with planes
    with pytest.raises(ValueError, match="absmax must have shape"):
        ops.kbit_dequantize(p, a[:, :1].contiguous(), c, s, 4, torch.float16)
    with pytest.raises(ValueError, match="codebook must have 2\\*\\*bits = 16"):
        ops.kbit_dequantize(p, a, c[:8].contiguous(), s, 4, torch.float16)
    with pytest.raises(ValueError, match="scale must be a 0-d"):
        ops.kbit_dequantize(p, a, c, s.reshape(1), 4, torch.float16)
    with pytest.raises(TypeError, match="planes must have dtype"):
        ops.kbit_dequantize(p.to(torch.int64), a, c, s, 4, torch.float16)
    with pytest.raises(ValueError, match="planes must be contiguous"):
        ops.kbit_dequantize(p.transpose(0, 1), a, c, s, 4, torch.float16)
    with pytest.raises(ValueError, match="must not be empty"):
        ops.kbit_dequantize(p[:0], a[:0], c, s, 4, torch.float16)


def test_device_mismatch(q):
    p, a, c, s = q.tensors()
    with pytest.raises(ValueError, match="same device"):
        ops.kbit_dequantize(p, a, c, s.to("meta"), 4, torch.float16)
    with pytest.raises(ValueError, match="same device"):
        ops.kbit_linear(torch.randn(2, 64, device="meta"), p, a, c, s, 4)


def test_kernel_error_clears_the_runtime_error_before_raising():
    """A failed lowbit launch is raised as RuntimeError naming the kernel and CUDA's message, after the library's
    lowbit_clear_error() call: the failed CUDA call's error must not stay behind for the next launch to report as its
    own (tests/gpu/test_kbit_gemv_gpu.py makes a real one)."""
    from lowbit.kernels.library import Library

    calls = []

    class FakeDll:
        def lowbit_clear_error(self):
            calls.append("clear")
            return 1

        def lowbit_error_string(self, err):
            calls.append("string")
            return b"invalid argument"

    lib = Library.__new__(Library)
    lib._dll = FakeDll()
    with pytest.raises(RuntimeError, match=r"lowbit CUDA kernel kbit_gemv\{\} failed: invalid argument \(cudaError 1\)"):
        lib.raise_error("kbit_gemv{}", 1)
    assert calls == ["clear", "string"]
