"""Does rotating a linear's input space (QuIP# / SpinQuant style incoherence) help kbit GPTQ at 2-3 bits?

Layer-level measurement on the default model (SmolLM2-135M, CPU): for the linears of a few decoder
blocks, H comes from the calibration text (the default: the Python language reference) and the output
error ||X W^T - X Q^T|| / ||X W^T|| is measured on the activations of the text `lowbit eval` scores on.
Rotated: W R is quantized with GPTQ against R^T H R and used as Q R^T (R a seeded random orthogonal
matrix, which spreads outliers as a Hadamard transform does; the kernels would have to apply R to
every input, which this measures the value of, not the cost).

    python3 benchmarks/tools/rotation_effect.py [--bits 2,3] [--blocks 0,10,20] [--codebook fit]
                                                [--rotation random|hadamard32|hadamard64]

``hadamardB``: a block-diagonal Walsh-Hadamard rotation of B-element blocks (B = 32 is kbit's block: a
kernel could apply it to the activations it already holds, 5 butterfly stages in registers).
"""

from __future__ import annotations

import argparse

import torch

from lowbit.formats.kbit.columns import ColumnQuantizer
from lowbit.hf import quality, sources
from lowbit.model.calibration_data import calibration_ids
from lowbit.model.gptq import gptq


def activations(model, ids, names):
    got = {n: [] for n in names}
    mods = dict(model.named_modules())
    hs = [mods[n].register_forward_hook(lambda m, i, o, n=n: got[n].append(i[0].reshape(-1, i[0].shape[-1])))
          for n in names]
    with torch.no_grad():
        for row in ids:
            model(row[None], use_cache=False)
    for h in hs:
        h.remove()
    return {n: torch.cat(v).float() for n, v in got.items()}


def dequant(result, n, k):
    codes, absmax, codebook, scale = result
    from lowbit.formats import e4m4

    return (codebook[codes.long()] * (e4m4.decode(absmax) * scale)[..., None]).reshape(n, k)


def rotation(kind: str, k: int) -> torch.Tensor:
    if kind == "random":
        return torch.linalg.qr(torch.randn(k, k, generator=torch.Generator().manual_seed(1)))[0]
    b = int(kind.removeprefix("hadamard"))
    h = torch.ones(1, 1)
    while h.shape[0] < b:  # Sylvester construction
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return torch.block_diag(*[h / b**0.5] * (k // b))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bits", default="2,3")
    p.add_argument("--blocks", default="0,10,20")
    p.add_argument("--codebook", default="fit", choices=("fit", "default"))
    p.add_argument("--rotation", default="random", choices=("random", "hadamard32", "hadamard64"))
    args = p.parse_args()
    torch.manual_seed(0)
    model, tok, desc = sources.load(None, dtype=torch.float32, device="cpu")
    names = [f"model.layers.{b}.{s}" for b in map(int, args.blocks.split(","))
             for s in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")]
    cal, _ = calibration_ids(None, tok, model.config.vocab_size, samples=16, seq_len=512)
    ev = tok(quality.stdlib_docstrings(), return_tensors="pt")["input_ids"][0][:2048].reshape(4, 512)
    xc, xe = activations(model, cal, names), activations(model, ev, names)
    cb = "fit" if args.codebook == "fit" else None
    print(f"{desc}; H from 16 x 512 calibration tokens, error on 2048 eval-text tokens; codebook {args.codebook}; "
          f"rotation {args.rotation}")
    mods = dict(model.named_modules())
    for bits in map(int, args.bits.split(",")):
        tot = {"plain": [], "rotated": []}
        for n in names:
            w = mods[n].weight.detach().float()
            h = 2 * xc[n].t() @ xc[n] / xc[n].shape[0]
            y = xe[n] @ w.t()
            q = ColumnQuantizer(w, bits, cb, importance=torch.diagonal(h))
            gptq(w, h, q, act_order=True)
            e_plain = float((xe[n] @ dequant(q.result(), *w.shape).t() - y).norm() / y.norm())
            r = rotation(args.rotation, w.shape[1])
            wr, hr = w @ r, r.t() @ h @ r
            qr = ColumnQuantizer(wr, bits, cb, importance=torch.diagonal(hr))
            gptq(wr, hr, qr, act_order=True)
            e_rot = float((xe[n] @ (dequant(qr.result(), *w.shape) @ r.t()).t() - y).norm() / y.norm())
            tot["plain"].append(e_plain)
            tot["rotated"].append(e_rot)
            print(f"kbit{bits} {n:34s} output error: plain {e_plain:.4f}  rotated {e_rot:.4f}", flush=True)
        mp, mr = (sum(v) / len(v) for v in tot.values())
        print(f"kbit{bits} mean over {len(names)} layers: plain {mp:.4f}, rotated {mr:.4f} ({mr / mp:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
