"""End-to-end decode speed on the GPU, every variant in the same loop (issue 12).

    python3 benchmarks/e2e_gpu.py --model llama-3-8b --batch 1 --variants bf16,lowbit-dense,torch-int4,kbit2,kbit3,kbit4,kbit5 --out e2e.json

Random-init models from transformers configs (``lowbit.hf.sources.RANDOM_CONFIGS``, no weights).
Each variant rebuilds the model from the same seed, swaps its block linears (lm_head stays bf16, quantized
in ``kbit<K>+lm_head<B>`` variants; ``nvfp4[+fuse]``: NVFP4 linears); ``+fuse``: projections of one
input fused, ``quantize_model(fuse=True)``; ``kbit<K>-keep-<name>`` leaves the modules named <name>
unquantized), then decodes with
``lowbit.hf.decode.greedy_decode``: static KV cache, a ``--context``-token prompt (default 512),
the whole step compiled (torch.compile, unless ``--no-compile``) and captured in a CUDA graph.
``--profile`` adds the CUDA kernel time per step by category (torch.profiler over eager steps).
``--sdpa`` restricts torch's scaled-dot-product attention to one backend (default: torch's choice).
``--fresh`` times each variant in a process of its own, as a deployment runs one model: in one process a row after
another model reads up to 6% slower (bf16 Qwen3-30B-A3B; kbit4 up to 2%), which favours whatever runs first.
A variant may end in ``@<switch>`` (repeatable) to set one switch for it alone, for A/B rows in one process:
``@early-kv`` / ``@no-early-kv`` (``lowbit.kernels.attention.EARLY_KV``), ``@head-splits-<1|2|4|8>`` and
``@chunk-<64|128|192|256>`` (the attention grid: ``lowbit.kernels.attention.HEAD_SPLITS`` / ``CHUNK`` instead of its plan), ``@routed`` / ``@no-routed``
(``lowbit.dispatch.MOE_ROUTED``: MoE decode on unsorted rows, or sorted by expert), ``@routed-split-all``
(``lowbit.kernels.tiled.ROUTED_ONE_WAVE = False``: the routed GEMV with one group per warp), ``@qk-norm-modules``
(``lowbit.hf.attention.QK_NORM_IN_KERNEL = False``: Qwen3's q/k norms as the model's modules, not in the op),
``@no-fused-layers`` (``lowbit.hf.layers.FUSED = False``: the residual adds and the post-attention norm as kernels
of their own, not in the GEMVs' outputs), ``@no-swiglu`` (``lowbit.hf.layers.SWIGLU = False``: the fused layers'
gate|up GEMV writes gate|up and SiLU-mul is a kernel of its own), ``@cublas-head`` (``lowbit.hf.head.DENSE = False``:
a bf16 lm_head through cuBLAS, not lowbit's dense GEMV; every variant, bf16 included, takes the same head kernel),
``@moe-sum`` (``lowbit.nn.experts.COMBINE_TERMS = False``: a compiled MoE block sums each token's k expert rows as a
reduction, not as k terms that inductor fuses into the next kernel), ``@no-routed-swiglu``
(``lowbit.nn.experts.ROUTED_SWIGLU = False``: the routed MoE block's SiLU-mul as its own step, not computed by the
down GEMV from gate|up's output), ``@stage-x-always`` (``lowbit.kernels.tiled.STAGE_X_MIN_UNITS = 0``: the kbit K <= 3
GEMVs stage x in shared memory however few units a warp has), ``@no-bulk`` / ``@bulk-all``
(``lowbit.kernels.tiled.USE_BULK = False``: no bulk-copy GEMV; ``DENSE_PATH = "bulk"``: the bulk-copy GEMV for every
call it can take, not only where ``bulk_rule`` picks it), ``@bulk-m1`` / ``@bulk-m8`` (``BULK_LAYER_MAX_M``: the
decode layers' calls of more than one token off the bulk-copy GEMV at every K, as before 2026-11-28 / on it at every
K), ``@no-bulk-swiglu`` (``BULK_SWIGLU_BITS = ()``: gate|up's SwiGLU GEMV stays the stream-K kernel's),
``@bulk-swiglu`` (``BULK_SWIGLU_BITS = (2, 3, 4)``: gate|up's SwiGLU GEMV on the bulk-copy kernel at every K),
``@no-split`` (``lowbit.kernels.tiled.use_split`` says no: the
shapes the split GEMV would take in one wave go to the CTA-local stream-K kernel),
``@gemm-fill-slots`` (``lowbit.kernels.tiled.gemm_splits`` as before 2026-11-28: the GEMM's K splits fill every
resident CTA slot, two per SM where the instance fits them, rather than one CTA per SM), ``@simt-attention`` /
``@mma-attention`` (``lowbit.kernels.attention.KERNEL``: decode attention on CUDA cores / on tensor cores wherever
compiled, not as the plan picks), ``@mma-warps-4`` / ``@mma-warps-8`` (``MMA_WARPS``: the tensor-core kernel's warps
per CTA).
"""

import argparse
import json
import time
import traceback

import torch
from torch import nn

import lowbit
from lowbit.bench.methods import _int4_prepare
from lowbit.hf import decode, sources


class DenseGemvLinear(nn.Module):
    """bf16 weight through lowbit.dense_linear (tuned GEMV for M <= 4)."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.weight = lin.weight
        self.bias = lin.bias

    def forward(self, x):
        y = lowbit.dense_linear(x.contiguous(), self.weight)
        return y if self.bias is None else y + self.bias


class TorchInt4Linear(nn.Module):
    """torch.ops.aten._weight_int4pack_mm (tinygemm), int4 asymmetric, groups of 128."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        packed, sz = _int4_prepare(lin.weight.detach().to(torch.bfloat16))
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", sz)
        self.n = lin.out_features

    def forward(self, x):
        y = torch.ops.aten._weight_int4pack_mm(x.reshape(-1, x.shape[-1]).contiguous(), self.packed, 128, self.scales_zeros)
        return y.view(*x.shape[:-1], self.n)


def swap(model, cls):
    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            full = f"{name}.{cname}" if name else cname
            if isinstance(child, nn.Linear) and not full.endswith("lm_head"):
                setattr(mod, cname, cls(child))


def convert(model, variant):
    if variant == "bf16":
        return
    if variant == "lowbit-dense":
        return swap(model, DenseGemvLinear)
    if variant == "torch-int4":
        return swap(model, TorchInt4Linear)
    if variant.startswith("kbit"):  # kbit<K>[+fuse][+lm_head<B>][-keep-<module name>]
        variant, _, keep = variant.partition("-keep-")
        fuse = "+fuse" in variant  # quantize_model's default is fused; plain kbit<K> rows stay unfused
        variant = variant.replace("+fuse", "")
        bits_for = {"lm_head": int(variant.split("+lm_head")[1])} if "+lm_head" in variant else None
        skip = lowbit.model.quantize.DEFAULT_SKIP + ((f"*.{keep}",) if keep else ())
        lowbit.quantize_model(model, bits=int(variant[4]), bits_for=bits_for, skip=skip, fuse=fuse, progress=False)
        return
    if variant in ("nvfp4", "nvfp4+fuse"):  # as kbit: plain rows quantize each linear alone
        lowbit.quantize_model(model, format="nvfp4", fuse="+fuse" in variant, progress=False)
        return
    raise ValueError(variant)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--variants", default="bf16,kbit4")
    p.add_argument("--torch-router", action="store_true",
                   help="MoE routers as transformers runs them (default: lowbit's router kernel, lowbit.hf.router)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--context", type=int, default=512, help="prompt tokens before decoding starts")
    p.add_argument("--sdpa", default="", choices=("", "flash", "efficient", "cudnn", "math"),
                   help="torch SDPA backend (default: torch's choice)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--sdpa-attention", action="store_true",
                   help="decode attention through torch's SDPA instead of lowbit's kernel (lowbit.hf.attention.DECODE_KERNEL)")
    p.add_argument("--no-fused-attention", action="store_true",
                   help="RoPE, cache append and attention as transformers runs them (default: one lowbit kernel, "
                        "lowbit.hf.attention.use_fused_decode_attention)")
    p.add_argument("--no-pdl", action="store_true",
                   help="no programmatic dependent launch (default: on with compile, lowbit.hf.decode.decode_pdl)")
    p.add_argument("--profile", default="", help="comma-separated variants to profile")
    p.add_argument("--profile-graph", action="store_true", help="profile graph replays instead of eager steps")
    p.add_argument("--trace-dir", default="", help="write each profiled variant's Chrome trace here")
    p.add_argument("--kbit-path", default="auto", choices=("auto", "split", "streamk", "local"),
                   help="dense kbit GEMV schedule for every shape (default: the per-shape choice)")
    p.add_argument("--local", action=argparse.BooleanOptionalAction, default=None,
                   help="let auto pick the stream-K GEMV's CTA-local mode (default: lowbit.kernels.tiled.USE_LOCAL)")
    p.add_argument("--stage-x", action=argparse.BooleanOptionalAction, default=None,
                   help="stream-K GEMVs at K <= 3 copy x to shared memory (default: lowbit.kernels.tiled.STAGE_X)")
    p.add_argument("--early-kv", action=argparse.BooleanOptionalAction, default=None,
                   help="fused attention loads its first K/V rows before the PDL wait (default: "
                        "lowbit.kernels.attention.EARLY_KV)")
    p.add_argument("--reduce-each", action="store_true",
                   help="attention reduces each score on its own, as before warp_sum8 (A/B timing)")
    p.add_argument("--fresh", action="store_true",
                   help="time each variant in a process of its own (its first and only row): a later row of one "
                        "process reads up to 6%% slower once another model has come and gone "
                        "(benchmarks/journal/2026-11-26_early_ids_tp_rows_row_order.md)")
    p.add_argument("--out", default="e2e.json")
    args = p.parse_args()
    if args.fresh:
        return run_fresh(args)
    if args.sdpa:
        chosen = {"efficient": "mem_efficient"}.get(args.sdpa, args.sdpa)
        for b in ("flash", "mem_efficient", "cudnn", "math"):
            getattr(torch.backends.cuda, f"enable_{b}_sdp")(b == chosen)
    from lowbit.hf import attention as hf_attention
    from lowbit.hf import head as hf_head
    from lowbit.hf import layers as hf_layers
    from lowbit.kernels import tiled
    from lowbit.nn import experts as nn_experts

    hf_attention.DECODE_KERNEL = not args.sdpa_attention
    from lowbit.kernels import attention as kattn

    if args.early_kv is not None:
        kattn.EARLY_KV = args.early_kv
    kattn.REDUCE_EACH = args.reduce_each

    tiled.DENSE_PATH = args.kbit_path
    if args.local is not None:
        tiled.USE_LOCAL = args.local
    if args.stage_x is not None:
        tiled.STAGE_X = args.stage_x
    from lowbit import dispatch

    # @switch -> (module, attribute, value); each variant starts from the command line's settings
    switches = {"early-kv": (kattn, "EARLY_KV", True), "no-early-kv": (kattn, "EARLY_KV", False),
                **{f"head-splits-{n}": (kattn, "HEAD_SPLITS", n) for n in (1, 2, 4, 8)},
                **{f"chunk-{c}": (kattn, "CHUNK", c) for c in (64, 128, 192, 256)},
                "simt-attention": (kattn, "KERNEL", "simt"), "mma-attention": (kattn, "KERNEL", "mma"),
                **{f"mma-warps-{w}": (kattn, "MMA_WARPS", w) for w in (4, 8)},
                "routed": (dispatch, "MOE_ROUTED", True), "no-routed": (dispatch, "MOE_ROUTED", False),
                "routed-split-all": (tiled, "ROUTED_ONE_WAVE", False),
                "qk-norm-modules": (hf_attention, "QK_NORM_IN_KERNEL", False),
                "fused-layers": (hf_layers, "FUSED", True), "no-fused-layers": (hf_layers, "FUSED", False),
                "swiglu": (hf_layers, "SWIGLU", True), "no-swiglu": (hf_layers, "SWIGLU", False),
                "dense-head": (hf_head, "DENSE", True), "cublas-head": (hf_head, "DENSE", False),
                "moe-terms": (nn_experts, "COMBINE_TERMS", True), "moe-sum": (nn_experts, "COMBINE_TERMS", False),
                "routed-swiglu": (nn_experts, "ROUTED_SWIGLU", True),
                "no-routed-swiglu": (nn_experts, "ROUTED_SWIGLU", False),
                "stage-x-always": (tiled, "STAGE_X_MIN_UNITS", 0),
                "bulk": (tiled, "USE_BULK", True), "no-bulk": (tiled, "USE_BULK", False),
                "bulk-all": (tiled, "DENSE_PATH", "bulk"), "no-bulk-swiglu": (tiled, "BULK_SWIGLU_BITS", ()),
                "bulk-m1": (tiled, "BULK_LAYER_MAX_M", {}), "bulk-m8": (tiled, "BULK_LAYER_MAX_M", {2: 8, 3: 8, 4: 8}),
                "bulk-swiglu": (tiled, "BULK_SWIGLU_BITS", (2, 3, 4)),
                "no-split": (tiled, "use_split", lambda *a: False),
                "gemm-fill-slots": (tiled, "gemm_splits", lambda rb, ch, g, sms, per_sm=1, f=tiled.gemm_splits:
                                    f(rb, ch, g, per_sm * sms))}
    defaults = {(mod, attr): getattr(mod, attr) for mod, attr, _ in switches.values()}
    names = args.variants.split(",")
    for name in names:  # refuse an unknown @switch before any model is built
        for o in name.split("@")[1:]:
            if o not in switches:
                p.error(f"variant {name!r}: unknown switch @{o} (known: {', '.join('@' + k for k in switches)})")
    rows = []
    base = None
    for i, name in enumerate(names):
        variant, *opts = name.split("@")
        for (mod, attr), value in defaults.items():
            setattr(mod, attr, value)
        for o in opts:
            mod, attr, value = switches[o]
            setattr(mod, attr, value)
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        print(f"\n=== {args.model} layers={args.layers} batch={args.batch} {name}", flush=True)
        try:
            torch.manual_seed(0)
            model, _, desc = sources.load(f"random:{args.model}", dtype=torch.bfloat16, device="cuda", layers=args.layers)
            t0 = time.perf_counter()
            convert(model, variant)
            torch.cuda.synchronize()
            conv_s = time.perf_counter() - t0
            ids = torch.randint(0, model.config.vocab_size, (args.batch, args.context), generator=torch.Generator().manual_seed(1))
            r = decode.greedy_decode(model, ids, args.tokens, compile=not args.no_compile,
                                     profile=name in args.profile.split(","), profile_graph=args.profile_graph,
                                     pdl=False if args.no_pdl else None, lowbit_router=not args.torch_router,
                                     fused_attention=not args.no_fused_attention,
                                     profile_trace=f"{args.trace_dir}/{name.replace('+', '_').replace('@', '_')}.trace.json"
                                     if args.trace_dir else None)
            tps = r.tokens_per_s()
            base = base or (tps if variant == "bf16" else None)
            row = {"model": desc, "batch": args.batch, "context": args.context, "sdpa": args.sdpa or "default",
                   "kbit_path": args.kbit_path, "local": tiled.USE_LOCAL, "stage_x": tiled.STAGE_X, "early_kv": kattn.EARLY_KV, "reduce_each": kattn.REDUCE_EACH,
                   "moe_routed": dispatch.MOE_ROUTED, "fused_layers": hf_layers.FUSED, "swiglu": hf_layers.SWIGLU,
                   "dense_head": hf_head.DENSE, "moe_combine_terms": nn_experts.COMBINE_TERMS,
                   "fused_attention": not args.no_fused_attention and not args.sdpa_attention, "variant": name,
                   "pdl": not args.no_pdl and not args.no_compile,
                   "attention": "sdpa" if args.sdpa_attention else "lowbit",
                   "router": "torch" if args.torch_router else "lowbit", "tokens_per_s": tps, "ms_per_step": r.ms_per_step(),
                   "mode": r.mode, "convert_s": conv_s, "speedup_vs_bf16": tps / base if base else None,
                   "allocated_gb": torch.cuda.memory_allocated() / 1e9, "breakdown": r.breakdown,
                   "first_tokens": r.tokens[0, :8].tolist(), "row_in_process": i}
            rows.append(row)
            print(f"    {tps:8.1f} tok/s  {r.ms_per_step():6.2f} ms/step  {r.mode}  "
                  + (f"{tps / base:.2f}x bf16" if base else ""), flush=True)
            if r.breakdown:
                for cat, ms in sorted(r.breakdown["ms_per_step_by_category"].items(), key=lambda kv: -kv[1]):
                    print(f"      {cat:48s} {ms:6.3f} ms")
                print(f"      {'kernel total':48s} {r.breakdown['kernel_ms_per_step']:6.3f} ms")
            del model
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            rows.append({"model": args.model, "batch": args.batch, "variant": name, "error": repr(e)})
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1, default=str)


def run_fresh(args) -> None:
    """--fresh: this script once per variant (the same arguments, one variant, no --fresh), in order; the rows
    gathered into --out, each variant's speedup against the first bf16 row."""
    import subprocess
    import sys
    import tempfile

    argv = [a for a in sys.argv[1:] if a != "--fresh"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(args.variants.split(",")):
            out = f"{tmp}/row{i}.json"
            cmd = [sys.executable, __file__, *_replace_arg(_replace_arg(argv, "--variants", name), "--out", out)]
            done = subprocess.run(cmd, check=False)
            got = []
            if done.returncode == 0:
                with open(out) as f:
                    got = json.load(f)
            rows += got or [{"model": args.model, "batch": args.batch, "variant": name,
                             "error": f"exit {done.returncode}"}]
    base = next((r["tokens_per_s"] for r in rows if r.get("variant") == "bf16" and "tokens_per_s" in r), None)
    print("\n=== each variant in a process of its own")
    for r in rows:
        r["process"] = "fresh"
        if "tokens_per_s" in r:
            r["speedup_vs_bf16"] = r["tokens_per_s"] / base if base else None
            print(f"    {r['variant']:32s} {r['tokens_per_s']:8.1f} tok/s" + (f"  {r['tokens_per_s'] / base:.2f}x bf16" if base else ""))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1, default=str)


def _replace_arg(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with ``flag``'s value set to ``value`` (``--flag v`` or ``--flag=v``; appended when absent)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out + [flag, value]


if __name__ == "__main__":
    main()
