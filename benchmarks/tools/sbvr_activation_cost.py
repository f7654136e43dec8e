"""What the SBVR authors' activation encoding costs a model: the same SBVR weights scored with exact
activations (weight-only) and with activations rounded per group to A-bit integers (RTN, asymmetric:
what their popcount GEMV multiplies by; ``lowbit.formats.sbvr.linear_bitplane_reference`` is that product).

    python3 benchmarks/tools/sbvr_activation_cost.py [--num-sums 4] [--act-bits 8,7,6,4] [--method rtn|gptq]

SmolLM2-135M-Instruct on the CPU (fp32), scored like ``lowbit eval`` (1,024 tokens of stdlib docstrings).
"""

import argparse
import copy

import torch

import lowbit
from lowbit.formats import sbvr
from lowbit.hf import quality, sources
from lowbit.nn import SbvrLinear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-sums", type=int, default=4)
    ap.add_argument("--act-bits", default="8,7,6,4")
    ap.add_argument("--method", default="rtn", choices=("rtn", "gptq"))
    args = ap.parse_args()
    base, tok, desc = sources.load(None, dtype=torch.float32, device="cpu")
    ids = tok(quality.stdlib_docstrings(), return_tensors="pt")["input_ids"][0][:1025]
    ref = quality.logits_over(base, ids)
    m = copy.deepcopy(base)
    kw = {} if args.method == "rtn" else dict(method="gptq", tokenizer=tok)
    lowbit.quantize_model(m, format="sbvr", bits=args.num_sums, progress=False, **kw)
    print(f"{desc}; sbvr{args.num_sums} ({args.method}); KL / top-1 / ppl over {ids.numel() - 1} tokens", flush=True)
    plain = SbvrLinear.forward

    def rounded(bits):
        def forward(self, x):
            q, s, lo = sbvr.encode_activations(x, bits, self.group)
            g = self.group
            x_hat = (q.reshape(*x.shape[:-1], -1, g).to(torch.float32) * s[..., None] + lo[..., None]).reshape(x.shape)
            return plain(self, x_hat.to(x.dtype))
        return forward

    for bits in [None] + [int(b) for b in args.act_bits.split(",")]:
        SbvrLinear.forward = plain if bits is None else rounded(bits)
        try:
            r = quality.compare(ref, quality.logits_over(m, ids), ids[1:])
        finally:
            SbvrLinear.forward = plain
        label = "weight-only (exact activations)" if bits is None else f"activations {bits}-bit RTN per group"
        print(f"  {label:>38}: KL {r['kl']:.4f}  top-1 {r['top1']:.1%}  ppl {r['ppl']:.2f}", flush=True)


if __name__ == "__main__":
    main()
