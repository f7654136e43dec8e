"""``lowbit tune``: measure every fp16/bf16 GEMV launch configuration on this GPU and keep the winners.

For each (dtype, M, shape) every configuration in :func:`lowbit.tuning.candidates` is checked
against the fp64 product (rel. error <= 1e-3 after rounding to the dtype), then timed the way the benchmarks time (cold L2: one CUDA graph over
rotating weight copies >= 4x L2, median of replays). The fastest is written to the tuning file
(default: the user file, see :mod:`lowbit.tuning`); existing entries for other shapes are kept.
Configurations are tuned for the default launch (no programmatic dependent launch), whatever
``LOWBIT_PDL`` says.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from .. import tuning
from .cli import _int_list
from .crossover import GEMV_PICK_FORMATS

DEFAULT_TUNE_MS = (1, 2, 3, 4)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("tune", help="tune the fp16/bf16 decode GEMV for this GPU (writes a JSON tuning file)")
    p.add_argument("--preset", action="append", default=None, help="model preset (repeatable); default: every preset")
    p.add_argument("--shape", action="append", default=None, metavar="K_INxN", help="extra shape, e.g. 4096x14336")
    p.add_argument("--m", type=_int_list, default=list(DEFAULT_TUNE_MS), help="batch sizes (1..4), default 1,2,3,4")
    p.add_argument("--dtype", default="fp16,bf16", help="fp16, bf16 or both (default)")
    p.add_argument("--replays", type=int, default=5, help="graph replays per configuration (default 5)")
    p.add_argument("--out", type=Path, default=None, help="tuning file to update (default: $LOWBIT_TUNING_FILE or "
                   "~/.cache/lowbit/tuning.json; pass lowbit/data/tuning.json to refresh the shipped defaults); "
                   "with --kbit-crossover or --gemv-kernels the crossover file (default $LOWBIT_DISPATCH_FILE or "
                   "~/.cache/lowbit/kbit_dispatch.json; lowbit/data/kbit_dispatch.json is the shipped one)")
    p.add_argument("--kbit-crossover", action="store_true",
                   help="instead of the fp16 GEMV: measure the kbit GEMM vs dequantize + cuBLAS crossover per weight "
                        "size (--shape adds shapes to the default set) and the grouped GEMV / GEMM crossover (on a whole "
                        "MoE expert block, as models run it), and write them for lowbit.dispatch")
    p.add_argument("--gemv-kernels", action="store_true",
                   help="instead of the fp16 GEMV: time every quantized GEMV kernel on one-token plain calls of the "
                        "shapes (--preset / --shape; default every preset's) in each --formats, and record in the "
                        "crossover file the shapes where one beats the dispatcher's rules by more than 2%% "
                        "(lowbit.kernels.picks)")
    p.add_argument("--formats", default=",".join(GEMV_PICK_FORMATS),
                   help=f"with --gemv-kernels: formats to measure (default {','.join(GEMV_PICK_FORMATS)}; kbit5 too)")
    p.set_defaults(func=run)
    return p


def shapes_for(presets: list[str] | None, extra: list[str] | None) -> list[tuple[int, int]]:
    """Unique (N, K) of the presets' dense linears (MoE experts included) and the extra shapes."""
    from .presets import default_preset_names, load_presets, parse_shape

    table = load_presets()
    names = presets if presets is not None else ([] if extra else default_preset_names() + ["quick"])
    out: list[tuple[int, int]] = []
    for name in names:
        if name not in table:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(table)}")
        p = table[name]
        for lin in list(p.linears) + (list(p.moe.linears) if p.moe else []):
            out.append((lin.n, lin.k_in))
    for s in extra or []:
        lin = parse_shape(s)
        out.append((lin.n, lin.k_in))
    return list(dict.fromkeys(out))


def _shapes(args: argparse.Namespace) -> list[tuple[int, int]] | None:
    """The shapes of --preset / --shape (:func:`shapes_for`), or None after printing why they are bad."""
    try:
        return shapes_for(args.preset, args.shape)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def _choices(text: str, allowed, flag: str) -> list[str] | None:
    """The comma-separated values of ``flag``, or None after printing why they are bad."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in allowed for v in values):
        print(f"error: {flag} takes some of {', '.join(allowed)}, got {text!r}", file=sys.stderr)
        return None
    return values


def _this_gpu() -> str:
    from ..kernels.device import gpu_name

    return gpu_name(torch.device("cuda", torch.cuda.current_device()))


def tune_one(lib, dtype: torch.dtype, m: int, n: int, k: int, replays: int) -> tuple[tuning.GemvConfig, float, list]:
    """Check and time every candidate; returns (best config, its us, [(config, us)])."""
    from ..kernels.dense import launch
    from .timing import copies_for_cold, graph_time, l2_bytes

    dev = torch.device("cuda", torch.cuda.current_device())
    w = torch.randn(n, k, device=dev, dtype=dtype)
    x = torch.randn(m, k, device=dev, dtype=dtype)
    ref = (x.double() @ w.double().t())
    ref_rounded = ref.to(dtype).double()  # bf16's own output rounding is ~1.5e-3: compare like for like
    copies = [w] + [w.clone() for _ in range(copies_for_cold(w.numel() * w.element_size(), l2_bytes()) - 1)]
    y = torch.empty(m, n, device=dev, dtype=dtype)
    results = []
    for cfg in tuning.candidates():
        y.fill_(float("nan"))
        launch(lib, x, w, y, cfg, pdl=False)
        torch.cuda.synchronize()
        err = ((y.double() - ref_rounded).norm() / ref.norm()).item()
        if not err <= 1e-3:  # NaN fails too
            raise RuntimeError(f"dense GEMV config {cfg} gave rel. error {err:.2e} on M={m} N={n} K={k} {dtype}")
        t = graph_time([lambda c=c, cfg=cfg: launch(lib, x, c, y, cfg, pdl=False) for c in copies], replays=replays, warmup=2)
        results.append((cfg, t.median_us))
    best, best_us = min(results, key=lambda r: r[1])
    return best, best_us, results


def run(args: argparse.Namespace) -> int:
    from ..kernels.library import get_library

    if not torch.cuda.is_available():
        print("error: lowbit tune needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.kbit_crossover and args.gemv_kernels:
        print("error: --kbit-crossover and --gemv-kernels are separate runs; pass one", file=sys.stderr)
        return 2
    if args.kbit_crossover:
        return run_crossover(args)
    if args.gemv_kernels:
        return run_gemv_kernels(args)
    if any(not 1 <= m <= 4 for m in args.m):
        print(f"error: --m values must be in 1..4, got {args.m}", file=sys.stderr)
        return 2
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    names = _choices(args.dtype, dtypes, "--dtype")
    if names is None:
        return 2
    shapes = _shapes(args)
    if shapes is None:
        return 2
    out = args.out or tuning.user_file()
    table = tuning.load(out)
    gpu = _this_gpu()
    lib = get_library()
    print(f"tuning {len(shapes)} shapes x M={args.m} x {names} on {gpu}: {len(tuning.candidates())} configs each")
    start = time.time()
    for dt in names:
        for n, k in shapes:
            if k % 8:
                print(f"  skip N={n} K={k}: K % 8 != 0 runs the scalar kernel (nothing to tune)")
                continue
            for m in args.m:
                best, us, results = tune_one(lib, dtypes[dt], m, n, k, args.replays)
                heur = tuning.heuristic(m, n, k)
                heur_us = next(u for c, u in results if c == heur)
                simt_us = min(u for c, u in results if c.rows not in tuning.MMA_ROWS)
                mma_us = min(u for c, u in results if c.rows in tuning.MMA_ROWS)
                table.setdefault(gpu, {}).setdefault(dt, {})[tuning.key(m, n, k)] = best
                print(f"  {dt} M={m} {k}x{n}: {us:7.2f} us  rows={best.rows} unroll={best.unroll} tpr={best.tpr} "
                      f"threads={best.threads} prefetch={best.prefetch}  (best CUDA-core {simt_us:.2f}, tensor-core "
                      f"{mma_us:.2f}, heuristic {heur_us:.2f} us)", flush=True)
        tuning.save(out, table)  # after each dtype: a long run keeps what it measured
    tuning.reload()
    print(f"wrote {out} ({time.time() - start:.0f} s)")
    return 0


def run_crossover(args: argparse.Namespace) -> int:
    from .. import dispatch
    from . import crossover
    from .presets import parse_shape

    try:
        extra = [parse_shape(v) for v in args.shape or []]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shapes = list(dict.fromkeys(list(crossover.DEFAULT_SHAPES) + [(lin.k_in, lin.n) for lin in extra]))
    out = args.out or dispatch.user_crossover_file()
    gpu = _this_gpu()
    print(f"kbit GEMM crossover on {gpu}: {len(shapes)} shapes x M={list(crossover.SWEEP_MS)}")
    start = time.time()
    classes = crossover.derive_classes(crossover.measure(shapes, replays=args.replays))
    grouped = crossover.measure_grouped(replays=args.replays)
    crossover.save(out, gpu, classes, grouped)
    dispatch.reload_crossovers()
    print(f"classes (max weights, max M): {classes}; grouped GEMM from {grouped:g} rows per expert")
    print(f"wrote {out} ({time.time() - start:.0f} s)")
    return 0


def run_gemv_kernels(args: argparse.Namespace) -> int:
    from .. import dispatch
    from ..kernels import picks
    from . import crossover

    formats = _choices(args.formats, picks.KERNELS, "--formats")
    if formats is None:
        return 2
    shapes = _shapes(args)
    if shapes is None:
        return 2
    out = args.out or dispatch.user_crossover_file()
    gpu = _this_gpu()
    print(f"GEMV kernels on {gpu}: {len(shapes)} shapes x {formats}, M = 1, cold (us)")
    start = time.time()
    measured = crossover.measure_gemv_kernels(shapes, formats, replays=args.replays)
    crossover.save_gemv_kernels(out, gpu, measured)
    picked = sum(p is not None for p in measured.values())
    print(f"{picked} of {len(measured)} shape x format cases run another kernel than the rules' pick; wrote {out} "
          f"({time.time() - start:.0f} s)")
    return 0
