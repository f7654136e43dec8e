"""Op layer: registration, CPU dispatch to the reference, fake kernels, torch.compile."""

import pytest
import torch

import lowbit
from lowbit.formats import kbit


def _q(gen, n=24, k=96, bits=4):
    return lowbit.quantize_kbit(torch.randn(n, k, generator=gen), bits=bits)


def test_ops_registered():
    assert hasattr(torch.ops.lowbit, "kbit_dequantize")
    assert hasattr(torch.ops.lowbit, "kbit_linear")


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
def test_cpu_dispatch_is_reference(bits, gen):
    q = _q(gen, bits=bits)
    x = torch.randn(3, 96, generator=gen)
    ref = kbit.linear_reference(x, *q.tensors(), bits)
    assert torch.equal(torch.ops.lowbit.kbit_linear(x, *q.tensors(), bits), ref)
    w = kbit.dequantize_reference(*q.tensors(), bits, torch.bfloat16)
    assert torch.equal(torch.ops.lowbit.kbit_dequantize(*q.tensors(), bits, torch.bfloat16), w)


def test_linear_matches_float64_math(gen):
    q = _q(gen)
    x = torch.randn(4, 96, generator=gen)
    w64 = lowbit.dequantize_kbit(q, torch.float32).double()
    ref = x.double() @ w64.t()
    y = lowbit.kbit_linear(x, q)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_output_dtype(dtype, gen):
    q = _q(gen)
    y = lowbit.kbit_linear(torch.randn(2, 96, generator=gen).to(dtype), q)
    assert y.dtype == dtype and y.shape == (2, 24)


def test_opcheck(gen):
    """torch.library.opcheck: schema, fake kernel and dispatch registrations are consistent."""
    q = _q(gen)
    x = torch.randn(2, 96, generator=gen)
    torch.library.opcheck(torch.ops.lowbit.kbit_linear.default, (x, *q.tensors(), 4))
    torch.library.opcheck(torch.ops.lowbit.kbit_dequantize.default, (*q.tensors(), 4, torch.float16))


def test_meta_tensors_shape_only(gen):
    q = _q(gen).to("meta")
    y = lowbit.kbit_linear(torch.empty(5, 96, device="meta"), q)
    assert y.shape == (5, 24) and y.device.type == "meta"
    assert lowbit.dequantize_kbit(q, torch.float16).shape == (24, 96)


def test_torch_compile_fullgraph(gen):
    torch._dynamo.reset()
    q = _q(gen)

    def f(x):
        return lowbit.kbit_linear(x, q).relu() + lowbit.dequantize_kbit(q, torch.float32).sum()

    x = torch.randn(3, 96, generator=gen)
    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    # inductor may sum the dequantized weights in another order: allow fp32 reordering error of
    # that sum (a few eps times the sum of magnitudes), nothing more
    w = lowbit.dequantize_kbit(q, torch.float32)
    atol = 8 * torch.finfo(torch.float32).eps * float(w.abs().sum())
    torch.testing.assert_close(compiled(x), f(x), rtol=1e-5, atol=max(atol, 1e-5))


def test_torch_compile_rejects_bad_shape_at_trace(gen):
    torch._dynamo.reset()
    q = _q(gen)
    compiled = torch.compile(lambda x: lowbit.kbit_linear(x, q), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="x must have shape"):
        compiled(torch.randn(3, 64))


def test_programmatic_launch_is_scoped():
    from lowbit.kernels import device

    before = device._pdl
    with lowbit.programmatic_launch():
        assert device._pdl is True
        with lowbit.programmatic_launch(False):
            assert device._pdl is False
        assert device._pdl is True
    assert device._pdl is before
    with pytest.raises(RuntimeError), lowbit.programmatic_launch():
        raise RuntimeError("restored on error too")
    assert device._pdl is before
