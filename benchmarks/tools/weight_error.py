"""Weight error of each format on a real model's linears (CPU is enough): relative Frobenius error
||W - W_hat|| / ||W|| per layer type, averaged over layers, for kbit (K bits), NVFP4 and the fake-quant
baselines -- the weight-side companion of ``lowbit eval``.

    python3 benchmarks/tools/weight_error.py [--model smollm2] [--bits 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

import lowbit
from lowbit.bench.baselines import BASELINES
from lowbit.hf import sources


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--bits", default="4")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model, _tok, desc = sources.load(args.model, dtype=torch.float32, device="cpu")
    print(desc)
    fmts = {f"kbit{b}": (lambda w, b=int(b): lowbit.dequantize_kbit(lowbit.quantize_kbit(w, bits=b), torch.float32))
            for b in args.bits.split(",")}
    fmts.update({name: fn for name, (fn, _bits) in BASELINES.items()})
    errs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or name.endswith("lm_head"):
            continue
        w = mod.weight.detach().float()
        kind = name.split(".")[-1]
        for f, fn in fmts.items():
            errs[f][kind].append(((w - fn(w)).norm() / w.norm()).item())
    kinds = sorted({k for per in errs.values() for k in per})
    print("format      " + " ".join(f"{k:>10s}" for k in kinds) + "        all")
    table = {}
    for f, per in errs.items():
        row = {k: sum(v) / len(v) for k, v in per.items()}
        row["all"] = sum(sum(v) for v in per.values()) / sum(len(v) for v in per.values())
        table[f] = row
        print(f"{f:<11s} " + " ".join(f"{row[k]:10.4f}" for k in kinds) + f" {row['all']:10.4f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(table, fh, indent=1)


if __name__ == "__main__":
    main()
