"""SBVR on CUDA: the encoder runs where the weight is, the module's forward (decode + cuBLAS) matches the CPU
reference and captures in a CUDA graph (nothing in it reads values back)."""

import pytest
import torch

import lowbit

from ..tiny_models import build, rel_err
from .kbit_check import capture

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sbvr_module_on_cuda_matches_reference_and_captures(dtype, gen):
    lin = torch.nn.Linear(512, 300)
    lin.weight.data = torch.randn(300, 512, generator=gen) * 0.05
    q = lowbit.quantize_sbvr(lin.weight.detach().cuda(), num_sums=4)   # encoded on the GPU
    assert q.device.type == "cuda" and rel_err(q.dequantize().cpu(), lin.weight.detach()) < 0.13
    mod = lowbit.nn.SbvrLinear.from_weight(q, lin.bias.detach().cuda()).to(dtype=dtype)
    x = torch.randn(3, 512, generator=gen).to(dtype).cuda()
    want = x.float().cpu() @ q.dequantize().cpu().t() + lin.bias.detach()
    y = mod(x)
    assert y.dtype == dtype and rel_err(y.float().cpu(), want) < 1e-2
    g, out = capture(lambda: mod(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)


def test_sbvr_model_on_cuda(gen):
    m = build("llama", int(torch.randint(0, 2**31 - 1, (1,), generator=gen)), dtype=torch.bfloat16, device="cuda")
    report = lowbit.quantize_model(m, format="sbvr", bits=3, progress=False)
    assert report.device.startswith("cuda")
    with torch.no_grad():
        out = m(torch.randint(0, 320, (2, 16), generator=gen).cuda()).logits
    assert torch.isfinite(out).all()
