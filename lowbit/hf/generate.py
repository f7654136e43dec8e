"""``lowbit generate``: load a model, quantize it (or load a saved quantized one), decode, report.

    lowbit generate                                  # SmolLM2-135M-Instruct, kbit4, on the GPU if any
    lowbit generate --bits 3 --compare --prompt "What is the capital of Egypt?"
    lowbit generate --bits 3 --method gptq --compare --save smol-kbit3   # calibrated (GPTQ), then saved
    lowbit generate --model random:llama-3-8b --compile --max-new-tokens 128   # speed only
    lowbit generate --model random:llama-3-8b --compile --compare --format kbit,nvfp4   # formats side by side

With ``--compare`` the unquantized model decodes first; both outputs are printed with their
tokens/s, and the quantized model is scored teacher-forced on the unquantized model's own
sequence (mean KL, top-1 agreement, perplexity; see ``lowbit.hf.quality``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..dispatch import untuned_note
from ..nn import formats, linear_class

DEFAULT_PROMPT = "What is the capital of Japan?"


def _input_ids(tok, prompt: str, batch: int, vocab: int, chat: bool) -> torch.Tensor:
    if tok is None:  # random-init model: a fixed pseudo-prompt
        g = torch.Generator().manual_seed(0)
        return torch.randint(0, vocab, (batch, 16), generator=g)
    if chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    else:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
    return ids.expand(batch, -1).contiguous()


def _text(tok, tokens: torch.Tensor) -> str:
    if tok is None:
        return " ".join(map(str, tokens.tolist()[:24])) + (" ..." if tokens.numel() > 24 else "")
    ids = tokens.tolist()
    if tok.eos_token_id is not None and tok.eos_token_id in ids:
        ids = ids[: ids.index(tok.eos_token_id)]
    return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()


def _linear_bytes(model) -> int:
    """Bytes of the layers quantization replaces, before or after: linears (the output head included)
    and MoE expert blocks, in whichever form they are now; shared tensors counted once."""
    from ..nn import QuantizedModule, fused_experts_layout

    seen, total = set(), 0

    def add(ts):
        nonlocal total
        for t in ts:
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.nbytes

    for m in model.modules():
        if isinstance(m, QuantizedModule):
            add(m.buffers(recurse=False))
        elif isinstance(m, torch.nn.Linear):
            add([m.weight])
        elif fused_experts_layout(m) is not None:
            add([m.gate_up_proj, m.down_proj])
    return total




def parse_formats(fmt) -> list[str]:
    """``"kbit"``, ``"kbit,nvfp4"`` or a sequence of names -> the list (ValueError on unknown or repeated)."""
    fmts = [f.strip() for f in fmt.split(",")] if isinstance(fmt, str) else list(fmt)
    known = formats()  # every format quantize_model writes (registered modules)
    bad = [f for f in fmts if f not in known]
    if not fmts or bad or len(set(fmts)) != len(fmts):
        raise ValueError(f"formats must be distinct names from {', '.join(known)} (comma-separated), got {fmt!r}")
    return fmts


def generate(model: str | None = None, *, bits: int = 4, prompt: str = DEFAULT_PROMPT, max_new_tokens: int = 48,
             batch: int = 1, compare: bool = False, device: str | None = None, dtype: torch.dtype | None = None,
             compile: bool = False, codebook=None, load: str | None = None, save: str | None = None,
             layers: int | None = None, chat: bool = True, graph: bool | None = None, quiet: bool = False,
             lm_head_bits: int | None = None, fuse: bool | None = None, fmt="kbit", method: str = "rtn",
             calibration: str | None = None, gptq_options=None, rotation: int | str = 0,
             tp_allreduce: str | None = None) -> dict:
    """The main job as a function; returns every number it prints (see the module docstring).

    ``fmt``: ``"kbit"``, ``"nvfp4"``, or several (``"kbit,nvfp4"``): each quantizes its own copy of
    the model and decodes the same prompt, so the formats are timed side by side in one process.
    ``result["quantized"]`` / ``result["quality"]`` describe the first; ``result["variants"]`` all.
    ``method="gptq"`` calibrates (``quantize_model(method="gptq")``) on ``calibration`` (a text file's
    path; default: lowbit's default text) with ``gptq_options`` (a ``lowbit.GptqOptions``); a random-init
    model (no tokenizer) calibrates on uniformly random token ids (seed 0): for timing only.
    ``codebook="auto"`` / ``rotation="auto"`` (the command line's defaults): with ``method="gptq"``, what
    :func:`lowbit.gptq_recipe` measured best for the format and bits (kbit 2-3 bits: fitted codebook,
    block-32 rotation, at 2 bits a second codebook round unless ``gptq_options`` says otherwise);
    otherwise the default codebook and no rotation.
    ``tp_allreduce`` (under torchrun): how row-split layers sum their partial outputs
    (:func:`lowbit.hf.tp.set_allreduce`: ``nccl``, ``symm-mem``, ``dtensor``).
    """
    import copy

    import lowbit

    from . import decode, quality, sources, tp

    if batch < 1 or max_new_tokens < 1:
        raise ValueError(f"batch and max_new_tokens must be >= 1, got {batch}, {max_new_tokens}")
    fmts = parse_formats(fmt)
    if len(fmts) > 1 and (load or save):
        raise ValueError("load / save take one format")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    world, mesh = tp.launched_world(), None
    if world > 1:  # under torchrun: every rank loads and quantizes, then keeps its part (lowbit.hf.tp)
        if len(fmts) > 1 or load or save or method != "rtn":
            raise ValueError("under torchrun (tensor parallel), generate takes one format, no load / save, method rtn")
        device, mesh = tp.setup(device.type)
        if tp_allreduce:
            tp.set_allreduce(tp_allreduce)
        quiet = quiet or mesh.get_local_rank() != 0  # rank 0 speaks for all
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    say = (lambda *a: None) if quiet else print
    t0 = time.perf_counter()
    # A random model that only the quantized copy needs (no --compare, one format, rounded to nearest) is built
    # layer by layer, each layer quantized before the next gets its weights: 70B shapes fit one GPU.
    layerwise = (model or "").startswith("random:") and not compare and len(fmts) == 1 and method == "rtn" and not load
    per_layer = []
    if layerwise:
        codebook_l, rotation_l, _ = resolve_recipe(fmts[0], bits, method, codebook, rotation, gptq_options)

        def each_layer(block):
            per_layer.append(lowbit.quantize_model(block, format=fmts[0], bits=bits, codebook=codebook_l, fuse=fuse,
                                                   progress=False, **({"rotation": rotation_l} if rotation_l else {})))
    net, tok, desc = sources.load(model, dtype=dtype, device=device, layers=layers,
                                  each_layer=each_layer if layerwise else None)
    load_s = time.perf_counter() - t0
    say(f"model: {desc} on {device} ({str(dtype).removeprefix('torch.')}), loaded in {load_s:.1f} s")
    if device.type == "cuda":
        note = untuned_note(torch.cuda.get_device_name(device))
        if note:
            say(note)
    ids = _input_ids(tok, prompt, batch, net.config.vocab_size, chat)
    eos = tok.eos_token_id if tok is not None else None
    result = {"model": desc, "device": str(device), "dtype": str(dtype).removeprefix("torch."), "bits": bits,
              "batch": batch, "prompt": prompt, "load_s": load_s, "variants": {},
              "random_weights": tok is None}  # random init: speed only, its logits are near-flat
    rows = []

    def run(m, label):
        r = decode.greedy_decode(m, ids, max_new_tokens, graph=graph, compile=compile, eos_token_id=eos)
        text = _text(tok, r.tokens[0])
        say(f"\n[{label}] {text}")
        rows.append([label, r, _linear_bytes(m), None])
        return r, text

    if compare:
        ref_r, ref_text = run(net, "unquantized")
        seq = torch.cat([ids[0], ref_r.tokens[0]])
        ref_logits = quality.logits_over(net, seq)
        result["unquantized"] = {"text": ref_text, "tokens_per_s": ref_r.tokens_per_s(), "ms_per_step": ref_r.ms_per_step(),
                                 "mode": ref_r.mode}
    for i, f in enumerate(fmts):
        m = net if i == len(fmts) - 1 else copy.deepcopy(net)  # the last format may take the original
        t0 = time.perf_counter()
        if load:
            lowbit.load_quantized(m, load, device=device, dtype=dtype)
            quantize_s = None
            result["load_s"] = time.perf_counter() - t0
            say(f"loaded the quantized weights from {load} in {result['load_s']:.1f} s")
            label = f"loaded from {load}"
        else:
            codebook_f, rotation_f, options_f = resolve_recipe(f, bits, method, codebook, rotation, gptq_options)
            kw = {} if method == "rtn" else dict(method=method, gptq=options_f, **calibration_data(
                tok, net.config.vocab_size, calibration, options_f))
            if rotation_f:
                kw["rotation"] = rotation_f
            report = lowbit.quantize_model(m, format=f, bits=bits, codebook=codebook_f, progress=not quiet, fuse=fuse,
                                           bits_for={"lm_head": lm_head_bits} if lm_head_bits else None, **kw)
            if per_layer:  # the decoder layers were quantized while the model was built: one report for all
                report.layers[:0] = [x for r in per_layer for x in r.layers]
                report.skipped = [s_ for s_ in report.skipped if s_[1] != "already quantized"]
                report.seconds += sum(r.seconds for r in per_layer)
                report.model_bytes_before += sum(r.model_bytes_before - r.model_bytes_after for r in per_layer)
                report.device = ",".join(sorted({r.device for r in per_layer} | ({report.device} - {"-"})))
            quantize_s = report.seconds
            label = variant_label(report.label.lower(), codebook_f, method, rotation_f, options_f) + \
                (f"+lm_head{lm_head_bits}" if lm_head_bits else "")
            say(str(report))
            if mesh is not None:
                split, plain = tp.shard_model(m, mesh)
                label += f" TP={world}"
                kind = tp.allreduce_kind()
                used = tp.resolve_allreduce(tp._group(mesh), torch.device(device))
                result["tensor_parallel"] = {"world": world, "split_modules": split, "split_plain_linears": plain,
                                             "allreduce": used, "allreduce_option": kind}
                say(f"tensor parallel over {world} ranks: {split} quantized modules split by the model's TP plan"
                    + (f", and {plain} unquantized linear{'s' * (plain > 1)}" if plain else "")
                    + f" (the rest replicated); all-reduce: {used}" + (" (auto)" if kind == "auto" else ""))
            result.setdefault("calibration", report.calibration and {
                "data": report.calibration.data, "seconds": report.calibration.seconds,
                "peak_memory": report.calibration.peak_memory})
        if save:
            # Unquantized tensors go to disk in half precision: a CPU run upcasts them to fp32 only to compute.
            save_dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
            t_save = time.perf_counter()
            lowbit.save_quantized(m, save, dtype=save_dtype)
            size = sum(p.stat().st_size for p in Path(save).glob("*.safetensors"))
            say(f"saved to {save}: {size / 2**20:.1f} MiB (unquantized tensors in {str(save_dtype).removeprefix('torch.')}) "
                f"in {time.perf_counter() - t_save:.1f} s")
        if not compare and not quiet and f == "kbit" and not load:  # before the text it qualifies
            note = expected_quality(variant_label(f"kbit{bits}", codebook_f, method, rotation_f, options_f))
            if note:
                print(note)
        q_r, q_text = run(m, label)
        variant = {"format": f, "text": q_text, "tokens_per_s": q_r.tokens_per_s(), "ms_per_step": q_r.ms_per_step(),
                   "mode": q_r.mode, "prefill_s": q_r.prefill_s, "quantize_s": quantize_s}
        if compare:
            n_prompt = ids.shape[1]
            q_logits = quality.logits_over(m, seq)
            q = quality.compare(ref_logits[n_prompt - 1:], q_logits[n_prompt - 1:], seq[n_prompt:])
            q["same_text"] = q_text == ref_text
            variant["quality"] = rows[-1][3] = q
        result["variants"][label] = variant
        if i == 0:
            result["quantized"] = {k: v for k, v in variant.items() if k not in ("quality", "quantize_s", "format")}
            result["quantize_s"] = quantize_s
            if compare:
                result["quality"] = variant["quality"]
        if m is not net:
            del m
            if device.type == "cuda":
                torch.cuda.empty_cache()
    _table(rows, result, quiet)
    if mesh is not None:
        # The split modules' TP forwards hold the process group in reference cycles. Freed only at interpreter exit,
        # a gloo group's worker threads were torn down then and a rank aborted ("terminate called without an active
        # exception"; twice in the CPU suite). So the model goes first, while the interpreter is whole.
        import gc

        del net, m
        gc.collect()
        tp.teardown()
    return result


def resolve_recipe(fmt: str, bits: int, method: str, codebook, rotation, options):
    """(codebook, rotation, GptqOptions) for one format: ``"auto"`` codebook / rotation filled from
    :func:`lowbit.gptq_recipe` with ``method="gptq"`` (else the default codebook, no rotation); the
    recipe's codebook rounds only where ``options`` left them at the default (1)."""
    import dataclasses

    import lowbit

    recipe = lowbit.gptq_recipe(fmt, bits) if method == "gptq" else {}
    if codebook == "auto":
        codebook = recipe.get("codebook")
    if rotation == "auto":
        rotation = recipe.get("rotation", 0)
    options = options or lowbit.GptqOptions()
    if method == "gptq" and codebook == "fit" and options.codebook_rounds == 1 and "codebook_rounds" in recipe:
        options = dataclasses.replace(options, codebook_rounds=recipe["codebook_rounds"])
    return codebook, rotation, options


def variant_label(base: str, codebook, method: str, rotation: int, options) -> str:
    """``kbit3-fit-gptq-h32``: the format, ``-fit`` (fitted codebook), ``-gptq``, ``-h32`` (rotation),
    ``-r2`` (codebook rounds) -- the names ``lowbit eval`` gives its rows."""
    rounds = options.codebook_rounds if (method == "gptq" and codebook == "fit" and options is not None) else 1
    return (base + ("-fit" if codebook == "fit" else "") + ("-gptq" if method == "gptq" else "") +
            ("-h32" if rotation else "") + (f"-r{rounds}" if rounds > 1 else ""))


def expected_quality(label: str) -> str | None:
    """What ``lowbit eval`` measured for this variant (shipped in lowbit/data/quality.json), as one line,
    with a warning where round-to-nearest ruins the model; None if nothing was measured for it."""
    import json

    data = json.loads((Path(__file__).resolve().parents[1] / "data" / "quality.json").read_text())
    row = data["rows"].get(label)
    if row is None:
        return None
    line = (f"expected quality of {label} (lowbit eval on {data['model']}, {data['tokens']} tokens of Python docstrings): "
            f"KL {row['kl']:.3g} nats, top-1 agreement {row['top1']:.0%}, perplexity {row['ppl_ref']:.1f} -> {row['ppl']:.1f}"
            " (--compare measures this model)")
    if row["kl"] > 1.0:
        line = ("WARNING: " + ("round-to-nearest" if "gptq" not in label else "even calibrated, this") +
                " at this many bits breaks models: " + line + "; expect nonsense output." +
                (" Calibrate (--method gptq) or use more bits." if "gptq" not in label else " Use more bits."))
    return line


def calibration_data(tok, vocab: int, path: str | None, options) -> dict:
    """``quantize_model``'s calibration arguments for ``lowbit generate``: a text file, the default text,
    or (a random-init model has no tokenizer) uniformly random token ids, seed 0."""
    if tok is None:
        if path:
            raise ValueError("--calibration: a random-init model has no tokenizer to read text with")
        g = torch.Generator().manual_seed(0)
        return {"calibration": torch.randint(0, vocab, (options.samples, options.seq_len), generator=g)}
    return {"calibration": [Path(path).read_text()] if path else None, "tokenizer": tok}


def _table(rows, result, quiet):
    if quiet:
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is optional: plain lines
        for label, r, nbytes, q in rows:
            print(f"{label}: {r.tokens_per_s():.1f} tok/s ({r.ms_per_step():.2f} ms/step, {r.mode}), "
                  f"linears {nbytes / 2**20:.1f} MiB" + (f", KL {q['kl']:.4f}, top-1 {q['top1']:.1%}" if q else ""))
        return
    compared = "unquantized" in result
    scored = compared and not result["random_weights"]
    modes = {r.mode for _, r, _, _ in rows}
    one_mode = len(modes) == 1
    t = Table(title=f"lowbit generate: {result['model']}, batch {result['batch']}, {result['device']}"
                    + (f", {modes.pop()}" if one_mode else ""),
              caption="weights: linear and MoE expert weights" + ("; KL (nats) and top-1 agreement vs unquantized,"
                                                                  " teacher-forced" if scored else ""))
    cols = ["variant", "tok/s", "ms/step", "prefill ms", "weights"] + ([] if one_mode else ["mode"])
    for col in cols + (["KL", "top-1"] if scored else []):
        t.add_column(col, justify="right" if col != "variant" else "left", no_wrap=True)
    base = rows[0][1].tokens_per_s() if compared else None
    for label, r, nbytes, q in rows:
        tps = r.tokens_per_s()
        speed = f"{tps:.1f}" + (f" ({tps / base:.2f}x)" if base and r is not rows[0][1] else "")
        cells = [label, speed, f"{r.ms_per_step():.2f}", f"{r.prefill_s * 1e3:.1f}", f"{nbytes / 2**20:.1f} MiB"]
        cells += [] if one_mode else [r.mode]
        if scored:
            cells += [f"{q['kl']:.4f}", f"{q['top1']:.1%}"] if q else ["", ""]
        t.add_row(*cells)
    console = Console()
    if not console.is_terminal:  # a log or a pipe: no need to squeeze the table into 80 columns
        console = Console(width=max(console.width, 120))
    console.print(t)
    if compared and result["random_weights"]:
        print("quality not scored: random-init weights give near-flat logits, so KL and top-1 against the "
              "unquantized model mean little (they are in the returned numbers); use a real --model to judge quality")
        return
    for label, _, _, q in rows:
        if q:
            print(f"{label} vs unquantized over its {q['tokens']} generated tokens (teacher-forced): "
                  f"KL {q['kl']:.4f} nats, top-1 agreement {q['top1']:.1%}, perplexity {q['ppl_ref']:.2f} -> {q['ppl']:.2f}, "
                  f"same text: {q['same_text']}")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="quantize a model and decode with it (speed + quality)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="smollm2 (default), a .gguf file, a hub name/dir, or random:<name>")
    p.add_argument("--bits", type=int, default=4, choices=(2, 3, 4, 5),
                   help="kbit bits per weight (default 4; 2-3 lose much quality without calibration)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message (default: %(default)r)")
    p.add_argument("--max-new-tokens", type=_positive, default=48, help="tokens to generate (default %(default)s)")
    p.add_argument("--batch", type=_positive, default=1, help="sequences decoded together (default %(default)s)")
    p.add_argument("--compare", action="store_true", help="run the unquantized model too; print both and the quality")
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda if available)")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (then CUDA graph)")
    p.add_argument("--no-graph", action="store_true", help="eager decode loop on CUDA too")
    p.add_argument("--codebook", choices=("default", "fit"), default="auto",
                   help="fit: Lloyd-Max codebook per tensor (default: fit with --method gptq at 2-3 bits, else default)")
    p.add_argument("--load", default=None, help="load a saved quantized model (from --save) instead of quantizing")
    p.add_argument("--save", default=None, help="save the quantized model to this directory")
    p.add_argument("--layers", type=_positive, default=None, help="random:<name> models: number of layers")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=None,
                   help="one weight (one launch) for q|k|v, gate|up, ... (kbit's and NVFP4's default; --no-fuse: each linear alone)")
    p.add_argument("--lm-head-bits", type=int, default=None, choices=(2, 3, 4, 5),
                   help="quantize the output projection too, to this many bits (default: keep it)")
    p.add_argument("--no-chat", action="store_true", help="feed the prompt as plain text (no chat template)")
    p.add_argument("--method", choices=("rtn", "gptq"), default="rtn",
                   help="rtn: round to nearest (default, instant); gptq: calibrated, error-compensating (usable 2-3 bits)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="--method gptq: a text file to calibrate on (default: the Python language reference that "
                        "ships with Python, not the text lowbit eval scores on)")
    p.add_argument("--calibration-samples", type=_positive, default=None, metavar="N",
                   help="--method gptq: windows of calibration text (default 64)")
    p.add_argument("--calibration-seq-len", type=_positive, default=None, metavar="L",
                   help="--method gptq: tokens per window (default 512)")
    p.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=None,
                   help="--method gptq: columns in decreasing importance (default on; --no-act-order: in order)")
    p.add_argument("--codebook-rounds", type=_positive, default=None, metavar="N",
                   help="--method gptq --codebook fit: refit the codebook to GPTQ's result and run it again, N walks "
                        "in all (default 2 at 2 bits, else 1)")
    p.add_argument("--rotate", action=argparse.BooleanOptionalAction, default=None,
                   help="kbit: store weights rotated by a block-32 Hadamard transform; the GEMV rotates its input "
                        "in registers (default: on with --method gptq at 2-3 bits, where it lowers the error; "
                        "costs ~8%% decode speed)")
    p.add_argument("--tp-allreduce", choices=("auto", "nccl", "symm-mem", "dtensor"), default=None,
                   help="under torchrun: how row-split layers sum their partial outputs: torch's symmetric-memory "
                        "one-shot kernel where the GPUs of one host reach each other peer to peer, else the process "
                        "group's all_reduce (auto, the default); or always the process group's all_reduce (nccl), "
                        "torch's one-shot kernel (symm-mem, CUDA), or transformers' DTensor redistribute (dtensor)")
    p.add_argument("--format", dest="fmt", default="kbit",
                   help=f"weight format: {' or '.join(formats())} (kbit takes --bits); several, comma-separated "
                        f"({','.join(formats())}), are timed side by side (default %(default)s)")
    p.set_defaults(func=_cmd)
    return p


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def check_args(args) -> None:
    """Every mistake the command line can catch before a model is loaded (UsageError: one line, exit 2)."""

    from ..errors import UsageError
    from . import sources

    sources.check_spec(args.model, args.layers)
    if args.device is not None:
        try:
            dev = torch.device(args.device)
        except RuntimeError:
            raise UsageError(f"--device {args.device!r} is not a device (cuda, cuda:1, cpu)") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: this machine has no CUDA GPU visible to torch (use --device cpu)")
    try:
        fmts = parse_formats(args.fmt)
    except ValueError:
        raise UsageError(f"--format takes {' or '.join(formats())}, or several comma-separated, got {args.fmt!r}") from None
    if len(fmts) > 1 and (args.load or args.save):
        raise UsageError("--load / --save take one --format")
    for f in fmts:  # each format takes the options its modules take (kbit: bits, codebook, fused projections)
        cls = linear_class(f)
        try:
            cls.check_options(bits=args.bits, codebook="fit" if args.codebook == "fit" else None)
            if args.lm_head_bits:
                cls.check_options(bits=args.lm_head_bits)
        except ValueError as e:
            raise UsageError(f"--format {f}: {e}") from None
        if args.rotate and 32 not in cls.rotations:
            raise UsageError(f"--rotate: --format {f} has no rotated weights")
        if args.fuse and cls.fused_class is None:
            raise UsageError(f"--fuse: --format {f} has no fused module")
    if args.load is not None:
        d = Path(args.load)
        if not (d / "lowbit_model.json").is_file():
            raise UsageError(f"--load {args.load}: no lowbit_model.json there (not a directory written by --save)")
    if args.save is not None:
        d = Path(args.save)
        if d.exists() and (not d.is_dir() or (any(d.iterdir()) and not (d / "lowbit_model.json").is_file())):
            raise UsageError(f"--save {args.save}: exists and is not an empty directory or an earlier lowbit save")
    if not args.prompt.strip():
        raise UsageError("--prompt is empty")
    gptq_only = [o for o, v in (("--calibration", args.calibration), ("--calibration-samples", args.calibration_samples),
                                ("--calibration-seq-len", args.calibration_seq_len), ("--act-order", args.act_order),
                                ("--codebook-rounds", args.codebook_rounds))
                 if v is not None]
    if gptq_only and args.method != "gptq":
        raise UsageError(f"{', '.join(gptq_only)}: options of --method gptq")
    if args.codebook_rounds:
        import lowbit

        fitted = args.codebook == "fit" or (args.codebook == "auto" and
                                             lowbit.gptq_recipe(fmts[0], args.bits).get("codebook") == "fit")
        if not fitted:
            raise UsageError("--codebook-rounds refits a fitted codebook: add --codebook fit")
    from .tp import launched_world

    if args.tp_allreduce and launched_world() <= 1:
        raise UsageError("--tp-allreduce applies under torchrun (tensor parallel): "
                         "torchrun --nproc-per-node N -m lowbit generate ...")
    if args.tp_allreduce == "symm-mem" and (args.device == "cpu" or not torch.cuda.is_available()):
        raise UsageError("--tp-allreduce symm-mem needs GPUs (CUDA symmetric memory); on the CPU use nccl (gloo there)")
    if launched_world() > 1 and (len(fmts) > 1 or args.load or args.save or args.method != "rtn"):
        raise UsageError("under torchrun (tensor parallel) generate takes one --format, no --load / --save, --method rtn")
    if args.method == "gptq" and args.load:
        raise UsageError("--load reads weights already quantized: --method applies when quantizing")
    if args.calibration is not None and not Path(args.calibration).is_file():
        raise UsageError(f"--calibration {args.calibration}: no such file")
    if args.calibration_seq_len is not None and args.calibration_seq_len < 2:
        raise UsageError("--calibration-seq-len must be >= 2")


def _cmd(args) -> int:
    check_args(args)
    generate(args.model, bits=args.bits, prompt=args.prompt, max_new_tokens=args.max_new_tokens, batch=args.batch,
             compare=args.compare, device=args.device, compile=args.compile,
             codebook={"fit": "fit", "default": None}.get(args.codebook, "auto"), load=args.load, save=args.save,
             layers=args.layers,
             chat=not args.no_chat, graph=False if args.no_graph else None, lm_head_bits=args.lm_head_bits,
             fuse=args.fuse, fmt=args.fmt, method=args.method, calibration=args.calibration,
             gptq_options=gptq_options(args), rotation="auto" if args.rotate is None else (32 if args.rotate else 0),
             tp_allreduce=args.tp_allreduce)
    return 0


def gptq_options(args):
    import lowbit

    o = lowbit.GptqOptions()
    if args.act_order is not None:
        o.act_order = args.act_order
    if args.calibration_samples:
        o.samples = args.calibration_samples
    if args.calibration_seq_len:
        o.seq_len = args.calibration_seq_len
    if args.codebook_rounds:
        o.codebook_rounds = args.codebook_rounds
    return o
