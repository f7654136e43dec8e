"""Decode speed of a model loaded the way a transformers user loads one under torchrun: ``from_pretrained`` with
lowbit's quantization config and transformers' own tensor parallelism, against the same call on one GPU.

    torchrun --nproc-per-node 2 benchmarks/tools/tp_from_pretrained.py --model random:llama-3-8b --dir /tmp/tp_src --out rows.json

Rank 0 writes the random model in bf16 with ``save_pretrained`` (skipped when ``--dir`` already holds it). Then every
rank, in turn:

1. TP = 1: ``from_pretrained(dir, quantization_config=LowbitConfig(bits=B), device_map=<its GPU>)``, decoded alone
   (``lowbit.hf.decode.greedy_decode``, compiled; rank 0's time is the row);
2. TP = N: ``from_pretrained(dir, quantization_config=LowbitConfig(bits=B),
   distributed_config=DistributedConfig(tp_size=N))``, decoded by all ranks together, with the all-reduce lowbit picks
   (``auto`` unless ``$LOWBIT_TP_ALLREDUCE`` says otherwise). The row says which it picked and what the LM head became
   (``greedy_decode`` makes transformers' split head this rank's rows under lowbit's dense GEMV: ``localize_head``).

Both load the same bf16 files and quantize while loading. Rows (rank 0, JSON list): ``model``, ``variant``, ``batch``,
``tokens_per_s``, ``ms_per_step``, ``speedup_vs_tp1``, ``allreduce``, ``head``, ``load_s``, ``first_tokens``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lowbit.hf import LowbitConfig, decode, sources, tp  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random:llama-3-8b")
    p.add_argument("--layers", type=int, default=None, help="random models: decoder layers (default: the model's)")
    p.add_argument("--dir", required=True, help="where the bf16 model is written (reused if it holds config.json)")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--batch", default="1", help="comma-separated batch sizes")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="rows as JSON (rank 0)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke test on gloo ranks, fp32, eager")
    args = p.parse_args()
    import transformers
    from transformers.distributed import DistributedConfig

    device, mesh = tp.setup(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    rank, world = dist.get_rank(), dist.get_world_size()
    src = Path(args.dir)
    if rank == 0 and not (src / "config.json").exists():
        t0 = time.perf_counter()
        model, _, desc = sources.load(args.model, dtype=dtype, device=device, layers=args.layers)
        model.save_pretrained(src)
        del model
        print(f"wrote {desc} to {src} in {time.perf_counter() - t0:.1f} s", flush=True)
    dist.barrier()
    if cuda:
        torch.cuda.empty_cache()
    rows: list[dict] = []
    batches = [int(b) for b in args.batch.split(",")]

    def run(model, label: str, load_s: float, tp1: dict | None) -> dict:  # tp1: the TP = 1 rows, for a split model
        cfg = model.config
        for b in batches:
            g = torch.Generator().manual_seed(b)  # the same prompt for both loads
            ids = torch.randint(0, cfg.vocab_size, (b, 16), generator=g).to(device)
            r = decode.greedy_decode(model, ids, args.max_new_tokens, compile=cuda)
            row = {"model": args.model + (f" ({args.layers} layers)" if args.layers else ""), "variant": label,
                   "batch": b, "tokens_per_s": r.tokens_per_s(), "ms_per_step": r.ms_per_step(), "mode": r.mode,
                   "load_s": load_s, "head": type(model.lm_head).__name__,
                   "allreduce": None if tp1 is None else sorted(set(tp._auto.values())),  # what auto resolved to
                   "first_tokens": r.tokens[0, :8].tolist()}
            if tp1 is not None:
                row["speedup_vs_tp1"] = row["tokens_per_s"] / tp1[b]
            rows.append(row)
            if rank == 0:
                print(f"{label:<28} batch {b}: {row['tokens_per_s']:8.1f} tok/s {row['ms_per_step']:7.2f} ms/step "
                      f"(load + quantize {load_s:.1f} s; head {row['head']}; all-reduce {row['allreduce']})", flush=True)
        return {r_["batch"]: r_["tokens_per_s"] for r_ in rows if r_["variant"] == label}

    cfg = LowbitConfig(bits=args.bits)
    t0 = time.perf_counter()
    one = transformers.AutoModelForCausalLM.from_pretrained(src, quantization_config=cfg, dtype=dtype,
                                                            device_map=device)
    tp1 = run(one, f"kbit{args.bits} TP=1", time.perf_counter() - t0, None)
    one = None
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    dist.barrier()
    t0 = time.perf_counter()
    split = transformers.AutoModelForCausalLM.from_pretrained(src, quantization_config=cfg, dtype=dtype,
                                                              distributed_config=DistributedConfig(tp_size=world))
    run(split, f"kbit{args.bits} TP={world} from_pretrained", time.perf_counter() - t0, tp1)
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    split = None
    gc.collect()
    tp.teardown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on the lent machines
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    sys.exit(main())
