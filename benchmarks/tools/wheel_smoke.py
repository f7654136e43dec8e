"""Run from outside the checkout, with lowbit installed from a wheel: quantize a random-init Llama on
the GPU and compare its logits with the reference-dequantized model. Proves the wheel carries the
CUDA sources (the library is JIT-built from lowbit/_csrc into a fresh cache) and runs a model.

    pip install --no-deps --target /tmp/wheel_site dist/lowbit-*.whl
    cd /tmp && PYTHONPATH=/tmp/wheel_site LOWBIT_CACHE_DIR=/tmp/fresh python3 /path/to/wheel_smoke.py
"""

import copy
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import lowbit
from lowbit.kernels import build
from lowbit.kernels.library import get_library

print("lowbit from", lowbit.__file__)
print("CUDA sources", build.CSRC_DIR)
assert "wheel_site" in lowbit.__file__ and "_csrc" in str(build.CSRC_DIR), "not running the installed wheel"
t0 = time.perf_counter()
lib = get_library(torch.device("cuda"))
print(f"library {lib.path} ready in {time.perf_counter() - t0:.1f} s (cache {os.environ.get('LOWBIT_CACHE_DIR')})")

cfg = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=4)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
ref = copy.deepcopy(model).float()
print(lowbit.quantize_model(model, bits=4, progress=False))
for name, mod in model.named_modules():
    if isinstance(mod, lowbit.nn.KbitLinear):
        ref.get_submodule(name).weight.data = mod.dequantize(torch.float32)
ids = torch.randint(0, 1024, (1, 1), device="cuda")
with torch.no_grad():
    got, want = model(ids).logits.float(), ref(ids).logits
err = float((got - want).norm() / want.norm())
print(f"decode logits vs reference: rel err {err:.2e}")
assert err < 5e-2 and torch.isfinite(got).all()
print("WHEEL SMOKE OK")
