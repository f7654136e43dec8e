# CPU emulation: the SwiGLU epilogue's roundings (gate, up, output) against the fp64 definition, rel as the GPU test
# computes it (tests/gpu/test_layers_gpu.py), over seeded draws of the test's weights and inputs. No GPU.
#   python3 benchmarks/results/2026-11-28_h200_nvfp4_grouped_gemm/swiglu_bound_cpu.py 1500
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import lowbit
from lowbit.formats.kbit import tiled as kt
def one(gen, half, k, m, bits, dtype, rms):
    n = 2 * half
    w = torch.randn(n, k, generator=gen)
    lin = torch.nn.Linear(k, n, bias=False); lin.weight.data = w
    q = lowbit.nn.KbitLinear.from_linear(lin, bits=bits)
    x = torch.randn(m, k, generator=gen).to(dtype)
    rx = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    wd = kt.dequantize(q.qweight, q.qabsmax, q.codebook, q.scale, q.bits, n, k).double()
    y = x.double() @ wd.t()
    if rms: y = y * torch.rsqrt(rx.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    y = y + bias.double()
    g, u = y.chunk(2, -1)
    want = torch.nn.functional.silu(g) * u
    gk, uk = g.to(dtype).float(), u.to(dtype).float()
    got = (torch.nn.functional.silu(gk) * uk).to(dtype).double()
    return ((got - want).norm() / want.norm()).item()
trials = int(sys.argv[1])
for dtype, bound in ((torch.bfloat16, 8e-3), (torch.float16, 1e-3)):
  for (half, k, m) in ((16, 256, 1), (16, 256, 3), (64, 512, 1)):
    rs = []
    for s in range(trials):
        gen = torch.Generator().manual_seed(s)
        for rms in (True, False):
            rs.append(one(gen, half, k, m, 4, dtype, rms))
    rs = torch.tensor(rs)
    print(dtype, half, k, m, f"mean {rs.mean():.4f} max {rs.max():.4f} p(>bound) {(rs > bound).float().mean():.4f}", flush=True)
