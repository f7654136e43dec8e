"""Measured kernel picks for plain one-token GEMV calls of quantized weights, per GPU, format and shape.

Rules measured on an H100 choose a one-token call's kernel: for kbit :func:`lowbit.kernels.tiled.bulk_rule` and
:func:`~lowbit.kernels.tiled.dense_path` (the bulk-copy GEMV, split-K, CTA-local or global stream-K), for NVFP4
:func:`lowbit.dispatch.nvfp4_plain_wins` (the checkpoint-layout GEMV or the tiled one). Where the fastest kernel
depends on the GPU's balance of HBM bandwidth and decode rate they can miss it: on an H200 the kbit rules missed on 9
of the 43 preset shape x K cases timed, by 2.8-10.8% (benchmarks/journal/2026-11-28_bulk_gemv_tokens.md), and NVFP4's
plain kernel took 1.2-1.5x the tiled one's time on large shapes (benchmarks/journal/2026-11-28_gemv_picks.md).
``lowbit tune --gemv-kernels`` times every kernel on a GPU's shapes and records those where another kernel beats the
rules' pick, under the crossover file's ``gemv_kernels`` key::

    {"version": 1, "gpus": {"NVIDIA H200": {"gemv_kernels": [["kbit3", 4096, 4096, "local"],
                                                             ["nvfp4", 14336, 4096, "tiled"], ...], ...}}}

each entry ``[format, N, K_in, kernel]``: kbit2..kbit5 name a tiled kernel (``bulk``, ``split``, ``local``,
``streamk``), nvfp4 ``plain`` or ``tiled`` (the tiled GEMV as its rules run it). A shape not listed takes the rules.
The user file (``$LOWBIT_DISPATCH_FILE``, else ``~/.cache/lowbit/kbit_dispatch.json``) overrides the shipped
``lowbit/data/kbit_dispatch.json`` shape by shape. Only plain calls use them: the decode layers' calls (an epilogue,
SwiGLU) run chained under PDL, where a kernel timed alone misleads, and keep the rules measured end to end.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

#: The crossover file shipped with lowbit (lowbit.dispatch reads its other keys).
CROSSOVERS = Path(__file__).resolve().parent.parent / "data" / "kbit_dispatch.json"
#: The kernels a pick may name, per format: kbit's are tiled.DENSE_PATH's values; NVFP4's the checkpoint-layout GEMV
#: or the tiled one.
KERNELS = {**{f"kbit{b}": ("bulk", "split", "local", "streamk") for b in (2, 3, 4, 5)}, "nvfp4": ("plain", "tiled")}
#: Whether picks apply (``lowbit tune --gemv-kernels`` turns them off to time the rules' own choice).
USE = True


def user_crossover_file() -> Path:
    """Crossovers measured here (``lowbit tune --kbit-crossover`` / ``--gemv-kernels``), overriding the shipped ones."""
    env = os.environ.get("LOWBIT_DISPATCH_FILE")
    return Path(env) if env else Path.home() / ".cache" / "lowbit" / "kbit_dispatch.json"


def parse(value: object, where: str) -> dict[tuple[str, int, int], str]:
    """{(format, n, k_in): kernel} from a ``gemv_kernels`` list; ValueError naming the bad entry."""
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of [format, N, K_in, kernel], got {value!r}")
    out = {}
    for i, e in enumerate(value):
        ok = (isinstance(e, list) and len(e) == 4 and e[0] in KERNELS and e[3] in KERNELS[e[0]]
              and all(isinstance(v, int) and not isinstance(v, bool) for v in e[1:3]) and e[1] >= 1 and e[2] >= 32
              and e[2] % 32 == 0)
        if not ok:
            raise ValueError(f"{where}[{i}] must be [format, N >= 1, K_in (a multiple of 32), kernel] with the format "
                             f"and its kernels one of {KERNELS}, got {e!r}")
        out[(e[0], e[1], e[2])] = e[3]
    return out


def load(path: Path) -> dict[str, dict[tuple[str, int, int], str]]:
    """{GPU name: {(format, n, k_in): kernel}} from a crossover file's ``gemv_kernels`` keys ({} where there are
    none)."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or raw.get("version") != 1 or not isinstance(raw.get("gpus"), dict):
        raise ValueError(f"{path}: expected {{'version': 1, 'gpus': {{...}}}}")
    return {gpu: parse(entry["gemv_kernels"], f"{path}: gpus[{gpu!r}].gemv_kernels")
            for gpu, entry in raw["gpus"].items() if isinstance(entry, dict) and "gemv_kernels" in entry}


_lock = threading.Lock()
_table: dict | None = None


def table() -> dict[str, dict[tuple[str, int, int], str]]:
    """The shipped picks with the user file's laid over them, shape by shape (loaded once; :func:`reload`)."""
    global _table
    with _lock:
        if _table is None:
            merged = {gpu: dict(p) for gpu, p in load(CROSSOVERS).items()}
            for gpu, p in load(user_crossover_file()).items():
                merged.setdefault(gpu, {}).update(p)
            _table = merged
        return _table


def reload() -> None:
    global _table
    with _lock:
        _table = None


def pick(gpu: str, fmt: str, n: int, k_in: int) -> str | None:
    """The measured kernel for a plain one-token call of this format ("kbit4", "nvfp4") and shape on this GPU, or
    None (the rules decide)."""
    if not USE:
        return None
    return table().get(gpu, {}).get((fmt, n, k_in))
