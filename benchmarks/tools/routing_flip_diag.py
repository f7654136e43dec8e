"""Replays tests/gpu/test_models_gpu.py::test_model_on_cuda_matches_cpu_reference for one seed and prints the
per-token error and every router's flips (GPU model vs its fp32 CPU reference), with the reference's top-k margin.

    python3 benchmarks/tools/routing_flip_diag.py --seed 2552830301 --model mixtral --dtype float16
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lowbit  # noqa: E402
from tests.tiny_models import RoutingRecorder, build, reference_copy, rel_err  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True, help="the LOWBIT_TEST_SEED a failure printed")
    ap.add_argument("--model", default="mixtral")
    ap.add_argument("--dtype", default="float16")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(a.seed)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))  # as the test's _seed(gen)
    model = build(a.model, seed, dtype=getattr(torch, a.dtype), device="cuda")
    lowbit.quantize_model(model, bits=4, progress=False)
    ref = reference_copy(model, build(a.model, seed))
    routers = [m for m in ref.modules() if type(m).__name__.lower().endswith("router")]
    for batch, seq in [(1, 1), (3, 1), (1, 11), (2, 6)]:
        ids = torch.randint(0, 320, (batch, seq), generator=g)
        with torch.no_grad(), RoutingRecorder(model) as rg, RoutingRecorder(ref) as rr:
            got, want = model(ids.cuda()).logits.float().cpu(), ref(ids).logits
        per_tok = ((got - want).norm(dim=-1) / want.norm(dim=-1)).flatten()
        print(batch, seq, f"total {rel_err(got, want):.4g}", "per token", [round(v, 4) for v in per_tok.tolist()])
        for i, (x, y) in enumerate(zip(rg.picks, rr.picks)):
            tokens = (x != y).any(-1).nonzero().flatten().tolist()
            if tokens:
                print(f"  router call {i} ({type(routers[i % len(routers)]).__name__}): flips at tokens {tokens}")


if __name__ == "__main__":
    main()
