"""Is SBVR's quality limited by the encoder's search? The same RTN row scored with a wider coefficient
search (more shapes of the geometric family, more scale steps per group):

    python3 benchmarks/tools/sbvr_search_width.py [--num-sums 3] [--shapes 256] [--scale-search 6]

SmolLM2-135M-Instruct on the CPU, scored like ``lowbit eval`` (1,024 tokens of stdlib docstrings). The
library's defaults: 64 shapes, +-3 scale steps (lowbit/formats/sbvr/definition.py). shapes x 256 scales
must stay <= 65,536 lines (the 16-bit index).
"""

import argparse
import copy
import time

import torch

import lowbit
from lowbit.formats.sbvr import definition
from lowbit.hf import quality, sources


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-sums", type=int, default=3)
    ap.add_argument("--shapes", type=int, default=256, help="a multiple of 8 (8 ratios x shapes/8 offsets)")
    ap.add_argument("--scale-search", type=int, default=6)
    args = ap.parse_args()
    if args.shapes % 8 or args.shapes * definition.SCALES > definition.MAX_LINES:
        raise SystemExit(f"--shapes must be a multiple of 8 and <= {definition.MAX_LINES // definition.SCALES}")
    base, tok, desc = sources.load(None, dtype=torch.float32, device="cpu")
    ids = tok(quality.stdlib_docstrings(), return_tensors="pt")["input_ids"][0][:1025]
    ref = quality.logits_over(base, ids)
    definition.SHAPES, definition.SCALE_SEARCH = args.shapes, args.scale_search
    m = copy.deepcopy(base)
    t = time.perf_counter()
    lowbit.quantize_model(m, format="sbvr", bits=args.num_sums, progress=False)
    r = quality.compare(ref, quality.logits_over(m, ids), ids[1:])
    print(f"{desc}: sbvr{args.num_sums} RTN, {args.shapes} shapes, +-{args.scale_search} scale steps, encoded in "
          f"{time.perf_counter() - t:.0f} s: KL {r['kl']:.4f} top-1 {r['top1']:.1%} ppl {r['ppl']:.2f}", flush=True)


if __name__ == "__main__":
    main()
