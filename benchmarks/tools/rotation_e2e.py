"""End-to-end effect of a block-32 Walsh-Hadamard rotation on GPTQ'd kbit (an experiment, CPU, PyTorch only).

Each KbitLinear stores W H (H: block-diagonal, 32-point, orthonormal, kbit's own block) quantized by GPTQ
against H^T Hess H, and its forward rotates the input the same way: y = (x H)(W H)^T = x W^T before
quantization. Here the rotation is patched into lowbit for the run (the kernels do not apply it yet), so
this measures what it would buy, on `lowbit eval`'s text against RTN and plain GPTQ:

    python3 benchmarks/tools/rotation_e2e.py [--bits 2,3] [--samples 32] [--codebook fit]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import lowbit
from lowbit.hf import quality, sources
from lowbit.model import calibrate
from lowbit.nn import KbitLinear


def hadamard(b: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < b:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / b**0.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bits", default="2,3")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--codebook", default="fit", choices=("fit", "default"))
    args = p.parse_args()
    h32 = hadamard(32)
    base, tok, desc = sources.load(None, dtype=torch.float32, device="cpu")
    ids = tok(quality.stdlib_docstrings(), return_tensors="pt")["input_ids"][0][:1025]
    ref = quality.logits_over(base, ids)
    plain_linear, plain_forward = calibrate._linear, KbitLinear.forward

    def rotate(x):
        return (x.reshape(*x.shape[:-1], -1, 32) @ h32.to(x)).reshape(x.shape)

    def rotated_linear(w, h, quantizer_cls, bits, codebook, options):
        r = torch.block_diag(*[h32.to(w.device)] * (w.shape[1] // 32))
        return plain_linear(w.float() @ r, r.t() @ h @ r, quantizer_cls, bits, codebook, options)

    print(f"{desc}; GPTQ on {args.samples} x 512 tokens of the default text, codebook {args.codebook}, act-order; "
          f"scored over {ids.numel() - 1} tokens of the eval text", flush=True)
    for bits in map(int, args.bits.split(",")):
        for rotated in (False, True):
            calibrate._linear = rotated_linear if rotated else plain_linear
            KbitLinear.forward = (lambda self, x: plain_forward(self, rotate(x))) if rotated else plain_forward
            try:
                m = copy.deepcopy(base)
                t = time.perf_counter()
                lowbit.quantize_model(m, bits=bits, codebook="fit" if args.codebook == "fit" else None, fuse=False,
                                      progress=False, method="gptq", tokenizer=tok,
                                      gptq=lowbit.GptqOptions(samples=args.samples))
                row = quality.compare(ref, quality.logits_over(m, ids), ids[1:])
            finally:
                calibrate._linear, KbitLinear.forward = plain_linear, plain_forward
            print(f"kbit{bits} {'block-32 Hadamard' if rotated else 'plain':18s} KL {row['kl']:.4f}  top-1 "
                  f"{row['top1']:.1%}  ppl {row['ppl']:.2f}  ({time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
