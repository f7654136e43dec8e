"""``lowbit bench``: decode GEMV timings side by side with cuBLAS and peers. See BENCHMARKS.md."""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import shlex
import sys
from pathlib import Path

DEFAULT_MS = (1, 2, 4, 8, 16, 32, 64)
QUICK_MS = (1, 4)
RESULTS_DIR = Path("benchmarks") / "results"
#: methods left out of --quick unless named: gemlite JIT-compiles its Triton kernels on first use
#: (about 90 s on a fresh H100 machine, measured), which alone would exceed --quick's budget.
SLOW_SETUP = ("gemlite-a16w4",)


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _str_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="time decode GEMV paths against cuBLAS and peers (GPU)",
                       description=__doc__)
    p.add_argument("--preset", action="append", default=None,
                   help="model preset (repeatable; see --list). Default: every model preset")
    p.add_argument("--shape", action="append", default=None, metavar="K_INxN",
                   help="custom shape, input dim first, e.g. 4096x14336 (repeatable)")
    p.add_argument("--m", type=_int_list, default=None, help=f"batch sizes, default {','.join(map(str, DEFAULT_MS))}")
    p.add_argument("--methods", type=_str_list, default=None, help="comma-separated columns (see --list); default all")
    p.add_argument("--quick", action="store_true", help="small run: the 'quick' preset, M=1,4, 10 replays, no gemlite unless named in --methods")
    p.add_argument("--no-moe", action="store_true", help="skip the routed-experts block of MoE presets")
    p.add_argument("--no-hot", action="store_true", help="skip the hot-L2 column")
    p.add_argument("--replays", type=int, default=None, help="graph replays per measurement (default 20, quick 10)")
    p.add_argument("--seed", type=int, default=0, help="routing seed")
    p.add_argument("--out", type=Path, default=None, help="output folder (default benchmarks/results/<date>_<gpu>_<tag>)")
    p.add_argument("--tag", default=None, help="name for the output folder")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--cpu", action="store_true", help="no GPU: time the CPU reference instead")
    p.add_argument("--list", action="store_true", help="list presets and methods, then exit")
    p.set_defaults(func=run)
    return p


def _presets(args):
    from .presets import Preset, default_preset_names, load_presets, parse_shape

    table = load_presets()
    chosen = []
    names = args.preset or ([] if (args.shape or args.quick) else default_preset_names())
    if args.quick and not args.preset:
        names = ["quick"]
    for n in names:
        if n not in table:
            raise ValueError(f"unknown preset {n!r}; known: {', '.join(table)}")
        chosen.append(table[n])
    if args.shape:
        chosen.append(Preset("custom", "command line", tuple(parse_shape(s) for s in args.shape)))
    return chosen


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def run(args: argparse.Namespace) -> int:
    from .methods import all_methods, select
    from .presets import load_presets

    if args.list:
        for name, p in load_presets().items():
            extra = f", MoE {p.moe.experts} experts top-{p.moe.top_k}" if p.moe else ""
            print(f"preset {name}: {len(p.linears)} linears{extra} — {p.source}")
        for m in all_methods().values():
            print(f"method {m.name}: {m.description}" + (f" [unavailable: {m.unavailable}]" if m.unavailable else ""))
        return 0
    try:
        presets = _presets(args)
        methods = select(args.methods)
        if args.quick and not args.methods:  # JIT-compiled peers cost minutes on a fresh machine
            methods = [m for m in methods if m.name not in SLOW_SETUP]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ms = args.m or list(QUICK_MS if args.quick else DEFAULT_MS)
    replays = args.replays or (10 if args.quick else 20)
    command = "lowbit bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 1 else "lowbit bench"

    import torch

    from . import report

    if not torch.cuda.is_available():
        if not args.cpu:
            print("error: no CUDA GPU found. lowbit bench times GPU kernels; "
                  "pass --cpu to time the CPU reference instead.", file=sys.stderr)
            return 2
        return _run_cpu(args, presets, ms, command)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..dispatch import untuned_note
    from .runner import EXPERTS_LAYER, Runner
    from .timing import measure_copy_bandwidth, measure_read_bandwidth

    console = report.make_console()
    env = report.environment()
    console.print(f"[bold]{env.get('gpu')}[/]: measuring read bandwidth ...")
    read_bw, copy_bw = measure_read_bandwidth(), measure_copy_bandwidth()
    console.print(f"read {read_bw / 1e12:.3f} TB/s, copy (read+write) {copy_bw / 1e12:.3f} TB/s")
    note = untuned_note(torch.cuda.get_device_name())
    if note:
        console.print(note, markup=False)

    runner = Runner(methods, read_bw, replays=replays, hot=not args.no_hot, seed=args.seed)
    tasks = [t for p in presets for t in runner.tasks(p, ms, include_moe=not args.no_moe)]
    presets_order = {p.name: i for i, p in enumerate(presets)}
    layer_order = {(p.name, lin.name): i for p in presets for i, lin in enumerate(p.linears)}
    layer_order.update({(p.name, EXPERTS_LAYER): len(p.linears) for p in presets})
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as prog:
        bar = prog.add_task("benchmarking", total=len(tasks))
        for t in tasks:
            rows += t()
            r = rows[-1]
            prog.update(bar, advance=1, description=f"{r.preset} {r.layer} {r.method}")
    rows.sort(key=lambda r: (presets_order[r.preset], r.m, layer_order[(r.preset, r.layer)]))

    meta = {"command": command, "env": env, "read_bw": read_bw, "copy_bw": copy_bw, "ms": ms,
            "replays": replays, "seed": args.seed, "presets": [p.name for p in presets],
            "methods": {m.name: m.description for m in methods},
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    report.print_tables(rows, console)
    out = _write(args, rows, meta, env.get("gpu", "gpu"))
    console.print(f"results written to {out}")
    return 0


def _write(args, rows, meta, device_name: str) -> Path:
    from . import report

    tag = args.tag or ("quick" if args.quick else "run")
    out = args.out or RESULTS_DIR / f"{_dt.date.today().isoformat()}_{_slug(device_name)}_{tag}"
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "results.json", rows, meta)
    (out / "results.md").write_text(report.markdown(rows, meta))
    if not args.no_plots:
        report.write_plots(rows, out)
    return out


def _run_cpu(args, presets, ms, command) -> int:
    from . import report
    from .runner import cpu_reference_rows

    console = report.make_console()
    rows = []
    for p in presets:
        rows += cpu_reference_rows(p, ms, [2, 3, 4, 5])
    meta = {"command": command, "env": report.environment(), "read_bw": 0, "copy_bw": 0, "ms": ms, "cpu": True}
    report.print_tables(rows, console, cpu=True)
    out = _write(args, rows, meta, "cpu")
    console.print(f"results written to {out}")
    return 0
