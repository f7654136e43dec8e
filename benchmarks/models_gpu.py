"""Model-level measurements on the GPU (issue 11): eager CPU cost per call, memory, quantize time,
decode speed of random-init models built from transformers configs (no weights needed).

    python3 benchmarks/models_gpu.py --out results.json [--skip-moe] [--moe-layers 24]

Every section is independent: one that fails records its error and the rest still run.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback

import torch
import torch.nn.functional as F

import lowbit
from lowbit.hf import decode, sources

RESULTS: dict = {}


def section(name):
    def wrap(fn):
        def run(*a, **kw):
            print(f"\n== {name}", flush=True)
            t0 = time.perf_counter()
            try:
                RESULTS[name] = fn(*a, **kw)
            except Exception as e:  # noqa: BLE001 - record and go on
                traceback.print_exc()
                RESULTS[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
            gc.collect()
            torch.cuda.empty_cache()
        return run
    return wrap


def host_us_per_call(fn, iters=1000, warmup=100, rounds=7) -> dict:
    """Per eager call: wall time of a loop of calls (CPU-bound when the kernel is shorter than the CPU
    work) and this thread's CPU time; median over rounds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    wall, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(iters):
            fn()
        c1 = time.thread_time()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) / iters * 1e6)
        cpu.append((c1 - c0) / iters * 1e6)
    return {"wall_us": sorted(wall)[rounds // 2], "cpu_us": sorted(cpu)[rounds // 2], "min_wall_us": min(wall)}


@section("eager_cost")
def eager_cost():
    out = {}
    dev = "cuda"
    for n, k in [(4096, 4096), (1024, 1024)]:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16)
        lin.weight.data.copy_(w)
        q = lowbit.nn.KbitLinear.from_linear(lin, bits=4)
        qf = lowbit.quantize_kbit(w, bits=4).to(dev)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        x3 = x.view(1, 1, k)
        linb = torch.nn.Linear(k, n, bias=True, device=dev, dtype=torch.bfloat16)
        qb = lowbit.nn.KbitLinear.from_linear(linb, bits=4)
        with torch.no_grad():
            row = {
                "F.linear bf16": host_us_per_call(lambda: F.linear(x, w)),
                "nn.Linear bf16": host_us_per_call(lambda: lin(x)),
                "lowbit.kbit_linear (functional op)": host_us_per_call(lambda: lowbit.kbit_linear(x, qf)),
                "KbitLinear module (eager fast path)": host_us_per_call(lambda: q(x)),
                "KbitLinear x3-D input [1,1,K]": host_us_per_call(lambda: q(x3)),
                "KbitLinear + bias, 3-D input": host_us_per_call(lambda: qb(x3)),
            }
        out[f"{k}x{n} M=1"] = row
        for name, r in row.items():
            print(f"   {k}x{n} M=1  {name:40s} wall {r['wall_us']:6.1f}  cpu {r['cpu_us']:6.1f}  min {r['min_wall_us']:6.1f} us/call")
    # MoE expert block, Qwen3-30B-A3B layer shape, one decode token
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)
    with torch.device(dev):
        ex = Qwen3MoeExperts(cfg).to(torch.bfloat16)
        torch.nn.init.normal_(ex.gate_up_proj, std=0.02)
        torch.nn.init.normal_(ex.down_proj, std=0.02)
    qex = lowbit.nn.KbitMoeExperts.from_experts(ex, bits=4)
    h = torch.randn(1, 2048, device=dev, dtype=torch.bfloat16)
    idx = torch.randperm(128, device=dev)[:8][None]
    wts = torch.softmax(torch.randn(1, 8, device=dev), -1).to(torch.bfloat16)
    with torch.no_grad():
        row = {"transformers Qwen3MoeExperts bf16 (eager)": host_us_per_call(lambda: ex(h, idx, wts), iters=100, rounds=3),
               "KbitMoeExperts (eager fast path)": host_us_per_call(lambda: qex(h, idx, wts), iters=300, rounds=5)}
    out["experts E=128 H=2048 I=768 top8 T=1"] = row
    for name, r in row.items():
        print(f"   experts T=1  {name:40s} wall {r['wall_us']:6.1f}  cpu {r['cpu_us']:6.1f} us/call")
    return out


def _alloc() -> int:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def _build(name: str, layers: int | None = None):
    """A random-init bf16 model on the GPU from ``lowbit.hf.sources.RANDOM_CONFIGS``."""
    return sources.load(f"random:{name}", dtype=torch.bfloat16, device="cuda", layers=layers)[0]


def _eager_generate_tps(model, vocab, new_tokens=32, batch=1) -> float:
    ids = torch.randint(0, vocab, (batch, 16), device="cuda")
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        torch.cuda.synchronize()
    return batch * new_tokens / (time.perf_counter() - t0)


def _graph_decode_ms(model, context=512, steps=50) -> float:
    """ms per decode step at `context` tokens: lowbit.hf.decode's loop (static cache, step in a CUDA graph)."""
    ids = torch.randint(0, model.config.vocab_size, (1, context), device="cuda")
    return decode.greedy_decode(model, ids, steps + 1, graph=True).ms_per_step()


def _memory_row(model, report, before_bytes, base) -> dict:
    from lowbit.nn import KbitLinear, KbitMoeExperts

    used = _alloc() - base
    fmt = sum(x.format_bytes for x in report.layers)
    rest = sum(p.nbytes for p in model.parameters()) + sum(
        b.nbytes for m in model.modules() if not isinstance(m, (KbitLinear, KbitMoeExperts)) for b in m.buffers(recurse=False))
    return {"bf16_allocated": before_bytes, "quantized_allocated": used, "kbit_format_bytes": fmt,
            "unquantized_bytes": rest, "allocated_over_format_plus_unquantized": used / (fmt + rest),
            "quantize_seconds": report.seconds, "layers": len(report.layers),
            "quantized_layer_bytes_before": report.bytes_before, "quantized_layer_bytes_after": report.bytes_after}


def _quantize_and_measure(model, cfg, out, bits, before, base, new_tokens):
    """Quantize in place, then memory, eager generate and CUDA-graph decode of the kbit model."""
    t0 = time.perf_counter()
    report = lowbit.quantize_model(model, bits=bits)
    out["quantize_wall_seconds"] = time.perf_counter() - t0
    print(report)
    out.update(_memory_row(model, report, before, base))
    out[f"kbit{bits}_eager_generate_tok_s"] = _eager_generate_tps(model, cfg.vocab_size, new_tokens=new_tokens)
    try:
        out[f"kbit{bits}_graph_decode_ms"] = _graph_decode_ms(model)
    except Exception as e:  # noqa: BLE001
        out[f"kbit{bits}_graph_decode_ms"] = f"{type(e).__name__}: {e}"
    for k, v in out.items():
        print(f"   {k}: {v}")
    return out


@section("llama-3-8b")
def llama8b(bits=4):
    base = _alloc()
    t0 = time.perf_counter()
    model = _build("llama-3-8b")
    cfg = model.config
    out = {"build_seconds": time.perf_counter() - t0}
    before = _alloc() - base
    out["bf16_eager_generate_tok_s"] = _eager_generate_tps(model, cfg.vocab_size)
    try:
        out["bf16_graph_decode_ms"] = _graph_decode_ms(model)
    except Exception as e:  # noqa: BLE001
        out["bf16_graph_decode_ms"] = f"{type(e).__name__}: {e}"
    return _quantize_and_measure(model, cfg, out, bits, before, base, new_tokens=32)


@section("qwen3-30b-a3b")
def qwen3_moe(layers: int, bits=4):
    base = _alloc()
    model = _build("qwen3-30b-a3b", layers)
    cfg = model.config
    before = _alloc() - base
    out = {"layers": f"{layers} of 48"}
    out["bf16_eager_generate_tok_s"] = _eager_generate_tps(model, cfg.vocab_size, new_tokens=16)
    return _quantize_and_measure(model, cfg, out, bits, before, base, new_tokens=16)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="models_gpu.json")
    p.add_argument("--skip-moe", action="store_true")
    p.add_argument("--moe-layers", type=int, default=24)
    args = p.parse_args()
    RESULTS["device"] = torch.cuda.get_device_name()
    RESULTS["torch"] = torch.__version__
    eager_cost()
    llama8b()
    if not args.skip_moe:
        qwen3_moe(args.moe_layers)
    with open(args.out, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
