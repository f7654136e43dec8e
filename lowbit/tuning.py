"""Tuned launch configurations for the fp16/bf16 decode GEMV (``csrc/dense/gemv.cu``).

A configuration is ``rows`` (rows per thread group, sharing x loads; 16 or 32 selects the
tensor-core kernel, whose warps own 16-row tiles), ``unroll`` (16-byte vectors -- for tensor-core
tiles, 32-element chunks -- per row in flight per thread), ``tpr`` (threads per row group, a multiple of 32), ``threads``
(per CTA, a multiple of tpr, <= 512) and ``prefetch`` (0/1: weight loads ask L2 for 256 bytes).
The fastest one depends on the GPU and the shape, so winners are stored per (GPU name, dtype,
M, N, K) in JSON::

    {"version": 1,
     "gpus": {"NVIDIA H100 80GB HBM3": {"fp16": {"m1_n4096_k2048": {"rows": 2, "unroll": 4,
                                                                     "tpr": 64, "threads": 256,
                                                                     "prefetch": 1}}}}}

Lookup order: the user file (``$LOWBIT_TUNING_FILE``, else ``~/.cache/lowbit/tuning.json``,
written by ``lowbit tune``), then the defaults shipped in ``lowbit/data/tuning.json`` (measured on
an H100). A shape with no entry gets :func:`heuristic` -- never a silent tuning run in the hot
path. Files are validated on load; a bad file raises :class:`TuningFileError` naming the entry.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT_VERSION = 1
SHIPPED = Path(__file__).parent / "data" / "tuning.json"
DTYPES = ("fp16", "bf16")
#: (rows, unroll) pairs compiled into the library (csrc/dense/gemv.cu, LOWBIT_DEFINE_DENSE_M).
#: rows 1, 2, 4: CUDA-core dot products; rows 16, 32: tensor-core tiles (mma.m16n8k16, W as A).
ROWS_UNROLL = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2),
               (16, 1), (16, 2), (16, 4), (32, 1), (32, 2))
MMA_ROWS = (16, 32)
#: (tpr, threads) pairs the tuner searches.
TPR_THREADS = ((32, 128), (32, 256), (64, 256), (128, 128), (128, 256), (256, 256), (128, 512), (512, 512))
MAX_THREADS = 512


class TuningFileError(ValueError):
    pass


@dataclass(frozen=True)
class GemvConfig:
    rows: int
    unroll: int
    tpr: int
    threads: int
    prefetch: int = 0

    def validate(self) -> "GemvConfig":
        if (self.rows, self.unroll) not in ROWS_UNROLL:
            raise TuningFileError(f"(rows, unroll) = ({self.rows}, {self.unroll}) is not compiled; "
                                  f"choose from {ROWS_UNROLL}")
        if self.tpr < 32 or self.tpr % 32 or self.threads % self.tpr or not 32 <= self.threads <= MAX_THREADS:
            raise TuningFileError(f"tpr={self.tpr}, threads={self.threads}: tpr must be a multiple of 32 "
                                  f"dividing threads, threads <= {MAX_THREADS}")
        if self.prefetch not in (0, 1):
            raise TuningFileError(f"prefetch must be 0 or 1, got {self.prefetch}")
        return self

    @staticmethod
    def from_dict(d: object, where: str = "") -> "GemvConfig":
        if not isinstance(d, dict) or set(d) != {"rows", "unroll", "tpr", "threads", "prefetch"}:
            raise TuningFileError(f"{where}: expected {{rows, unroll, tpr, threads, prefetch}}, got {d!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in d.values()):
            raise TuningFileError(f"{where}: values must be integers, got {d!r}")
        try:
            return GemvConfig(**d).validate()
        except TuningFileError as e:
            raise TuningFileError(f"{where}: {e}") from None


def candidates() -> list[GemvConfig]:
    """Every configuration the tuner tries."""
    return [GemvConfig(r, u, t, c, p) for r, u in ROWS_UNROLL for t, c in TPR_THREADS for p in (0, 1)]


def heuristic(m: int, n: int, k: int) -> GemvConfig:
    """Untuned default: the tensor-core kernel (fastest on most H100 shapes at every M), with
    enough warps per row group to cover K in about one pass of 2 chunks each. A chunk is 32
    elements per K segment; there are 8 / P segments, P = M rounded up to a power of two."""
    p = 1 if m == 1 else 2 if m == 2 else 4
    chunks = -(-k // (32 * (8 // p)))
    warps = 1
    while warps * 2 <= min(16, max(1, chunks // 2)):
        warps *= 2
    tpr = 32 * warps
    threads = {32: 128, 64: 256, 128: 128, 256: 256, 512: 512}[tpr]
    return GemvConfig(rows=16, unroll=2, tpr=tpr, threads=threads, prefetch=0)


def key(m: int, n: int, k: int) -> str:
    return f"m{m}_n{n}_k{k}"


def dtype_name(dtype) -> str:
    import torch

    names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    if dtype not in names:
        raise TypeError(f"dense GEMV tuning covers float16 and bfloat16, got {dtype}")
    return names[dtype]


def user_file() -> Path:
    env = os.environ.get("LOWBIT_TUNING_FILE")
    return Path(env) if env else Path.home() / ".cache" / "lowbit" / "tuning.json"


def load(path: Path) -> dict[str, dict[str, dict[str, GemvConfig]]]:
    """Parse and validate a tuning file -> {gpu: {dtype: {key: config}}}. Missing file -> {}."""
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TuningFileError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION or not isinstance(raw.get("gpus"), dict):
        raise TuningFileError(f"{path}: expected {{'version': {FORMAT_VERSION}, 'gpus': {{...}}}}")
    out: dict[str, dict[str, dict[str, GemvConfig]]] = {}
    for gpu, per_dtype in raw["gpus"].items():
        if not isinstance(per_dtype, dict) or not set(per_dtype) <= set(DTYPES):
            raise TuningFileError(f"{path}: gpus[{gpu!r}] must map {DTYPES} to entries")
        out[gpu] = {}
        for dt, entries in per_dtype.items():
            if not isinstance(entries, dict):
                raise TuningFileError(f"{path}: gpus[{gpu!r}][{dt!r}] must be an object")
            out[gpu][dt] = {}
            for k, cfg in entries.items():
                parts = k.split("_")
                if len(parts) != 3 or not all(p[1:].isdigit() for p in parts) or [p[0] for p in parts] != ["m", "n", "k"]:
                    raise TuningFileError(f"{path}: key {k!r} must look like m1_n4096_k2048")
                out[gpu][dt][k] = GemvConfig.from_dict(cfg, f"{path}: gpus[{gpu!r}][{dt!r}][{k!r}]")
    return out


def save(path: Path, table: dict[str, dict[str, dict[str, GemvConfig]]]) -> None:
    """Write (atomically) a tuning file."""
    data = {"version": FORMAT_VERSION,
            "gpus": {g: {dt: {k: asdict(c) for k, c in sorted(e.items())} for dt, e in d.items()}
                     for g, d in table.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def merge(base: dict, extra: dict) -> dict:
    out = {g: {dt: dict(e) for dt, e in d.items()} for g, d in base.items()}
    for g, d in extra.items():
        for dt, e in d.items():
            out.setdefault(g, {}).setdefault(dt, {}).update(e)
    return out


_lock = threading.Lock()
_cache: dict[str, dict] = {}


def table() -> dict[str, dict[str, dict[str, GemvConfig]]]:
    """Shipped defaults overlaid with the user file (loaded once; :func:`reload` re-reads)."""
    with _lock:
        if "t" not in _cache:
            _cache["t"] = merge(load(SHIPPED), load(user_file()))
        return _cache["t"]


def reload() -> None:
    with _lock:
        _cache.clear()


def lookup(gpu: str, dtype, m: int, n: int, k: int) -> tuple[GemvConfig, bool]:
    """(config, tuned?) for this GPU and shape; the heuristic when nothing was tuned."""
    cfg = table().get(gpu, {}).get(dtype_name(dtype), {}).get(key(m, n, k))
    return (cfg, True) if cfg is not None else (heuristic(m, n, k), False)
