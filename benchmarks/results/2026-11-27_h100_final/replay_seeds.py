"""Replay the two epilogue cases the first suite run failed (their seeds), on the split kernel: where the
zero-residual epilogue and the plain GEMV differ. Run from the repository root on a GPU:
    LOWBIT_LIBRARY=<library> PYTHONPATH=. python3 benchmarks/results/2026-11-27_h100_final/replay_seeds.py
"""
import torch

import tests.gpu.test_layers_gpu as T
from lowbit import ops
from lowbit.kernels import tiled

for seed, bits, m, dtype in ((3349984833, 4, 5, torch.float16), (1986154622, 2, 8, torch.float16)):
    tiled.DENSE_PATH = "split"
    gen = torch.Generator().manual_seed(seed)
    for n, k in ((int(torch.randint(16, 400, (1,), generator=gen)), 32 * int(torch.randint(1, 40, (1,), generator=gen))),
                 (256, 4096)):
        q, x, rms_x, residual, nw, bias = T._case(gen, n, k, m, bits, dtype)
        args = (x, q.qweight, q.qabsmax, q.codebook, q.scale, bits, n, k, bias)
        y, _ = ops.kbit_gemv_epilogue(*args, None, 1e-6, torch.zeros_like(residual))
        p = ops.kbit_gemv(*args)
        d = (y != p).nonzero()
        print(f"seed {seed} bits {bits} m {m} n {n} k {k}: {len(d)} differ")
        for r, c in d[:6].tolist():
            print("   ", r, c, y[r, c].item(), p[r, c].item())
