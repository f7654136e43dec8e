"""One decode-attention call on Llama-3-8B heads (590-token cache) for Nsight Compute, at batch B (default 1):

    ncu --kernel-name regex:decode_attention --launch-skip 2 --launch-count 1 --set full python3 benchmarks/tools/attn_ncu_case.py [B]
"""
import sys

import torch, lowbit
b, hq, hkv, d, L = int(sys.argv[1]) if len(sys.argv) > 1 else 1, 32, 8, 128, 590
q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, hkv, L, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn(b, hkv, L, d, device="cuda", dtype=torch.bfloat16)
m = torch.ones(b, L, dtype=torch.bool, device="cuda"); m[:, 530:] = False
for _ in range(3):
    lowbit.ops.decode_attention(q, k, v, m, d ** -0.5)
torch.cuda.synchronize()
