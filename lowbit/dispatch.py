"""Dispatch: which kbit kernel runs a call, decided in one place from the call's shape and device.

Everything that computes a kbit matmul (the functional API, the ``lowbit.nn`` modules) goes
through here, so a new kernel (the tensor-core GEMM, measured crossovers) changes this file only.

Paths today:

* ``"gemv"``: CUDA, fp16/bf16 activations, 1 <= M <= :data:`GEMV_MAX_M` rows -- the decode GEMV.
* ``"gemm"``: CUDA, fp16/bf16, GEMV_MAX_M < M <= :func:`gemm_max_m` -- the tensor-core kbit GEMM
  (batched decode, speculative verification, short prefills).
* ``"dequant_matmul"``: everything else -- the weight decoded from the tiled layout, then a
  matmul (cuBLAS on CUDA; on CPU the fp32 reference, which *is* the definition).
* grouped (MoE, rows sorted by expert): CUDA fp16/bf16 -> ``"grouped_gemv"`` (8 rows per expert
  per weight pass: decode) below :func:`grouped_gemm_min_rows` mean rows per expert,
  ``"grouped_gemm"`` (the tensor-core GEMM over (expert, chunk of rows) items: prefill, large
  batches) from there; CPU and fp32 -> the reference, expert by expert. Where the grouped GEMV
  would run and the (token, expert) routes are few (:func:`moe_routed`), an expert block skips the
  sort: the routed GEMV takes the router's ids as they are.

NVFP4 (:func:`nvfp4_linear_op`, weights in the checkpoint layout): ``"gemv"`` -- M <= GEMV_MAX_M: the
checkpoint-layout GEMV (csrc/nvfp4/gemv.cu, no repack) at M = 1 on the shapes :func:`nvfp4_plain_wins`
gives it, the kbit GEMV's NVFP4 instance on the tiled layout otherwise (measured: the checkpoint-layout
kernel is the faster one at M = 1 only, and there only for mid-size K); ``"gemm"``
-- the kbit GEMM's NVFP4 instance up to kbit K=4's crossover (the same kernel); ``"dequant_matmul"`` --
the NVFP4 dequantize kernel + cuBLAS; the reference on CPU, for fp32 and for K % 32 != 0. NVFP4 expert stacks
(:func:`nvfp4_grouped_op`) take the grouped GEMV or GEMM by the same rows-per-expert crossover. The tiled
layout is built on first use and kept on the weight (a second copy of it). An sm_100 (tcgen05 block-
scaled MMA) kernel would be one more path here, chosen by the device's compute capability.

The GEMM/cuBLAS crossover is data: ``lowbit/data/kbit_dispatch.json`` per GPU name and weight-size
class (written by ``lowbit tune --kbit-crossover``; a user file overrides it),
:data:`GEMM_MAX_M_DEFAULT` on GPUs it does not list; likewise the grouped GEMV/GEMM crossover
(``grouped_gemm_min_rows``, :data:`GROUPED_GEMM_MIN_ROWS_DEFAULT`). Decisions depend only on (device, dtype, M,
weight size), never on timing in the hot path, so they are the same in eager mode, under
``torch.compile`` and inside CUDA graphs.

Two ways to call a path: ``*_op`` goes through the ``torch.ops.lowbit`` custom ops (what
``torch.compile`` traces), the launchers in ``kernels.tiled`` skip the dispatcher (the modules'
eager fast path). Both run the same kernels with the same decisions.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from . import ops
from .formats.kbit import rotation as kbit_rotation
from .kernels import picks, tiled
from .kernels.device import gpu_name
from .kernels.picks import CROSSOVERS, user_crossover_file  # noqa: F401  (the crossover files' paths)
from .kernels.library import library_or_none
from .kernels.nvfp4 import e2m1_codebook
from .kernels.tiled import fusable_bias  # noqa: F401  (modules ask dispatch whether a bias fuses)
from .ops.common import GEMV_MAX_M  # largest batch of the decode GEMV kernels

#: NVFP4: largest M for the checkpoint-layout GEMV (the tiled-layout GEMV above it, to GEMV_MAX_M).
NVFP4_PLAIN_MAX_M = 1
#: ... and the K range and smallest weight it takes (:func:`nvfp4_plain_wins`).
NVFP4_PLAIN_K = (2048, 8192)
NVFP4_PLAIN_MIN_WEIGHTS = 10 << 20
#: largest batch lowbit's tuned fp16/bf16 GEMV (``dense_linear``) takes; cuBLAS above.
DENSE_GEMV_MAX_M = 4
GEMV_DTYPES = (torch.float16, torch.bfloat16)
#: largest M for the kbit GEMM on a GPU the crossover file does not list.
GEMM_MAX_M_DEFAULT = 32
PATHS = ("gemv", "gemm", "dequant_matmul")
#: mean rows per expert from which the grouped GEMM runs, on a GPU the crossover file does not list.
GROUPED_GEMM_MIN_ROWS_DEFAULT = 16


def use_gemv(is_cuda: bool, dtype: torch.dtype, m: int) -> bool:
    """True where the decode GEMV runs: CUDA, fp16/bf16, 1 <= M <= GEMV_MAX_M rows."""
    return is_cuda and 1 <= m <= GEMV_MAX_M and dtype in GEMV_DTYPES


def load_crossovers(path: Path = CROSSOVERS) -> dict[str, list[tuple[int | None, int]]]:
    """{GPU name: [(max weights, largest M for the kbit GEMM), ...]} from a crossover file, classes in
    rising size, the last one open-ended (None); raises ValueError naming the bad entry. Format::

        {"version": 1, "gpus": {"NVIDIA H100 80GB HBM3":
            {"gemm_max_m": [[20000000, 32], [null, 128]], "grouped_gemm_min_rows": 1.5,
             "gemv_kernels": [[3, 4096, 4096, "local"]]}}}

    Every key is optional: a GPU without ``gemm_max_m`` is left out here (it runs GEMM_MAX_M_DEFAULT);
    :func:`load_grouped` reads ``grouped_gemm_min_rows``, :mod:`lowbit.kernels.picks` ``gemv_kernels``
    (validated here too).
    """
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or raw.get("version") != 1 or not isinstance(raw.get("gpus"), dict):
        raise ValueError(f"{path}: expected {{'version': 1, 'gpus': {{...}}}}")
    out = {}
    for gpu, entry in raw["gpus"].items():
        grouped = entry.get("grouped_gemm_min_rows") if isinstance(entry, dict) else None
        if grouped is not None and (not isinstance(grouped, (int, float)) or isinstance(grouped, bool) or not grouped > 0):
            raise ValueError(f"{path}: gpus[{gpu!r}].grouped_gemm_min_rows must be a number > 0, got {grouped!r}")
        if isinstance(entry, dict) and "gemv_kernels" in entry:
            picks.parse(entry["gemv_kernels"], f"{path}: gpus[{gpu!r}].gemv_kernels")
        if isinstance(entry, dict) and entry and "gemm_max_m" not in entry:
            continue
        classes = entry.get("gemm_max_m") if isinstance(entry, dict) else None
        where = f"{path}: gpus[{gpu!r}].gemm_max_m"
        if not isinstance(classes, list) or not classes:
            raise ValueError(f"{where} must be a list of [max weights or null, max M], got {classes!r}")
        parsed = []
        for i, c in enumerate(classes):
            ok = isinstance(c, list) and len(c) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                             for v in c[1:]) and (c[0] is None or isinstance(c[0], int))
            if not ok or c[1] < GEMV_MAX_M or (c[0] is None) != (i == len(classes) - 1):
                raise ValueError(f"{where}[{i}] must be [max weights (null for the last), max M >= {GEMV_MAX_M}], got {c!r}")
            if i and parsed[-1][0] >= (c[0] if c[0] is not None else float("inf")):
                raise ValueError(f"{where}: classes must rise in size")
            parsed.append((c[0], c[1]))
        out[gpu] = parsed
    return out


def load_grouped(path: Path = CROSSOVERS) -> dict[str, float]:
    """{GPU name: mean rows per expert from which the grouped GEMM runs} from a crossover file
    (validated by :func:`load_crossovers`)."""
    load_crossovers(path)
    if not path.exists():
        return {}
    gpus = json.loads(path.read_text())["gpus"]
    return {gpu: e["grouped_gemm_min_rows"] for gpu, e in gpus.items() if "grouped_gemm_min_rows" in e}


_classes: dict[int, list] = {}
_crossovers: dict | None = None
_grouped: dict[int, float] = {}
_grouped_table: dict | None = None


def _constant_result(fn):
    """``torch.compiler.assume_constant_result`` without importing ``torch._dynamo`` (~2 s) when lowbit loads: the
    mark that decorator sets (tests/test_dispatch.py checks that it still is the only thing it does)."""
    fn._dynamo_marked_constant = True
    return fn


def grouped_gemm_min_rows(device: torch.device) -> float:
    """Mean rows per expert from which the grouped GEMM beats the grouped GEMV on this device."""
    return _gpu_grouped(device.index if device.index is not None else torch.cuda.current_device())


@_constant_result
def _gpu_grouped(idx: int) -> float:
    global _grouped_table
    if idx not in _grouped:
        if _grouped_table is None:
            _grouped_table = {**load_grouped(), **load_grouped(user_crossover_file())}
        _grouped[idx] = _grouped_table.get(torch.cuda.get_device_name(idx), GROUPED_GEMM_MIN_ROWS_DEFAULT)
    return _grouped[idx]


def gemm_max_m(device: torch.device, weights: int | None = None) -> int:
    """Largest M the kbit GEMM runs on this device for a weight of ``weights`` elements (the measured
    crossover with dequantize + cuBLAS; None: the largest class)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return class_max_m(_gpu_classes(idx), weights)


@_constant_result  # a file lookup: traced as a constant, not a graph break
def _gpu_classes(idx: int) -> list:
    global _crossovers
    if idx not in _classes:
        if _crossovers is None:
            _crossovers = crossover_table()
        _classes[idx] = _crossovers.get(torch.cuda.get_device_name(idx), [(None, GEMM_MAX_M_DEFAULT)])
    return _classes[idx]


def crossover_table() -> dict[str, list[tuple[int | None, int]]]:
    """The shipped crossovers, with the user file's GPUs replacing theirs."""
    return {**load_crossovers(), **load_crossovers(user_crossover_file())}


def untuned_note(gpu: str) -> str | None:
    """One line for a GPU that the crossover files or the fp16/bf16 GEMV tuning table (shipped or the user's) do not
    list: which measured choices it runs without, and the command that measures each; None where both list it.
    ``lowbit generate`` and ``lowbit bench`` print it, since the shipped files hold the GPUs lowbit was tuned on."""
    from . import tuning

    missing = []
    if gpu not in crossover_table():
        missing.append("the kbit GEMM / grouped GEMM crossovers: `lowbit tune --kbit-crossover` (and the GEMV kernels "
                       "of your shapes: `lowbit tune --gemv-kernels`)")
    if gpu not in tuning.table():
        missing.append("the fp16/bf16 GEMV configurations: `lowbit tune`")
    if not missing:
        return None
    return (f"note: lowbit has no tuning for {gpu}, so it runs generic defaults (correct, maybe not the fastest). "
            f"To measure this GPU's: {'; '.join(missing)}")


def reload_crossovers() -> None:
    """Forget the loaded crossover files (after ``lowbit tune --kbit-crossover`` or ``--gemv-kernels`` wrote one)."""
    global _crossovers, _grouped_table
    _crossovers = _grouped_table = None
    picks.reload()
    _classes.clear()
    _grouped.clear()


def class_max_m(classes: list[tuple[int | None, int]], weights: int | None) -> int:
    """The max M of the first class holding ``weights`` elements (None: the last class)."""
    if weights is not None:
        for upto, m in classes:
            if upto is not None and weights <= upto:
                return m
    return classes[-1][1]


_forced: str | None = None


@contextlib.contextmanager
def forced_path(path: str | None):
    """Run every dense kbit call in the block on ``path`` ("gemv", "gemm", "dequant_matmul"; None:
    the rule), every SBVR call on one of :data:`SBVR_PATHS` -- for benchmarks and tests; grouped kbit calls
    take "gemv" / "gemm" as the grouped GEMV / GEMM. A path that cannot take a call (the GEMV above 8 rows, a kernel on CPU or fp32, dequantize
    for grouped calls) falls back to the rule."""
    global _forced
    if path is not None and path not in PATHS + SBVR_PATHS:
        raise ValueError(f"path must be one of {PATHS + SBVR_PATHS} or None, got {path!r}")
    prev, _forced = _forced, path
    try:
        yield
    finally:
        _forced = prev


def kbit_path(x2: torch.Tensor, n: int | None = None) -> str:
    """The path for a 2-D activation ``x2 [M, K_in]`` against a weight of ``n`` rows (None: the
    largest size class): ``"gemv"``, ``"gemm"`` or ``"dequant_matmul"``."""
    m = x2.shape[0]
    weights = None if n is None else n * x2.shape[1]
    gemm_max = gemm_max_m(x2.device, weights) if x2.is_cuda and m > GEMV_MAX_M else GEMV_MAX_M
    return choose_path(x2.is_cuda, x2.dtype, m, gemm_max, _forced)


def choose_path(is_cuda: bool, dtype: torch.dtype, m: int, gemm_max: int, forced: str | None = None) -> str:
    """The rule behind :func:`kbit_path`: the GEMV up to GEMV_MAX_M rows, the GEMM up to ``gemm_max``,
    dequantize + matmul beyond, and for anything the kernels do not take (CPU, fp32, no rows)."""
    kernel_ok = is_cuda and dtype in GEMV_DTYPES and m >= 1
    if forced in PATHS and kernel_ok and (forced != "gemv" or m <= GEMV_MAX_M):
        return forced
    if use_gemv(is_cuda, dtype, m):
        return "gemv"
    if kernel_ok and m <= gemm_max:
        return "gemm"
    return "dequant_matmul"


def nvfp4_path(x2: torch.Tensor, n: int, k: int) -> str:
    """The path for ``x2 [M, K] @ W^T`` with an NVFP4 weight ``[n, k]``: "gemv", "gemm",
    "dequant_matmul" or "reference" (CPU, fp32, no rows, K % 32 != 0)."""
    m = x2.shape[0]
    if not (x2.is_cuda and x2.dtype in GEMV_DTYPES and m >= 1) or k % ops.PLAIN_K_MULTIPLE:
        return "reference"
    gemm_max = gemm_max_m(x2.device, n * k) if m > GEMV_MAX_M else GEMV_MAX_M
    return choose_path(True, x2.dtype, m, gemm_max, _forced)


def nvfp4_plain_wins(m: int, n: int, k: int, device: torch.device | None = None) -> bool:
    """Whether the checkpoint-layout GEMV takes an M-row NVFP4 call (else the tiled one): at one row, where
    ``device``'s GPU has a measured pick for the shape (:mod:`lowbit.kernels.picks`), that; otherwise the rule below.

    That kernel gives each warp of a CTA 1,024-value steps of K (at M = 1): K of 2,048..8,192 fills 2..8
    warps evenly; longer K leaves a partial last round and shorter K idle warps, and below ~10M weights
    its fixed cost does not pay against the tiled split kernel. Measured on H100, cold, M = 1
    (``benchmarks/tools/nvfp4_m1_paths.py``, 29 shapes): inside this rule plain/tiled 0.86-1.00 but for
    8192x28672 (1.10, where plain still matches kbit4's time); outside it tiled is faster by up to 28%
    (14336x4096), or slower by at most 1 us (8192x1024, 4096x1024: 0.86)."""
    if m == 1 and device is not None:
        pick = _nvfp4_pick(device.index if device.index is not None else torch.cuda.current_device(), n, k)
        if pick is not None:
            return pick == "plain"
    lo, hi = NVFP4_PLAIN_K
    return m <= NVFP4_PLAIN_MAX_M and lo <= k <= hi and n * k >= NVFP4_PLAIN_MIN_WEIGHTS


@_constant_result  # a file lookup: traced as a constant, not a graph break
def _nvfp4_pick(idx: int, n: int, k: int) -> str | None:
    return picks.pick(gpu_name(torch.device("cuda", idx)), "nvfp4", n, k)


def nvfp4_linear_op(x2: torch.Tensor, w) -> torch.Tensor:
    """``x2 [M, K] @ W^T`` for an :class:`~lowbit.formats.nvfp4.NvFp4Weight`, through the custom ops."""
    n, k = w.shape
    path = nvfp4_path(x2, n, k)
    if path == "gemv" and nvfp4_plain_wins(x2.shape[0], n, k, x2.device):
        return ops.nvfp4_plain_gemv(x2, w.packed, w.scales, w.scale_2)
    if path == "gemv":
        qw, qs = w.tiled()
        return ops.nvfp4_gemv(x2, qw, qs, w.scale_2, n, k)
    if path == "gemm":
        qw, qs = w.tiled()
        return ops.nvfp4_gemm(x2, qw, qs, w.scale_2, n, k)
    if path == "dequant_matmul":
        return torch.nn.functional.linear(x2, ops.nvfp4_dequantize(w.packed, w.scales, w.scale_2, x2.dtype))
    if x2.is_cuda:
        return torch.nn.functional.linear(x2, w.dequantize(x2.dtype))
    from .formats import nvfp4

    return nvfp4.linear_reference(x2, w)


def grouped_path(x2: torch.Tensor, experts: int) -> str:
    """The path for MoE rows ``x2 [rows, K_in]`` sorted over ``experts`` experts: ``"grouped_gemv"``,
    ``"grouped_gemm"`` or ``"reference"``. Decided from the mean rows per expert (a shape, never the
    routing: nothing is read back from the GPU, so it is the same under CUDA graphs)."""
    if not (x2.is_cuda and x2.dtype in GEMV_DTYPES):
        return "reference"
    return choose_grouped(x2.shape[0], experts, grouped_gemm_min_rows(x2.device), _forced)


#: MoE decode on unsorted rows (``lowbit.ops.kbit_routed_gemv``; :func:`moe_routed`); False: always sort.
MOE_ROUTED = True


def moe_routed(hidden_states: torch.Tensor, routes: int, experts: int) -> bool:
    """Whether an expert block runs its ``routes`` (token, expert) rows unsorted through the routed GEMV
    (``lowbit.nn.experts.moe_routed_forward``): CUDA fp16/bf16, at most ``ROUTED_MAX_ROUTES`` routes, and
    where the grouped GEMV would take the sorted rows (a shape, never the routing: the same under graphs)."""
    return (MOE_ROUTED and hidden_states.is_cuda and hidden_states.dtype in GEMV_DTYPES
            and 0 < routes <= ops.ROUTED_MAX_ROUTES
            and choose_grouped(routes, experts, grouped_gemm_min_rows(hidden_states.device), _forced) == "grouped_gemv")


def choose_grouped(rows: int, experts: int, min_rows: float, forced: str | None = None) -> str:
    """The rule behind :func:`grouped_path` for a CUDA fp16/bf16 call."""
    if forced in ("gemv", "gemm"):
        return "grouped_" + forced
    return "grouped_gemm" if rows >= min_rows * max(1, experts) else "grouped_gemv"


def kbit_weight_linear_op(x2: torch.Tensor, w) -> torch.Tensor:
    """``x2 [M, K_in] @ W^T`` for a :class:`~lowbit.formats.kbit.KbitWeight` (the functional API): the
    GEMV through the launcher the weight keeps (eager) or the op (compiled), the GEMM, or dequantize +
    matmul from the bit planes (large M, fp32, CPU: the reference)."""
    path = kbit_path(x2, w.shape[0])
    n, k_in = w.shape
    if path == "gemv":
        qweight, qabsmax = w.tiled()
        launch = None
        if not torch.compiler.is_compiling():
            launch = w._launcher
            if launch is None or launch.index != x2.get_device():
                tensors = {"qweight": qweight, "qabsmax": qabsmax, "codebook": w.codebook, "scale": w.scale}
                launch = w._launcher = eager_launcher("gemv", tensors, w.bits, n, k_in, x2)
        if launch is not None:
            return launch(x2, x2.shape[0], (x2.shape[0], n))
        return ops.kbit_gemv(x2, qweight, qabsmax, w.codebook, w.scale, w.bits, n, k_in)
    if path == "gemm":
        qweight, qabsmax = w.tiled()
        return ops.kbit_gemm(x2, qweight, qabsmax, w.codebook, w.scale, w.bits, n, k_in)
    return ops.kbit_linear(x2, *w.tensors(), w.bits)


#: SBVR's decode kernels: the popcount GEMV (x rounded to 8 bits, work ~ M) and the weight-only lookup GEMV
#: (work independent of M <= 8): rows of x up to which the popcount GEMV runs when the module allows rounded
#: activations (``act_bits=8``) -- the measured crossover on the H100 (M = 4: popcount faster or equal on five
#: Llama shapes, M = 8: lookup faster on all; benchmarks/journal/2026-11-25_sbvr_kernels.md).
SBVR_POPCOUNT_MAX_M = 4
SBVR_PATHS = ("popcount", "lookup", "dequant_matmul")


def sbvr_path(x2: torch.Tensor, num_sums: int, group: int, act_bits: int | None) -> str:
    """The path of an SBVR call: ``"popcount"`` (the popcount GEMV; its reference on CPU and fp32), ``"lookup"``
    (the weight-only lookup GEMV: CUDA fp16/bf16, M <= 8, num_sums <= 4, group a multiple of 128) or
    ``"dequant_matmul"``. Whether x is rounded depends only on (M, num_sums, group, act_bits), never on the
    device, so CPU and GPU compute the same product."""
    from .formats.sbvr import tiled as sbvr_tiled

    m = x2.shape[0]
    codes_ok = sbvr_tiled.codes_fit(num_sums, group)
    popcount_ok = act_bits is not None and 1 <= m <= GEMV_MAX_M
    lookup_ok = codes_ok and x2.is_cuda and x2.dtype in GEMV_DTYPES and 1 <= m <= GEMV_MAX_M
    if _forced in SBVR_PATHS and {"popcount": popcount_ok, "lookup": lookup_ok, "dequant_matmul": True}[_forced]:
        return _forced
    if popcount_ok and (m <= SBVR_POPCOUNT_MAX_M or not codes_ok):
        return "popcount"
    return "lookup" if lookup_ok else "dequant_matmul"


def sbvr_linear_op(x2: torch.Tensor, qbits, qcodes, qidx, cache8, n: int, k: int, group: int,
                   bias: torch.Tensor | None = None, act_bits: int | None = 8) -> torch.Tensor:
    """``x2 [M, K] @ W^T (+ bias)`` for an SBVR weight in the kernels' layouts (:mod:`lowbit.formats.sbvr.tiled`;
    ``qcodes`` None where the lookup GEMV cannot take the weight) on :func:`sbvr_path`'s path: the popcount
    GEMV (x rounded to 8 bits per group), the lookup GEMV, or the dequantize kernel + cuBLAS (one rounding of
    W to x's dtype) -- the fp32 references on CPU and for fp32."""
    path = sbvr_path(x2, qbits.shape[-1] // 2, group, act_bits)
    if path == "popcount":
        return ops.sbvr_gemv(x2, qbits, qidx, cache8, n, k, group, bias)
    if path == "lookup" and qcodes is not None:
        return ops.sbvr_lookup_gemv(x2, qcodes, qidx, cache8, n, k, group, bias)
    if x2.is_cuda and x2.dtype in GEMV_DTYPES:
        w = ops.sbvr_tiled_dequantize(qbits, qidx, cache8, n, k, group, x2.dtype)
        return torch.nn.functional.linear(x2, w, None if bias is None else bias.to(x2.dtype))
    w = ops.sbvr_tiled_dequantize(qbits, qidx, cache8, n, k, group, torch.float32)
    y = x2.to(torch.float32) @ w.t()
    return (y if bias is None else y + bias.to(torch.float32)).to(x2.dtype)


def sbvr_grouped_op(x2: torch.Tensor, offsets: torch.Tensor, experts, act_bits: int | None = 8,
                    check_offsets: bool = True) -> torch.Tensor:
    """MoE rows sorted by expert times :class:`~lowbit.formats.sbvr.SbvrExperts`: with ``act_bits=8`` and at most
    ``SBVR_POPCOUNT_MAX_M`` rows per expert on average, the grouped popcount GEMV (x rounded to 8 bits; its
    reference on CPU); otherwise weight-only, expert by expert (decoded weight, one matmul each)."""
    e, n, k = experts.shape
    if act_bits is not None and x2.shape[0] <= SBVR_POPCOUNT_MAX_M * e:
        qbits, qidx, cache8, cache_off = experts.layouts()
        return ops.sbvr_grouped_gemv(x2, offsets, qbits, qidx, cache8, cache_off, n, k, experts.group, check_offsets)
    from .ops.common import per_expert

    return per_expert(x2, offsets, n, e, lambda i, rows: dense_linear_op(rows, experts.expert(i).dequantize(rows.dtype))
                      if rows.is_cuda and rows.dtype in GEMV_DTYPES else
                      (rows.float() @ experts.expert(i).dequantize().t()).to(rows.dtype))


def dense_linear_op(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x2 [M, K] @ weight^T`` for an unquantized fp16/bf16 weight: lowbit's tuned GEMV for
    1 <= M <= DENSE_GEMV_MAX_M, cuBLAS above on CUDA, the fp32 reference on CPU."""
    if 1 <= x2.shape[0] <= DENSE_GEMV_MAX_M:
        return ops.dense_gemv(x2, weight)
    if x2.is_cuda:
        return torch.nn.functional.linear(x2, weight)
    return ops.dense_gemv_reference(x2, weight)


def nvfp4_grouped_op(x2, offsets, experts, check_offsets: bool = True) -> torch.Tensor:
    """MoE rows sorted by expert times :class:`~lowbit.formats.nvfp4.NvFp4Experts`: the grouped GEMV or the
    grouped GEMM (one launch each) on CUDA fp16/bf16, by kbit's grouped crossover (:func:`grouped_path`: the
    same kernels, NVFP4's instances), the reference elsewhere."""
    op = ops.nvfp4_grouped_gemm if grouped_path(x2, experts.qweight.shape[0]) == "grouped_gemm" else ops.nvfp4_grouped_gemv
    return op(x2, offsets, experts.qweight, experts.qscales, experts.scale_2, experts.n, experts.k, check_offsets)


def kbit_tiled_linear_op(x2, qweight, qabsmax, codebook, scale, bits: int, n: int, k_in: int,
                         bias: torch.Tensor | None = None, rotation: int = 0) -> torch.Tensor:
    """``x2 [M, K_in] @ W^T (+ bias)`` for a weight held in the tiled layout, through the custom ops.
    ``rotation=32``: the weight holds ``W H``; the GEMV rotates x in its registers, the other paths
    take ``x H`` from :func:`lowbit.formats.kbit.rotation.rotate` (prefill: one small matmul)."""
    path = kbit_path(x2, n)
    if path == "gemv":
        return ops.kbit_gemv(x2, qweight, qabsmax, codebook, scale, bits, n, k_in, bias, rotation)
    if rotation:
        x2 = kbit_rotation.rotate(x2)
    if path == "gemm":
        return ops.kbit_gemm(x2, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)
    return ops.kbit_tiled_linear(x2, qweight, qabsmax, codebook, scale, bits, n, k_in, bias)


def kbit_grouped_op(x2, offsets, qweight, qabsmax, codebook, scales, bits: int, n: int, k_in: int,
                    check_offsets: bool = True) -> torch.Tensor:
    """Grouped MoE matmul through the custom ops (the ops' CPU default is the reference).
    ``check_offsets=False``: offsets built by lowbit (valid by construction), no device-side check."""
    op = ops.kbit_grouped_gemm if grouped_path(x2, qweight.shape[0]) == "grouped_gemm" else ops.kbit_grouped_gemv
    return op(x2, offsets, qweight, qabsmax, codebook, scales, bits, n, k_in, check_offsets)


# ------------------------------------------------------------------ eager fast path
# Eager decode (plain ``model.generate``) calls every linear once per token; through the torch
# dispatcher and the ops' re-checks that costs several times the kernel. A module's tensors were
# checked when it was built, so it keeps a launcher that calls the kernel directly;
# ``torch.compile`` traces the custom ops instead (``*_op`` above).
def eager_launcher(kind: str, buffers: dict, bits: int, n: int, k_in: int, x: torch.Tensor, rotation: int = 0):
    """A ``GemvLauncher`` (kind "gemv"), ``GroupedLauncher`` ("grouped"), ``GroupedGemmLauncher``
    ("grouped_gemm") or ``RoutedLauncher`` ("routed") for the module's buffers, or None where the compiled library is unavailable
    (the op path then runs)."""
    if buffers["qweight"].device != x.device:
        raise ValueError(f"x is on {x.device} but the module's weights are on {buffers['qweight'].device}")
    lib = library_or_none(x.device)
    if lib is None:
        return None
    cls = {"gemv": tiled.GemvLauncher, "grouped": tiled.GroupedLauncher, "grouped_gemm": tiled.GroupedGemmLauncher,
           "routed": tiled.RoutedLauncher}[kind]
    scale = buffers["scale"] if kind == "gemv" else buffers["scales"]
    if rotation and kind != "gemv":
        raise ValueError(f"rotation={rotation}: only the dense GEMV rotates its input")
    extra = (rotation,) if rotation else ()
    return cls(lib, buffers["qweight"], buffers["qabsmax"], buffers["codebook"], scale, tiled.kbit_format(bits), n, k_in,
               *extra)


def nvfp4_routed_launcher(experts, x: torch.Tensor):
    """The routed GEMV's NVFP4 launcher (``tiled.RoutedLauncher``) for an
    :class:`~lowbit.formats.nvfp4.NvFp4Experts` stack, or None where the compiled library is unavailable (the op
    path then runs)."""
    if experts.qweight.device != x.device:
        raise ValueError(f"x is on {x.device} but the module's weights are on {experts.qweight.device}")
    lib = library_or_none(x.device)
    if lib is None:
        return None
    return tiled.RoutedLauncher(lib, experts.qweight, experts.qscales, e2m1_codebook(x.device),
                                experts.scale_2.contiguous(), tiled.NVFP4, experts.n, experts.k)


#: the module formats whose GEMV has the epilogue (:func:`gemv_epilogue_op`)
EPILOGUE_FORMATS = ("kbit", "nvfp4")


def has_epilogue_gemv(module) -> bool:
    """Whether ``module`` is a linear of a format with the epilogue GEMV (asked before its shape is: another
    library's module, or a user's wrapper, may have no ``in_features``)."""
    return getattr(module, "format_name", None) in EPILOGUE_FORMATS


def epilogue_ok(module, rows: int, k: int, dtype: torch.dtype, device: torch.device, reference: bool = False) -> bool:
    """Whether :func:`gemv_epilogue_op` takes ``module(x2)`` for x2 ``[rows, k]`` of ``dtype`` on ``device``: an
    unrotated kbit or NVFP4 linear module (fused ones too; NVFP4 with K a multiple of 32, its tiled GEMV) and a call
    the decode GEMV runs (CUDA, fp16/bf16, 1..GEMV_MAX_M rows), not forced elsewhere. ``reference``: the same call
    on any device, through the op's reference (tests)."""
    fmt = getattr(module, "format_name", None)  # a KbitLinear / NvFp4Linear (nn is above)
    if fmt == "kbit":
        ok, weight = getattr(module, "rotation", 0) == 0, module.qweight
    elif fmt == "nvfp4":
        ok, weight = k % 32 == 0, module.weight
    else:
        return False
    return (ok and k == module.in_features and use_gemv(device.type == "cuda" or reference, dtype, rows)
            and _forced in (None, "gemv") and weight.device == device)


def gemv_epilogue_op(module, x2: torch.Tensor, *, rms_x=None, eps: float = 1e-6, residual=None, norm_weight=None,
                     swiglu: bool = False):
    """``module(x2)`` through the GEMV with the decode step's glue in its output
    (:func:`lowbit.ops.kbit_gemv_epilogue`, :func:`lowbit.ops.nvfp4_gemv_epilogue`): ``(y, yw)``. Eager kbit calls
    go straight to the module's launcher; the rest through the op. The caller checks :func:`epilogue_ok` first."""
    n, k = module.out_features, module.in_features
    if module.format_name == "nvfp4":
        w = module.nvfp4_weight()
        qw, qs = w.tiled()
        return ops.nvfp4_gemv_epilogue(x2, qw, qs, w.scale_2, n, k, module.bias, rms_x, eps, residual, norm_weight,
                                       swiglu)
    b = module._buffers
    if x2.is_cuda and not torch.compiler.is_compiling():
        launch = module._launcher
        if launch is None or launch.tensors[0] is not b["qweight"] or launch.index != x2.get_device():
            launch = module._launcher = eager_launcher("gemv", b, module.bits, n, k, x2, module.rotation)
        if launch is not None:
            from .kernels.tiled import run_gemv_epilogue

            m = ops.check_gemv_epilogue_args(x2, b["qweight"], b["qabsmax"], b["codebook"], b["scale"], module.bits, n, k,
                                             module.bias, rms_x, residual, norm_weight, swiglu)
            return run_gemv_epilogue(launch, x2.contiguous(), m, module.bias, rms_x, eps, residual, norm_weight, swiglu)
    return ops.kbit_gemv_epilogue(x2, b["qweight"], b["qabsmax"], b["codebook"], b["scale"], module.bits, n, k,
                                  module.bias, rms_x, eps, residual, norm_weight, swiglu)
