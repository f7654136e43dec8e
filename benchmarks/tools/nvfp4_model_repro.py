"""Repro: NVFP4 modules in a 2-layer Llama-3-8B-shaped model, one eager step per linear, with the failing call named."""
import sys, traceback
import torch
import lowbit
from lowbit.hf import sources

dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.bfloat16
net, _, desc = sources.load("random:llama-3-8b", dtype=dtype, device="cuda", layers=2)
names = [x.name for x in lowbit.quantize_model(net, format="nvfp4").layers]
print(desc, len(names), "nvfp4 linears")
for name, mod in net.named_modules():
    if isinstance(mod, lowbit.nn.NvFp4Linear):
        w = mod.nvfp4_weight()
        print(name, w.shape, mod.weight.stride(), mod.weight.data_ptr() % 16, mod.weight_scale.stride(),
              mod.weight_scale.data_ptr() % 16, mod.weight.is_contiguous(), mod.weight_scale.is_contiguous(), flush=True)
        break
for name, mod in net.named_modules():
    if isinstance(mod, lowbit.nn.NvFp4Linear):
        x = torch.randn(1, 1, mod.in_features, dtype=dtype, device="cuda")
        try:
            mod(x); torch.cuda.synchronize()
        except Exception as e:
            print("FAIL", name, e, flush=True)
ids = torch.zeros((1, 1), dtype=torch.long, device="cuda")
try:
    with torch.no_grad():
        print(net(ids).logits.float().abs().mean())
except Exception:
    traceback.print_exc()
