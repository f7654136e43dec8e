"""End-to-end decode speed on the GPU through `lowbit generate` (issue 12, first measurements).

    python3 benchmarks/e2e_gpu.py --out e2e.json

Random-init models from transformers configs (no weights): the unquantized model (bf16,
cuBLAS) decodes first, then the same model quantized in place; each variant with the same
static-cache loop captured in a CUDA graph, with and without torch.compile of the step.
"""

import argparse
import json
import traceback

import torch

from lowbit.hf.generate import generate

CASES = [
    # (model, layers, batch, compile)
    ("random:llama-3-8b", None, 1, False),
    ("random:llama-3-8b", None, 1, True),
    ("random:llama-3-8b", None, 4, True),
    ("random:qwen3-30b-a3b", 24, 1, False),
    ("random:qwen3-30b-a3b", 24, 1, True),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="e2e.json")
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args()
    results = []
    for model, layers, batch, comp in CASES:
        torch._dynamo.reset()
        print(f"\n=== {model} layers={layers} batch={batch} compile={comp}", flush=True)
        try:
            r = generate(model, bits=4, batch=batch, compare=True, compile=comp, layers=layers,
                         max_new_tokens=args.tokens, quiet=True)
            u, q = r["unquantized"], r["quantized"]
            print(f"    bf16 {u['tokens_per_s']:.1f} tok/s ({u['ms_per_step']:.2f} ms/step, {u['mode']})  "
                  f"kbit4 {q['tokens_per_s']:.1f} tok/s ({q['ms_per_step']:.2f} ms/step)  "
                  f"speedup {q['tokens_per_s'] / u['tokens_per_s']:.2f}x  quantize {r['quantize_s']:.2f} s", flush=True)
            results.append({"model": model, "layers": layers, "batch": batch, "compile": comp, **r})
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            results.append({"model": model, "layers": layers, "batch": batch, "compile": comp, "error": repr(e)})
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
