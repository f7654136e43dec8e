"""Tensor-parallel decode scaling in one torchrun launch: TP = 1 against TP = N, each all-reduce kind.

    torchrun --nproc-per-node 2 benchmarks/tp_scaling.py --model random:llama-3-70b --batch 1,4 --out DIR
    # the script itself, on 2 CPU processes (gloo):
    torchrun --nproc-per-node 2 benchmarks/tp_scaling.py --model random:tiny-llama --device cpu --out DIR

Every rank builds the same random model (same seed) layer by layer, quantizing each layer as it is built
(as ``lowbit generate`` does without ``--compare``). Then:

1. TP = 1: every rank decodes the whole model on its own device (no communication); rank 0's time is the row.
2. The reference logits of a 16-token prompt: the whole model's; the same with each row split's summation order
   emulated in one process (:func:`lowbit.hf.tp.emulated_row_split`); the same weights with fp32 activations.
3. Each rank keeps its part (:func:`lowbit.hf.tp.shard_model`, the model's own TP plan).
4. For each all-reduce kind (:func:`lowbit.hf.tp.set_allreduce`): the sharded logits of the same prompt against
   those three (relative L2 error; top-1 agreement with the whole model's), then a decode at each batch size. On a
   GPU the decode runs lowbit's fused decoder layer on each rank's parts (:mod:`lowbit.hf.layers`), except with
   ``dtensor`` (transformers' own all-reduce); ``--own-layers`` adds each kind's rows with the layers' own forward.
5. The all-reduce alone: one [batch, hidden] sum per kind, timed as a CUDA graph of 64 calls (per-call latency).

Every row goes to ``DIR/rows.json`` as soon as it is measured (a run stopped early keeps what it had):
``model``, ``variant``, ``batch``, ``tokens_per_s``, ``ms_per_step``, ``speedup_vs_tp1``, ``allreduce``, ``world``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lowbit  # noqa: E402
from lowbit.bench.runner import rel_err  # noqa: E402
from lowbit.hf import decode, layers, quality, sources, tp  # noqa: E402

PROMPT_LEN = 16


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random:llama-3-70b")
    p.add_argument("--layers", type=int, default=None, help="random models: decoder layers (default: the model's)")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--format", default="kbit")
    p.add_argument("--batch", default="1,4", help="comma-separated batch sizes")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--allreduce", default=None, help="comma-separated kinds (default: every kind the device has)")
    p.add_argument("--dtype", default=None,
                   help="activations: bfloat16 (default on CUDA), float16, float32 (default on CPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile each decode step (then the CUDA graph)")
    p.add_argument("--profile", action="store_true",
                   help="also a per-step kernel breakdown of each variant at the first batch size (graph replays)")
    p.add_argument("--own-layers", action="store_true",
                   help="also decode each all-reduce kind with the decoder layers' own forward (lowbit's fused "
                        "decoder layer off: norms, adds and activation as kernels of their own; the A/B of that layer)")
    p.add_argument("--split-first", action="store_true",
                   help="split the model right after quantizing, as `lowbit generate` under torchrun does: no TP = 1 "
                        "decode and no logits checks before (the TP = 2 rows only)")
    p.add_argument("--device", default=None, help="cuda (default when there is one) or cpu (gloo; no graphs)")
    p.add_argument("--out", required=True, help="directory for rows.json and the log")
    args = p.parse_args()

    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on the lent machines
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():  # a short timeout: a rank that fails must not leave the other waiting for long
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=180))
    device, mesh = tp.setup(device_type)
    rank, world = dist.get_rank(), dist.get_world_size()
    graph = device.type == "cuda"
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if device.type == "cuda" else torch.float32
    batches = [int(b) for b in args.batch.split(",")]
    kinds = args.allreduce.split(",") if args.allreduce else (
        ["auto", "nccl", "symm-mem", "dtensor"] if device.type == "cuda" else ["auto", "nccl", "dtensor"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    info = {"model": args.model, "layers": args.layers, "world": world, "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "format": f"{args.format}{args.bits}",
            "mode": ("cuda-graph" if graph else "eager") + ("+compile" if args.compile else "")}

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    def save(row: dict | None = None):
        if row is not None:
            rows.append({**row, "model": desc, "world": world, "gpu": info["gpu"], "mode": info["mode"]})
        if rank == 0:
            (out / "rows.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))

    # -- build and quantize, the same model on every rank
    torch.manual_seed(0)
    t0 = time.perf_counter()

    def each_layer(block):
        lowbit.quantize_model(block, format=args.format, bits=args.bits, progress=False)

    model, _, desc = sources.load(args.model, dtype=dtype, device=device, layers=args.layers, each_layer=each_layer)
    # whatever is left (the head stays unquantized)
    lowbit.quantize_model(model, format=args.format, bits=args.bits, progress=False)
    info["build_s"] = time.perf_counter() - t0
    say(f"{desc}: built and quantized on each of {world} ranks in {info['build_s']:.1f} s")
    if device.type == "cpu":  # the GPU's attention path (the fused decode step; its reference op here)
        from lowbit.hf.attention import use_fused_decode_attention, use_gqa_sdpa

        use_gqa_sdpa(model)
        info["fused_attention_layers"] = use_fused_decode_attention(model)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = {b: torch.randint(0, vocab, (b, PROMPT_LEN), generator=g) for b in batches}
    check_ids = prompts[batches[0]][:1].to(device)

    tokens_tp1 = {}

    def run_decode(label: str, kind: str | None, tp1: dict | None):
        for b in batches:
            if args.compile:  # a fresh compile per variant and batch: Dynamo stops recompiling a function after a few
                torch._dynamo.reset()
            r = decode.greedy_decode(model, prompts[b], args.max_new_tokens, graph=graph, compile=args.compile)
            row = {"variant": label, "batch": b, "tokens_per_s": r.tokens_per_s(), "ms_per_step": r.ms_per_step(),
                   "allreduce": kind}
            if kind == "auto":  # what it stood for here (settled by shard_model, with every rank)
                row["allreduce_used"] = tp.resolve_allreduce(tp._group(mesh), device)
            if tp1:
                row["speedup_vs_tp1"] = row["tokens_per_s"] / tp1[b]
                # greedy tokens as TP = 1 chose them, up to the first that differs (random weights: near-flat
                # logits, so a reduction-order difference can flip an argmax, and every later token follows it)
                same = (r.tokens == tokens_tp1[b]).all(0).long()
                row["same_tokens_as_tp1"] = int(same.cumprod(0).sum())
            else:
                tokens_tp1[b] = r.tokens
            say(f"  {label:24s} batch {b}: {row['tokens_per_s']:8.1f} tok/s  {row['ms_per_step']:7.3f} ms/step"
                + (f"  {row['speedup_vs_tp1']:.2f}x TP=1" if tp1 else ""))
            if args.profile and graph and b == batches[0]:  # kernel time per step by category, from graph replays
                if args.compile:
                    torch._dynamo.reset()
                prof = decode.greedy_decode(model, prompts[b], 8, graph=True, compile=args.compile, profile=True,
                                            profile_graph=True).breakdown
                row["breakdown"] = prof
                say("    " + ", ".join(f"{k} {v:.3f}" for k, v in prof["ms_per_step_by_category"].items())
                    + f" (ms per step; kernels {prof['kernel_ms_per_step']:.3f})")
            save(row)
            yield b, row["tokens_per_s"]

    if args.split_first:  # straight to 3., as `lowbit generate` under torchrun
        split, plain = tp.shard_model(model, mesh)
        info["split_modules"], info["split_plain_linears"] = split, plain
        say(f"split {split} quantized modules and {plain} unquantized linears over {world} ranks (before any decode)")
        for kind in kinds:
            tp.set_allreduce(kind)
            if kind == "auto":
                say(f"all-reduce auto is {tp.resolve_allreduce(tp._group(mesh), device)} here")
            for _ in run_decode(f"{info['format']} TP={world} {kind} split-first", kind, None):
                pass
        save()
        model = None  # its TP forwards hold the process group: free them before the group ends (tp.teardown)
        gc.collect()
        tp.teardown()
        return 0
    # -- 1. TP = 1 (each rank alone), 2. the reference logits
    say(f"TP=1 ({info['format']}, each rank decodes the whole model alone; rank 0's times)")
    tp1 = dict(run_decode(f"{info['format']} TP=1", None, None))
    # The yardsticks for the split's logits: the whole model's, the whole model's with every row split's
    # summation order emulated on one device (what TP changes in the arithmetic), and the same quantized weights
    # with fp32 activations (how far this dtype's own rounding moves this model's logits).
    with torch.no_grad():
        ref = model(check_ids).logits.float()
        with tp.emulated_row_split(model, world):
            emulated = model(check_ids).logits.float()
        try:
            with quality.upcast(model):
                fp32 = model(check_ids).logits.float()
            again = model(check_ids).logits.float()
            info["whole_unchanged_after_fp32"] = bool(torch.equal(again, ref))
        except Exception:  # noqa: BLE001 -- optional: kept as an error, the run goes on
            info.setdefault("errors", {})["fp32"] = traceback.format_exc()
            fp32 = None
    info["logits"] = logits = {"emulated_split_vs_whole": rel_err(emulated, ref)}
    if fp32 is not None:
        logits.update(whole_vs_fp32=rel_err(ref, fp32), emulated_split_vs_fp32=rel_err(emulated, fp32))
    say("logits, relative L2: " + ", ".join(f"{k} {v:.2e}" for k, v in logits.items()))
    save()
    dist.barrier()

    # -- 3. each rank keeps its part
    split, plain = tp.shard_model(model, mesh)
    info["split_modules"], info["split_plain_linears"] = split, plain
    say(f"split {split} quantized modules and {plain} unquantized linears over {world} ranks")

    # -- 4. each all-reduce kind: logits against the reference, then the decode
    for kind in kinds:
        try:
            tp.set_allreduce(kind)
            with torch.no_grad():
                y = model(check_ids).logits.float()
            err = rel_err(y, ref)
            top1 = (y.argmax(-1) == ref.argmax(-1)).float().mean().item()
            finite = bool(torch.isfinite(y).all())
            got = {"rel_error": err, "top1": top1, "finite": finite, "vs_emulated_split": rel_err(y, emulated)}
            if fp32 is not None:
                got["vs_fp32"] = rel_err(y, fp32)
            if kind == "auto":
                say(f"all-reduce auto is {tp.resolve_allreduce(tp._group(mesh), device)} here")
            say(f"TP={world}, all-reduce {kind}: logits vs TP=1 rel. error {err:.2e}, top-1 agreement {top1:.1%}, "
                f"vs the emulated split {got['vs_emulated_split']:.2e}"
                + (f", vs fp32 activations {got['vs_fp32']:.2e}" if fp32 is not None else "")
                + ("" if finite else ", NOT FINITE"))
            info.setdefault("logits_vs_tp1", {})[kind] = got
            save()
            for _ in run_decode(f"{info['format']} TP={world} {kind}", kind, tp1):
                pass
            if args.own_layers and kind != "dtensor":  # (dtensor: the layers' own forward anyway)
                layers.FUSED = False
                try:
                    for _ in run_decode(f"{info['format']} TP={world} {kind} own-layers", kind, tp1):
                        pass
                finally:
                    layers.FUSED = True
        except Exception:  # noqa: BLE001 -- the next kind may still run; the error is kept with the results
            info.setdefault("errors", {})[kind] = traceback.format_exc()
            say(f"all-reduce {kind} failed:\n{traceback.format_exc()}")
            save()
        dist.barrier()

    # -- 5. the all-reduce alone, per call
    if graph:
        hidden = model.config.hidden_size
        for kind in kinds:
            if kind == "dtensor":
                continue
            for b in batches:
                try:
                    x = torch.randn(b, hidden, device=device, dtype=dtype)
                    expect = x.float() * world  # every rank holds the same x (same seed per rank below)
                    tp.all_reduce(x.clone(), tp._group(mesh), kind)  # first use: buffers, communicators
                    torch.cuda.synchronize()
                    calls = 64
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        y = tp.all_reduce(x.clone(), tp._group(mesh), kind)
                    torch.cuda.current_stream().wait_stream(s)
                    gr = torch.cuda.CUDAGraph()
                    bufs = [x.clone() for _ in range(calls)]
                    with torch.cuda.graph(gr):
                        outs = [tp.all_reduce(t, tp._group(mesh), kind) for t in bufs]
                    gr.replay()
                    torch.cuda.synchronize()
                    ok = all(torch.allclose(o.float(), expect, rtol=1e-2, atol=1e-2) for o in outs[:1])
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    times = []
                    for _ in range(10):
                        start.record()
                        gr.replay()
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end) * 1e3 / calls)
                    us = sorted(times)[len(times) // 2]
                    say(f"  all-reduce {kind:9s} [{b} x {hidden}] {dtype}: {us:6.2f} us per call (graph of {calls})"
                        + ("" if ok else "  WRONG SUM"))
                    info.setdefault("allreduce_us", {})[f"{kind} b{b}"] = {"us": us, "sum_ok": ok}
                    del y
                except Exception:  # noqa: BLE001
                    info.setdefault("errors", {})[f"allreduce {kind} b{b}"] = traceback.format_exc()
                    say(f"all-reduce {kind} alone failed:\n{traceback.format_exc()}")
                save()
    save()
    model = None  # as above
    gc.collect()
    tp.teardown()
    return 0


if __name__ == "__main__":
    torch.manual_seed(0)  # the all-reduce check's x is the same on every rank
    sys.exit(main())
