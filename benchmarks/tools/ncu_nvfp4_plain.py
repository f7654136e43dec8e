"""Workload for ncu: the checkpoint-layout NVFP4 GEMV on 8192x28672 at M = 1 (issue 15), e.g.
    ncu -k regex:nvfp4_gemv_kernel -s 2 -c 1 --section SpeedOfLight --section WarpStateStats python3 benchmarks/tools/ncu_nvfp4_plain.py
"""
import torch, lowbit
from lowbit import ops
torch.manual_seed(0)
w = torch.randn(28672, 8192, device="cuda", dtype=torch.float16)
q = lowbit.quantize_nvfp4(w)
x = torch.randn(1, 8192, device="cuda", dtype=torch.float16)
for _ in range(3):
    ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2)
torch.cuda.synchronize()
