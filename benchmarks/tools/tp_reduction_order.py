"""How far a row split's summation order alone moves a quantized model's logits, in one process.

Tensor parallelism over W ranks changes one thing in the arithmetic: each row-split layer (o_proj, down_proj)
computes W partial products over K / W columns, each rounded to the activation dtype, and sums them. This
tool emulates exactly that on one device (the parts are ``tp_shard("rowwise", r, W)`` of each quantized
module, summed in the activation dtype in rank order, as a 2-rank all-reduce adds them) and reports, for the
same prompt:

* ``split vs whole``: the emulated split's logits against the unsplit model's, both in ``--dtype``;
* ``dtype vs fp32``: the unsplit model in ``--dtype`` against the same quantized weights with fp32 activations
  (what the dtype's rounding alone does to this model).

If the first is of the order of the second, a TP run's logits that differ from TP = 1 by the first are the
reduction order, not a wrong part. Random-init models have near-flat logits, so both can be large.

    python3 benchmarks/tools/tp_reduction_order.py --model random:llama-3-70b --layers 80 --device cuda
    python3 benchmarks/tools/tp_reduction_order.py --deep-narrow --device cpu   # 80 layers at 1/8 width, on a CPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lowbit  # noqa: E402
from lowbit.bench.runner import rel_err  # noqa: E402
from lowbit.hf import quality, sources, tp  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random:llama-3-70b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--deep-narrow", action="store_true",
                   help="Llama-3-70B's depth and head grouping at 1/8 of its width (hidden 1024), small vocabulary")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if args.deep_narrow:
        import transformers

        cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=1024, intermediate_size=3584, num_hidden_layers=80,
                                       num_attention_heads=8, num_key_value_heads=1, head_dim=128)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # built as sources.load builds a random model
        try:
            model = transformers.AutoModelForCausalLM.from_config(cfg).to(args.device).eval()
        finally:
            torch.set_default_dtype(prev)
        lowbit.quantize_model(model, bits=4, progress=False)
        desc = "Llama-3-70B depth at 1/8 width (random init, 80 layers, hidden 1024)"
    else:  # built layer by layer, each quantized before the next: 70B shapes fit one GPU
        model, _, desc = sources.load(args.model, dtype=dtype, device=args.device, layers=args.layers,
                                      each_layer=lambda block: lowbit.quantize_model(block, bits=4, progress=False))
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    ids = ids.to(args.device)
    with torch.no_grad():
        whole = model(ids).logits.float().cpu()
        with tp.emulated_row_split(model, args.world) as n:
            parts = model(ids).logits.float().cpu()
        try:  # the same quantized weights with fp32 activations
            with quality.upcast(model):
                fp32 = model(ids).logits.float().cpu()
        except Exception as e:  # noqa: BLE001
            print(f"fp32 activations: {type(e).__name__}: {e}")
            fp32 = None
    res = {"model": desc, "dtype": args.dtype, "world": args.world, "split_modules": n, "device": args.device,
           "split_vs_whole": rel_err(parts, whole), "dtype_vs_fp32": fp32 is not None and rel_err(whole, fp32),
           "split_vs_fp32": fp32 is not None and rel_err(parts, fp32),
           "top1_split_vs_whole": (parts.argmax(-1) == whole.argmax(-1)).float().mean().item()}
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
