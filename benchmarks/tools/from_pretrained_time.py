"""transformers' from_pretrained with a LowbitConfig against quantize_model, on lowbit's default model
(SmolLM2-135M-Instruct, written once as a dense safetensors directory: transformers does not quantize a
GGUF file while loading it).

    python3 benchmarks/tools/from_pretrained_time.py [--device cuda] [--dtype bfloat16] [--format kbit]

Prints: the time of from_pretrained(dir, quantization_config=LowbitConfig(...)) (load + quantize), of a dense
from_pretrained plus quantize_model, whether the two models' logits are bit-identical, and the time of a plain
from_pretrained of the save_pretrained directory (with lowbit's checks) and whether its logits are identical.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import transformers

import lowbit
from lowbit.hf import LowbitConfig
from lowbit.hf.sources import smollm2_gguf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--format", default="kbit")
    ap.add_argument("--bits", type=int, default=4)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    path = smollm2_gguf()
    dense = tempfile.mkdtemp()
    g = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.bfloat16)
    g.hf_quantizer = None  # a GGUF load carries transformers' GGUF quantizer, which refuses to save
    if hasattr(g.config, "quantization_config"):
        del g.config.quantization_config
    g.save_pretrained(dense)
    del g
    kw = dict(dtype=dtype, device_map=args.device)
    cfg = LowbitConfig(format=args.format, bits=args.bits)

    def timed(fn):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out, time.perf_counter() - t

    q, t_q = timed(lambda: transformers.AutoModelForCausalLM.from_pretrained(dense, quantization_config=cfg, **kw))
    print(f"from_pretrained(quantization_config=LowbitConfig({args.format}, {args.bits})): {t_q:.2f} s; "
          f"{q.lowbit_report.summary()}")
    ref, t_l = timed(lambda: transformers.AutoModelForCausalLM.from_pretrained(dense, **kw))
    rep, t_qm = timed(lambda: lowbit.quantize_model(ref, format=args.format, bits=args.bits, progress=False))
    print(f"dense from_pretrained {t_l:.2f} s + quantize_model {t_qm:.2f} s")
    ids = torch.randint(0, q.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0)).to(args.device)
    with torch.no_grad():
        a, b = q(ids).logits, ref(ids).logits
    print(f"logits bit-identical: {torch.equal(a, b)} (64 tokens)")
    out = tempfile.mkdtemp()
    q.save_pretrained(out)
    r, t_r = timed(lambda: transformers.AutoModelForCausalLM.from_pretrained(out, **kw))
    with torch.no_grad():
        same = torch.equal(r(ids).logits, a)
    print(f"from_pretrained(saved directory): {t_r:.2f} s (checksums checked); logits bit-identical: {same}")


if __name__ == "__main__":
    main()
