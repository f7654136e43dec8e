#!/usr/bin/env bash
# Time experiment builds of csrc/nvfp4_gemv.cu (minimal libraries: api.cu + that file, in .variants/lib_plain_NAME.so)
# on the W4A16 and W4A4 sweeps, with a correctness check of each: VARIANTS="a b" bash benchmarks/tools/plain_variants.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for v in ${VARIANTS:-base}; do
  echo "== $v"; export LOWBIT_LIBRARY=$PWD/.variants/lib_plain_$v.so
  python3 - <<'PY'
import torch, lowbit
from lowbit import ops
g = torch.Generator().manual_seed(1)
for dt in (torch.float16, torch.bfloat16):
    for m in (1, 3, 8):
        q = lowbit.quantize_nvfp4(torch.randn(999, 4096 + 1024, generator=g)).to("cuda")
        x = torch.randn(m, 4096 + 1024, generator=g).to(dt).cuda()
        ref = x.double() @ q.dequantize(torch.float64).t()
        err = ((ops.nvfp4_plain_gemv(x, q.packed, q.scales, q.scale_2).double() - ref).norm() / ref.norm()).item()
        assert err < (1e-3 if dt == torch.float16 else 8e-3), (dt, m, err)
print("check ok")
PY
  python3 benchmarks/nvfp4_sweep.py --shapes 8192x28672,28672x8192,4096x14336 --m ${SWEEP_M:-1} --only nvfp4-plain --no-check 2>&1 | grep -v "^NVIDIA" | sed 's/nvfp4_rel_err=nan //'
  python3 benchmarks/w4a4_sweep.py --kernel-only 2>&1 | grep -v "^NVIDIA"
done
