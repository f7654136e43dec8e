"""Greedy decoding with a static KV cache; on CUDA a whole decode step is one CUDA-graph replay.

A step is: forward one token per sequence through the model (static cache), argmax, feed the
token back, advance the position -- all on the device, captured once, so a token costs kernel
time, not Python time. transformers 5.x static cache layers keep their fill level on the device
and advance it on every update, graph replays included, so replaying the captured step walks
through the cache by itself; the loop only copies each new token out.

``compile=True`` first compiles the decode step with ``torch.compile(fullgraph=True)`` (inductor
fuses norms, rope and the other elementwise work) and captures the compiled code.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch


@dataclass
class DecodeResult:
    tokens: torch.Tensor          # [batch, new_tokens] (int64, CPU)
    prefill_s: float
    decode_s: float               # for new_tokens - 1 steps (the first token comes from the prefill)
    mode: str                     # "cuda-graph", "cuda-graph+compile", "eager"
    breakdown: dict | None = None  # profile=True: CUDA kernel ms per step by category

    @property
    def steps(self) -> int:
        return self.tokens.shape[1] - 1

    def tokens_per_s(self) -> float:
        return self.tokens.shape[0] * self.steps / self.decode_s if self.decode_s > 0 else float("nan")

    def ms_per_step(self) -> float:
        return self.decode_s / max(1, self.steps) * 1e3


def kernel_category(name: str) -> str:
    """Group a CUDA kernel name for the decode-step breakdown."""
    n = name.lower()
    if n.startswith("triton"):  # inductor's fused glue (its names can mention the ops around it, e.g. kbit_gemv)
        return "other (norms, rope, activations, routing, argmax)"
    if n.startswith("nccl") or any(k in n for k in ("all_reduce", "allreduce", "all_gather", "allgather")):
        return "all-reduce / all-gather (tensor parallel)"
    if "kbit" in n:
        return "kbit GEMV (lowbit)"
    if "dense_gemv" in n:
        return "dense GEMV (lowbit)"
    if "int4" in n or "tinygemm" in n:
        return "int4 matmul (torch)"
    if any(k in n for k in ("flash", "fmha", "attention", "attn", "sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "gemv", "cutlass", "xmma", "cublas", "sm90_", "nvjet")):
        return "cuBLAS matmul (bf16 linears, lm_head)"
    return "other (norms, rope, activations, routing, argmax)"


def profile_steps(step, steps: int = 3, trace: str | None = None) -> dict:
    """CUDA kernel time per decode step by category (torch.profiler over eager calls of ``step``);
    ``trace``: also write the profile as a Chrome trace (JSON) to that path. Under programmatic launch
    a kernel that starts early counts its waiting time, so the categories overlap and can sum to more
    than the step: read such steps' traces (``benchmarks/tools/step_trace.py``)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    if trace:
        from pathlib import Path

        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(trace)
    cats: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0.0)
        if not t or ev.key.startswith(("cudaLaunch", "cudaGraph", "Memcpy", "Memset")) or ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        cats[kernel_category(ev.key)] = cats.get(kernel_category(ev.key), 0.0) + t / steps / 1e3
        kernels[ev.key] = t / steps / 1e3
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:8])
    return {"ms_per_step_by_category": cats, "kernel_ms_per_step": sum(cats.values()), "top_kernels_ms": top}


@contextlib.contextmanager
def decode_pdl(enabled: bool = True):
    """Programmatic dependent launch for a decode loop: lowbit's GEMVs
    (:func:`lowbit.programmatic_launch`) and the Triton kernels torch.compile generates inside the
    block (``torch._inductor.config.triton.enable_pdl``). Each kernel of a step then launches while
    its predecessor drains and waits for it only before touching its data. Both sides must take
    part: lowbit's kernels alone measured no gain (their predecessors never let them start early).
    A torch without the inductor switch gets lowbit's half only."""
    from ..kernels.device import programmatic_launch

    if not enabled:
        yield
        return
    import torch._inductor.config as inductor_config

    patch = (inductor_config.patch({"triton.enable_pdl": True}) if hasattr(inductor_config.triton, "enable_pdl")
             else contextlib.nullcontext())
    with patch, programmatic_launch(True):
        yield


#: logits per chunk of the first stage of :func:`argmax_rows`
ARGMAX_CHUNK = 512


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` of ``[B, V]`` in two stages: the argmax of each ``ARGMAX_CHUNK``-wide chunk, then of
    the chunks' maxima. The same index (the first maximum; NaN counts as the maximum, as in torch), but one
    block per chunk instead of one per row: over a 128K vocabulary the one-stage reduction (eager or inductor's)
    is a single ~27 us block per row on the H100, a whole batch-1 step's 1%."""
    b, v = logits.shape
    if v <= 2 * ARGMAX_CHUNK:
        return logits.argmax(-1)
    pad = -v % ARGMAX_CHUNK
    x = torch.nn.functional.pad(logits, (0, pad), value=float("-inf")) if pad else logits
    vals, idx = x.view(b, -1, ARGMAX_CHUNK).max(-1)   # per chunk: first maximum (NaN wins), its index
    best = vals.argmax(-1, keepdim=True)               # the first chunk holding the row's maximum
    return (best * ARGMAX_CHUNK + idx.gather(-1, best))[:, 0]


def greedy_decode(model, input_ids: torch.Tensor, max_new_tokens: int, *, graph: bool | None = None,
                  compile: bool = False, eos_token_id: int | None = None, warmup: int = 2,
                  profile: bool = False, gqa_sdpa: bool = True, profile_graph: bool = False,
                  profile_trace: str | None = None, pdl: bool | None = None,
                  lowbit_router: bool = True, fused_attention: bool = True, fused_layers: bool = True,
                  dense_head: bool = True) -> DecodeResult:
    """Greedy-decode ``max_new_tokens`` tokens after ``input_ids [batch, prompt]`` (same length each row).

    ``graph``: capture the step in a CUDA graph (default: on CUDA). On CPU the loop stops early
    once every row produced ``eos_token_id``; on CUDA it runs all steps (fixed work: timings).
    ``profile``: CUDA kernel time per step by category, from eager calls of the (compiled) step, or
    with ``profile_graph`` from replays of the captured graph (the kernels as the timed loop runs them);
    ``profile_trace``: write that profile as a Chrome trace to this path too.
    ``pdl``: programmatic dependent launch for the decode steps, lowbit's kernels and the compiled
    step's Triton kernels alike (:func:`decode_pdl`); default: on when compiling on sm_90+.
    ``gqa_sdpa``: on CUDA, switch a model that runs transformers' "sdpa" attention to
    :func:`lowbit.hf.attention.sdpa_gqa_attention` (K/V heads read in place, not repeated; the
    model keeps that setting).
    ``lowbit_router``: on CUDA, route the model's MoE softmax routers through lowbit's router kernel
    (:func:`lowbit.hf.router.use_lowbit_router`; the model keeps that too).
    ``fused_attention``: with ``gqa_sdpa`` on CUDA, run each Llama-pattern attention layer's decode step
    (rotary embedding, KV-cache append, attention) as one kernel
    (:func:`lowbit.hf.attention.use_fused_decode_attention`; kept too).
    ``fused_layers``: with ``fused_attention``, run each Llama-pattern decoder layer's residual adds and
    RMSNorms inside its kbit GEMVs (:func:`lowbit.hf.layers.use_fused_decode_layers`; kept too).
    ``dense_head``: on CUDA, run an unquantized fp16/bf16 ``lm_head``'s decode rows through lowbit's dense GEMV
    (:func:`lowbit.hf.head.use_dense_head`; kept too), bf16 models and quantized ones alike; a head transformers
    split for tensor parallelism is first made this rank's local rows (:func:`lowbit.hf.tp.localize_head`).
    """
    from transformers import StaticCache

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be [batch, prompt_len >= 1], got {tuple(input_ids.shape)}")
    device = next(model.parameters()).device
    graph = device.type == "cuda" if graph is None else graph
    if graph and device.type != "cuda":
        raise ValueError("CUDA-graph decoding needs the model on a GPU")
    if gqa_sdpa and device.type == "cuda":
        from .attention import NAME, use_fused_decode_attention, use_gqa_sdpa

        use_gqa_sdpa(model)
        # also when an earlier call (or the user) already switched the model: the fused layers need lowbit's
        # attention function, and switching them twice changes nothing
        if fused_attention and getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME:
            use_fused_decode_attention(model)
            if fused_layers:
                from .layers import use_fused_decode_layers

                use_fused_decode_layers(model)
    if dense_head and device.type == "cuda":
        from .head import use_dense_head

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from .tp import localize_head

            localize_head(model)  # a head transformers split while loading: its rows, local (else cuBLAS)
        use_dense_head(model)
    if lowbit_router and device.type == "cuda":
        from .router import use_lowbit_router

        use_lowbit_router(model)
    batch, prompt = input_ids.shape
    input_ids = input_ids.to(device)
    cache = StaticCache(config=model.config, max_cache_len=prompt + max_new_tokens + warmup + 8)
    out = torch.empty((batch, max_new_tokens), dtype=torch.long, device=device)

    def next_token(tok, pos):  # the forward, the argmax and the feedback: one compiled graph
        tok.copy_(argmax_rows(model(tok, past_key_values=cache, position_ids=pos, use_cache=True).logits[:, -1])[:, None])
        pos.add_(1)

    step_fn = torch.compile(next_token, fullgraph=True, dynamic=False) if compile else next_token

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if pdl is None:
        pdl = compile and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
    with torch.no_grad(), decode_pdl(pdl):
        sync()
        t0 = time.perf_counter()
        pos = torch.arange(prompt, device=device).expand(batch, -1)
        logits = model(input_ids, past_key_values=cache, position_ids=pos, use_cache=True).logits[:, -1]
        tok = logits.argmax(-1, keepdim=True)
        out[:, 0] = tok[:, 0]
        sync()
        prefill_s = time.perf_counter() - t0
        pos = torch.full((batch, 1), prompt, dtype=torch.long, device=device)

        def step():
            step_fn(tok, pos)

        i = 1
        if graph:
            # Warm-up steps are real steps (they advance the cache); capture executes nothing.
            s = torch.cuda.Stream(device)
            s.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(s):
                while i < min(1 + warmup, max_new_tokens):
                    step()
                    out[:, i] = tok[:, 0]
                    i += 1
            torch.cuda.current_stream(device).wait_stream(s)
            g = None
            if i < max_new_tokens:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step()
            sync()
            t0 = time.perf_counter()
            t_start_i = i
            while i < max_new_tokens:
                g.replay()
                out[:, i] = tok[:, 0]
                i += 1
            sync()
            # time the replayed steps only; warm-up (compile) steps are set-up
            decode_s = (time.perf_counter() - t0) * (max_new_tokens - 1) / max(1, max_new_tokens - t_start_i) \
                if max_new_tokens > t_start_i else 0.0
            mode = "cuda-graph+compile" if compile else "cuda-graph"
            if profile:  # eager steps: same kernels, no graph; or the graph's replays
                breakdown = profile_steps(g.replay if profile_graph and g is not None else step, trace=profile_trace)
                breakdown["source"] = "graph replays" if profile_graph and g is not None else "eager steps"
            else:
                breakdown = None
        else:
            t0 = time.perf_counter()
            while i < max_new_tokens:
                step()
                out[:, i] = tok[:, 0]
                i += 1
                if eos_token_id is not None and device.type == "cpu" and bool((out[:, :i] == eos_token_id).any(1).all()):
                    break
            sync()
            decode_s = time.perf_counter() - t0
            mode = "eager+compile" if compile else "eager"
            breakdown = profile_steps(step, trace=profile_trace) if profile and device.type == "cuda" else None
    return DecodeResult(out[:, :i].cpu(), prefill_s, decode_s, mode, breakdown)
