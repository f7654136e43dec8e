"""Measured kernel picks for plain one-token kbit GEMV calls, per GPU and shape.

:func:`lowbit.kernels.tiled.bulk_rule` and :func:`~lowbit.kernels.tiled.dense_path` choose a one-token call's kernel
(the bulk-copy GEMV, split-K, CTA-local or global stream-K) by rules measured on an H100. Where the fastest kernel
depends on the GPU's balance of HBM bandwidth and decode rate the rules can miss it (an H200: 9 of the 43 preset shape x K
cases timed, by 2.8-10.8%; benchmarks/journal/2026-11-28_bulk_gemv_tokens.md). ``lowbit tune --kbit-gemv`` times every
kernel on a GPU's shapes and records the ones where another kernel beats the rules' pick, under the crossover file's
``gemv_kernels`` key::

    {"version": 1, "gpus": {"NVIDIA H200": {"gemv_kernels": [[3, 4096, 4096, "local"], ...], ...}}}

each entry ``[K bits, N, K_in, kernel]``. A shape not listed takes the rules. The user file (``$LOWBIT_DISPATCH_FILE``,
else ``~/.cache/lowbit/kbit_dispatch.json``) overrides the shipped ``lowbit/data/kbit_dispatch.json`` shape by shape.
Only plain calls use them: the decode layers' calls (an epilogue, SwiGLU) run chained under PDL, where timing a kernel
alone misleads, and keep the rules measured end to end.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

#: The crossover file shipped with lowbit (lowbit.dispatch reads its other keys).
CROSSOVERS = Path(__file__).resolve().parent.parent / "data" / "kbit_dispatch.json"
#: The kernels a pick may name (tiled.DENSE_PATH's values).
KERNELS = ("bulk", "split", "local", "streamk")
#: Whether picks apply (``lowbit tune --kbit-gemv`` turns them off to time the rules' own choice).
USE = True


def user_crossover_file() -> Path:
    """Crossovers measured here (``lowbit tune --kbit-crossover`` / ``--kbit-gemv``), overriding the shipped ones."""
    env = os.environ.get("LOWBIT_DISPATCH_FILE")
    return Path(env) if env else Path.home() / ".cache" / "lowbit" / "kbit_dispatch.json"


def parse(value: object, where: str) -> dict[tuple[int, int, int], str]:
    """{(bits, n, k_in): kernel} from a ``gemv_kernels`` list; ValueError naming the bad entry."""
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of [bits, N, K_in, kernel], got {value!r}")
    out = {}
    for i, e in enumerate(value):
        ints = isinstance(e, list) and len(e) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in e[:3])
        if not ints or not 2 <= e[0] <= 5 or e[1] < 1 or e[2] < 32 or e[2] % 32 or e[3] not in KERNELS:
            raise ValueError(f"{where}[{i}] must be [bits 2..5, N >= 1, K_in (a multiple of 32), one of {KERNELS}], "
                             f"got {e!r}")
        out[(e[0], e[1], e[2])] = e[3]
    return out


def load(path: Path) -> dict[str, dict[tuple[int, int, int], str]]:
    """{GPU name: {(bits, n, k_in): kernel}} from a crossover file's ``gemv_kernels`` keys ({} where it is missing)."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or raw.get("version") != 1 or not isinstance(raw.get("gpus"), dict):
        raise ValueError(f"{path}: expected {{'version': 1, 'gpus': {{...}}}}")
    return {gpu: parse(entry["gemv_kernels"], f"{path}: gpus[{gpu!r}].gemv_kernels")
            for gpu, entry in raw["gpus"].items() if isinstance(entry, dict) and "gemv_kernels" in entry}


_lock = threading.Lock()
_table: dict | None = None


def table() -> dict[str, dict[tuple[int, int, int], str]]:
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


def pick(gpu: str, bits: int, n: int, k_in: int) -> str | None:
    """The measured kernel for a plain one-token call of this shape on this GPU, or None (the rules decide)."""
    if not USE:
        return None
    return table().get(gpu, {}).get((bits, n, k_in))
