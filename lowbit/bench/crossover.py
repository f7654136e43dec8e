"""``lowbit tune --kbit-crossover``: measure where the kbit GEMM stops beating dequantize + cuBLAS,
and from how many rows per expert the grouped GEMM beats the grouped GEMV; ``lowbit tune --gemv-kernels``:
which GEMV kernel runs a plain one-token call fastest per format and shape (:mod:`lowbit.kernels.picks`).

For each shape and each M above the GEMV's 8 rows, both paths are timed the way the benchmarks time
(cold L2: one CUDA graph over rotating weight copies >= 4x L2, median of replays), K=4, fp16. Per
shape, the crossover is the largest M of the sweep up to which the GEMM is never slower; shapes
become size classes (by weight elements) in the crossover file that :mod:`lowbit.dispatch` reads::

    {"version": 1, "gpus": {"<GPU name>": {"gemm_max_m": [[20000000, 32], [null, 128]],
                                           "grouped_gemm_min_rows": 1.5}}}

The grouped crossover is swept over mean rows per expert (:data:`GROUPED_ROWS`) on one whole expert block
(:data:`GROUPED_BLOCK`: each token routed to top-k distinct experts drawn uniformly at random), timed as a
model runs it (eager, in one CUDA graph): routing glue, gate|up, the activation, down and the weighted sum.
The GEMV side takes the path a model takes at that size (the routed GEMV, which needs no sort and fuses
the activation, up to ``ops.ROUTED_MAX_ROUTES`` routes). The crossover is the smallest mean from which the
GEMM side is never slower. Timing the grouped kernels alone put it at 0.5 rows per expert on an H100, where
Qwen3-30B-A3B-shaped steps then ran 8-11% slower at batch 8 and 16 than at the 1.5 the block measures
(benchmarks/journal/2026-11-28_moe_crossover_tune_and_gemm_m16.md).

The user file (``$LOWBIT_DISPATCH_FILE``, else ``~/.cache/lowbit/kbit_dispatch.json``) overrides
the shipped ``lowbit/data/kbit_dispatch.json`` per GPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .. import dispatch

#: M values swept (each > the GEMV's rows); the crossover is one of them.
SWEEP_MS = (16, 32, 64, 128, 256, 512)
#: Shapes (K_in, N) spanning the weight sizes of the presets: 4M .. 235M elements.
DEFAULT_SHAPES = ((2048, 2048), (4096, 4096), (4096, 14336), (8192, 28672))


def crossover_m(times: dict[int, tuple[float, float]]) -> int:
    """Largest M (of ``times``: M -> (gemm us, dequant us)) up to which the GEMM is never slower
    than dequantize + cuBLAS; GEMV_MAX_M when it loses at the first M."""
    best = dispatch.GEMV_MAX_M
    for m in sorted(times):
        gemm, deq = times[m]
        if gemm > deq:
            break
        best = m
    return best


#: mean rows per expert swept for the grouped GEMV / GEMM crossover
GROUPED_ROWS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)
#: (experts, hidden, intermediate, top-k) of the expert block the grouped crossover is measured on
GROUPED_BLOCK = (256, 2048, 512, 8)


def grouped_crossover(times: dict[float, tuple[float, float]]) -> float:
    """Smallest mean rows per expert (of ``times``: rows -> (grouped GEMV us, grouped GEMM us)) from
    which the GEMM is never slower; above the sweep (twice its largest value) when it never wins."""
    rows = sorted(times)
    for i, r in enumerate(rows):
        if all(times[q][1] <= times[q][0] for q in rows[i:]):
            return r
    return 2 * rows[-1]


def derive_classes(per_shape: dict[int, int]) -> list[tuple[int | None, int]]:
    """Size classes from {weight elements of a measured shape: its crossover M}: one class per shape
    in rising size (the largest open-ended), neighbours with the same M merged."""
    if not per_shape:
        raise ValueError("no measured shapes")
    sizes = sorted(per_shape)
    classes: list[tuple[int | None, int]] = []
    for i, w in enumerate(sizes):
        m = per_shape[w]
        upto = None if i == len(sizes) - 1 else w
        if classes and classes[-1][1] == m:
            classes[-1] = (upto, m)
        else:
            classes.append((upto, m))
    return classes


def save(path: Path, gpu: str, classes: list[tuple[int | None, int]], grouped_min_rows: float | None = None) -> None:
    """Write (atomically) ``classes`` (and the grouped crossover, if given) for ``gpu`` into the
    crossover file, keeping other GPUs and keys."""

    def update(entry: dict) -> None:  # other keys (grouped_gemm_min_rows, gemv_kernels) are kept
        entry["gemm_max_m"] = [[u, m] for u, m in classes]
        if grouped_min_rows is not None:
            entry["grouped_gemm_min_rows"] = grouped_min_rows

    _update_entry(path, gpu, update)


def _update_entry(path: Path, gpu: str, update) -> None:
    """Apply ``update`` to ``gpu``'s entry of the crossover file at ``path`` (created if missing) and write it
    atomically, other GPUs kept; the file must load before and after."""
    data = {"version": 1, "gpus": {}}
    if path.exists():
        data = json.loads(path.read_text())
        dispatch.load_crossovers(path)  # refuse to extend a broken file
    update(data["gpus"].setdefault(gpu, {}))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    dispatch.load_crossovers(path)  # what was written must load


def path_time(x, copies, path: str | None, replays: int = 5) -> float:
    """Cold us per call of ``lowbit.kbit_linear(x, w)`` pinned to ``path`` (None: the dispatcher's
    choice), one CUDA graph over the weight ``copies`` (together >= 4 L2s)."""
    import lowbit

    from .timing import graph_time

    def call(w):
        with dispatch.forced_path(path):
            return lowbit.kbit_linear(x, w)

    return graph_time([lambda w=w: call(w) for w in copies], replays=replays, warmup=2).median_us


def measure(shapes, ms=SWEEP_MS, bits: int = 4, replays: int = 5, log=print) -> dict[int, int]:
    """GPU: {weight elements: crossover M} for each (K_in, N) in ``shapes``."""
    import torch

    import lowbit

    from .timing import copies_for_cold, l2_bytes

    dev = torch.device("cuda", torch.cuda.current_device())
    out = {}
    for k_in, n in shapes:
        w = torch.randn(n, k_in, device=dev, dtype=torch.float16)
        q = lowbit.quantize_kbit(w, bits=bits)
        copies = [q] + [lowbit.quantize_kbit(w, bits=bits) for _ in range(copies_for_cold(q.nbytes(), l2_bytes()) - 1)]
        for c in copies:
            c.tiled()
        times = {}
        for m in ms:
            x = torch.randn(m, k_in, device=dev, dtype=torch.float16)
            t = [path_time(x, copies, path, replays) for path in ("gemm", "dequant_matmul")]
            times[m] = (t[0], t[1])
            log(f"  {k_in}x{n} M={m:4d}: gemm {t[0]:9.1f} us  dequant+cuBLAS {t[1]:9.1f} us")
        out[n * k_in] = crossover_m(times)
        log(f"  {k_in}x{n}: GEMM up to M={out[n * k_in]}")
        del copies
    return out


def measure_grouped(rows_per_expert=GROUPED_ROWS, block=GROUPED_BLOCK, bits: int = 4, replays: int = 5,
                    log=print) -> float:
    """GPU: the grouped GEMV / GEMM crossover (mean rows per expert) of one expert block, fp16, each side as
    the dispatcher runs it in a model (``lowbit.nn.KbitMoeExperts`` under ``dispatch.forced_path``)."""
    import torch

    from ..nn.experts import KbitMoeExperts
    from .timing import graph_time

    dev = torch.device("cuda", torch.cuda.current_device())
    e, hidden, inter, k = block
    mod = KbitMoeExperts(e, hidden, inter, bits=bits, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    for prefix in ("gate_up", "down"):  # random codes and block scales: the timing reads every byte
        qw, qa = getattr(mod, f"{prefix}_qweight"), getattr(mod, f"{prefix}_qabsmax")
        qw.copy_(torch.randint(-2**31, 2**31 - 1, qw.shape, generator=gen, device=dev, dtype=torch.int64).to(torch.int32))
        qa.copy_(torch.randint(96, 128, qa.shape, generator=gen, device=dev, dtype=torch.int32).to(torch.uint8))
    mod.tensors_changed()
    times = {}
    for r in rows_per_expert:
        tokens = max(1, round(r * e / k))
        ids = torch.rand(tokens, e, generator=gen, device=dev).topk(k, dim=1).indices
        weights = torch.softmax(torch.randn(tokens, k, generator=gen, device=dev), dim=1).half()
        x = torch.randn(tokens, hidden, generator=gen, device=dev, dtype=torch.float16)

        def timed(path):
            def call():
                with dispatch.forced_path(path):
                    return mod(x, ids, weights)
            return graph_time([call], replays=replays, warmup=2).median_us

        times[r] = (timed("gemv"), timed("gemm"))
        log(f"  {e} experts, hidden {hidden}, intermediate {inter}, top-{k}: {tokens} tokens, "
            f"{tokens * k / e:g} rows/expert: GEMV block {times[r][0]:8.1f} us  GEMM block {times[r][1]:8.1f} us")
    best = grouped_crossover(times)
    log(f"  grouped GEMM from {best:g} rows per expert")
    return best


#: A kernel replaces the rules' pick for a shape (``lowbit tune --gemv-kernels``) where it is faster by more than this
#: share: ties and noise leave the rules in charge.
GEMV_PICK_MARGIN = 0.02
#: The formats ``lowbit tune --gemv-kernels`` measures by default.
GEMV_PICK_FORMATS = ("kbit2", "kbit3", "kbit4", "nvfp4")


def gemv_pick(times: dict[str, float], rules_kernel: str, margin: float = GEMV_PICK_MARGIN) -> str | None:
    """The kernel to record for a shape from ``times`` (kernel -> us; ``rules_kernel`` is the rules' pick, timed
    among them): the fastest, where it beats the rules' pick by more than ``margin``; None otherwise (a time that is
    not a finite number never wins, and without the rules' own time nothing does)."""
    valid = {k: t for k, t in times.items() if math.isfinite(t)}
    if rules_kernel not in valid:
        return None
    best = min(valid, key=valid.get)
    if best == rules_kernel or valid[best] >= valid[rules_kernel] * (1 - margin):
        return None
    return best


def _gemv_calls(fmt: str, w, x, lib, dtype):
    """For one format: (the rules' kernel, {kernel: a function making the cold-timing calls under that kernel}). Each
    copies only the GPU layout (a small weight needs thousands of copies) and makes new launchers, which make their
    plans under the kernel's DENSE_PATH."""
    import lowbit

    from .. import ops
    from ..kernels import picks, tiled
    from .timing import copies_for_cold, l2_bytes

    n, k_in = w.shape
    dev = x.device
    if fmt == "nvfp4":
        from ..kernels.nvfp4 import e2m1_codebook

        q = lowbit.quantize_nvfp4(w)
        qw, qs = q.tiled()
        count = copies_for_cold(q.nbytes(), l2_bytes())
        plain = [(q.packed, q.scales)] + [(q.packed.clone(), q.scales.clone()) for _ in range(count - 1)]
        tiled_copies = [(qw, qs)] + [(qw.clone(), qs.clone()) for _ in range(count - 1)]
        cb = e2m1_codebook(dev)

        def tiled_calls():
            tiled.DENSE_PATH = "auto"
            launchers = [tiled.GemvLauncher(lib, a, b, cb, q.scale_2, tiled.NVFP4, n, k_in) for a, b in tiled_copies]
            return [lambda f=f: f(x, 1, (1, n)) for f in launchers]

        calls = {"plain": lambda: [lambda c=c: ops.nvfp4_plain_gemv(x, c[0], c[1], q.scale_2) for c in plain],
                 "tiled": tiled_calls}
        return ("plain" if dispatch.nvfp4_plain_wins(1, n, k_in) else "tiled"), calls
    bits = int(fmt.removeprefix("kbit"))
    q = lowbit.quantize_kbit(w, bits=bits)
    qw, qa = q.tiled()
    copies = [(qw, qa)] + [(qw.clone(), qa.clone()) for _ in range(copies_for_cold(q.nbytes(), l2_bytes()) - 1)]
    tiled.DENSE_PATH = "auto"
    if tiled.bulk_ctas(lib, dev, bits, dtype, 1, n, k_in):
        rules = "bulk"
    else:
        rules = tiled.dense_path(lib, dev, bits, dtype, n, k_in)
    tiled.DENSE_PATH = "bulk"
    kernels = [k for k in picks.KERNELS[fmt] if k != "bulk" or tiled.bulk_ctas(lib, dev, bits, dtype, 1, n, k_in)]

    def calls_under(kernel):
        def make():
            tiled.DENSE_PATH = kernel
            launchers = [tiled.GemvLauncher(lib, a, b, q.codebook, q.scale, tiled.kbit_format(bits), n, k_in)
                         for a, b in copies]
            return [lambda f=f: f(x, 1, (1, n)) for f in launchers]
        return make

    return rules, {k: calls_under(k) for k in kernels}


def measure_gemv_kernels(shapes, formats=GEMV_PICK_FORMATS, dtype=None, rounds: int = 2, replays: int = 5, log=print):
    """GPU: {(format, n, k_in): pick or None} for each (N, K_in) of ``shapes`` and each format: every GEMV
    kernel that can take a plain one-token call, cold, best of ``rounds``, and the rules' pick among them (picks
    off while timing)."""
    import torch

    from ..kernels import picks, tiled
    from ..kernels.library import get_library
    from .timing import graph_time

    dtype = dtype or torch.bfloat16
    dev = torch.device("cuda", torch.cuda.current_device())
    lib = get_library()
    out = {}
    saved = tiled.DENSE_PATH, picks.USE
    try:
        picks.USE = False
        for n, k_in in shapes:
            if k_in % 32:
                log(f"  skip {k_in}x{n}: K_in % 32 != 0 (no quantized GEMV)")
                continue
            w = torch.randn(n, k_in, device=dev, dtype=torch.float16)
            x = torch.randn(1, k_in, device=dev, dtype=dtype)
            for fmt in formats:
                rules, calls = _gemv_calls(fmt, w, x, lib, dtype)
                times = {}
                for _ in range(rounds):
                    for kernel, make in calls.items():
                        t = graph_time(make(), replays=replays, warmup=2).median_us
                        times[kernel] = min(t, times.get(kernel, float("inf")))
                pick = gemv_pick(times, rules)
                out[(fmt, n, k_in)] = pick
                log(f"  {fmt} {k_in}x{n}: " + "  ".join(f"{k} {t:.2f}" for k, t in times.items()) +
                    f" us; rules: {rules}" + (f" -> {pick} ({times[rules] / times[pick] - 1:+.1%})" if pick else ""))
                del calls
    finally:
        tiled.DENSE_PATH, picks.USE = saved
    return out


def save_gemv_kernels(path: Path, gpu: str, measured: dict) -> None:
    """Write ``gpu``'s measured picks (``{(format, n, k_in): kernel or None}``) into the crossover file's
    ``gemv_kernels``: a shape measured again takes its new pick (None: the rules; its entry removed); other shapes,
    GPUs and keys are kept."""
    from ..kernels import picks

    def update(entry: dict) -> None:
        table = picks.parse(entry.get("gemv_kernels", []), f"{path}: gpus[{gpu!r}].gemv_kernels")
        for key, kernel in measured.items():
            if kernel is None:
                table.pop(key, None)
            else:
                table[key] = kernel
        entry["gemv_kernels"] = [[*key, kernel] for key, kernel in sorted(table.items())]

    _update_entry(path, gpu, update)
    picks.reload()
