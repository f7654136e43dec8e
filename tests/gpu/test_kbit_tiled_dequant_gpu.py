"""kbit dequantize from the tiled layout (csrc/kbit/tiled_dequant.cu): bit for bit the reference
(lowbit.formats.kbit_tiled.dequantize), every output written and nothing past it."""

import pytest
import torch

import lowbit
from lowbit import ops
from lowbit.formats import kbit
from lowbit.formats.kbit import tiled as kbit_tiled
from lowbit.kernels.library import get_library, ptr, stream_of

pytestmark = pytest.mark.gpu
DTYPES = [torch.float16, torch.bfloat16]
ids_ = lambda d: str(d).removeprefix("torch.")  # noqa: E731


def _tiled(gen, bits, n=None, k_in=None):
    n = n or int(torch.randint(1, 300, (1,), generator=gen))
    k_in = k_in or 32 * int(torch.randint(1, 40, (1,), generator=gen))
    # rows of very different magnitude exercise every E4M4 binade, subnormals included
    w = torch.randn(n, k_in, generator=gen) * 2.0 ** torch.randint(-20, 4, (n, 1), generator=gen).float()
    codes, absmax, codebook, scale = kbit.quantize_codes(w, bits)
    qweight, qabsmax = kbit_tiled.pack_codes(codes, absmax, bits)
    return [t.cuda() for t in (qweight, qabsmax, codebook, scale)], n, k_in


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_)
def test_kernel_bit_exact_with_poisoned_output(bits, dtype, gen):
    """The C entry on a NaN-poisoned buffer with a guard tail: odd n, K_in % 256 != 0 (padded groups)."""
    for n, k_in in [(None, None), (None, None), (1, 32), (37, 800), (16, 256)]:
        (qw, qa, cb, sc), n, k_in = _tiled(gen, bits, n, k_in)
        guard = 128
        buf = torch.full((n * k_in + guard,), float("nan"), dtype=dtype, device="cuda")
        get_library().call("kbit_tiled_dequant", [ptr(qw), ptr(qa), ptr(cb), ptr(sc), ptr(buf), n, k_in,
                                                  stream_of(buf.device)], bits=bits, dtype=dtype)
        torch.cuda.synchronize()
        want = kbit_tiled.dequantize(qw.cpu(), qa.cpu(), cb.cpu(), sc.cpu(), bits, n, k_in, dtype)
        assert torch.equal(buf[: n * k_in].view(n, k_in).cpu(), want), (n, k_in)
        assert torch.isnan(buf[n * k_in:]).all(), "wrote past the output"


@pytest.mark.parametrize("dtype", DTYPES + [torch.float32], ids=ids_)
def test_op_matches_reference(dtype, gen):
    (qw, qa, cb, sc), n, k_in = _tiled(gen, 3)
    got = ops.kbit_tiled_dequantize(qw, qa, cb, sc, 3, n, k_in, dtype)
    want = kbit_tiled.dequantize(qw.cpu(), qa.cpu(), cb.cpu(), sc.cpu(), 3, n, k_in, dtype)
    assert got.dtype == dtype and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_)
def test_large_m_linear_uses_it(dtype, gen):
    """KbitLinear at M > 4 (tiled dequantize kernel + cuBLAS) against the fp32 reference."""
    lin = torch.nn.Linear(800, 333, bias=True)
    q = lowbit.nn.KbitLinear.from_linear(lin, bits=4).to(dtype).cuda()
    x = torch.randn(57, 800, generator=gen)
    got = q(x.to(dtype).cuda()).float().cpu()
    want = ops.tiled_linear_reference(x.to(dtype).float(), q.qweight.cpu(), q.qabsmax.cpu(), q.codebook.cpu(),
                                      q.scale.cpu(), 4, 333, 800, q.bias.float().cpu())
    assert torch.isfinite(got).all()
    assert float((got - want).norm() / want.norm()) < {torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
