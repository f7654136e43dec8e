"""Saved size and save / load time of a quantized model (GPU or CPU).

    python3 benchmarks/tools/save_load_time.py [--model random:llama-3-8b] [--bits 4] [--dir /tmp/q]

Saves with the unquantized tensors in bf16, loads into a fresh skeleton on the same device (the
loader re-tiles the compact bit planes there), checks the round trip is bit-exact, and prints the
file size beside the format bytes + bf16 unquantized bytes.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

import lowbit
from lowbit.hf import sources
from lowbit.nn import KbitLinear, KbitMoeExperts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="random:llama-3-8b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/lowbit_save_load"))
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    net, _, desc = sources.load(args.model, dtype=dtype, device=device, layers=args.layers)
    lowbit.quantize_model(net, bits=args.bits, progress=False)
    shutil.rmtree(args.dir, ignore_errors=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    lowbit.save_quantized(net, args.dir, dtype=torch.bfloat16)
    save_s = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in args.dir.glob("*.safetensors"))
    quantized = {n: m for n, m in net.named_modules() if isinstance(m, (KbitLinear, KbitMoeExperts))}
    own = {f"{n}.{k}" for n, m in quantized.items() for k in m.state_dict() if k != "bias"}
    state = net.state_dict()
    fmt = sum(m.format_bytes() for m in quantized.values())
    plain = sum({t.data_ptr(): t.numel() * 2 for k, t in state.items() if k not in own}.values())  # tied: once

    skeleton, _, _ = sources.load(args.model, dtype=dtype, device=device, layers=args.layers)
    sync()
    t0 = time.perf_counter()
    lowbit.load_quantized(skeleton, args.dir, device=device, dtype=dtype)
    sync()
    load_s = time.perf_counter() - t0
    other = skeleton.state_dict()
    exact = all(torch.equal(t, other[k]) for k, t in state.items() if k in own)
    print(f"{desc} kbit{args.bits} on {device}: saved {size / 1e6:.1f} MB in {save_s:.1f} s; format bytes "
          f"{fmt / 1e6:.1f} MB + unquantized in bf16 {plain / 1e6:.1f} MB = {(fmt + plain) / 1e6:.1f} MB; "
          f"load + re-tile {load_s:.1f} s; quantized tensors bit-exact after the round trip: {exact}")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
