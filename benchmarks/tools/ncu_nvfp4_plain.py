import torch, lowbit
from lowbit import ops
torch.manual_seed(0)
w = torch.randn(28672, 8192, device="cuda", dtype=torch.float16)
q = lowbit.quantize_nvfp4(w)
x = torch.randn(1, 8192, device="cuda", dtype=torch.float16)
for _ in range(3):
    ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2)
torch.cuda.synchronize()
