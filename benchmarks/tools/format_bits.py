"""Stored bits per weight of each format on a model (what `lowbit eval` rows cost), from the modules'
own byte counts (indices, scales, codebooks and caches included):

    python3 benchmarks/tools/format_bits.py [--rows kbit2,kbit3,kbit4,sbvr2,sbvr3,sbvr4,nvfp4]
"""

import argparse
import copy

import torch

import lowbit
from lowbit.hf import sources
from lowbit.nn import QuantizedModule, formats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="kbit2,kbit3,kbit4,sbvr2,sbvr3,sbvr4,nvfp4")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    base, _, desc = sources.load(args.model, dtype=torch.float32, device="cpu")
    print(desc)
    for row in args.rows.split(","):
        fmt = row if row in formats() else row.rstrip("0123456789")  # nvfp4: a name; sbvr3: format + bits
        bits = int(row[len(fmt):]) if row[len(fmt):] else 4
        m = copy.deepcopy(base)
        lowbit.quantize_model(m, format=fmt, bits=bits, fuse=False, progress=False)
        mods = [mod for mod in m.modules() if isinstance(mod, QuantizedModule)]
        weights = sum(mod.in_features * mod.out_features for mod in mods)
        print(f"{row:>6}: {8 * sum(mod.format_bytes() for mod in mods) / weights:.3f} bits/weight over {weights} weights",
              flush=True)


if __name__ == "__main__":
    main()
