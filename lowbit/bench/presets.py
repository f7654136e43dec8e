"""Model-layer shape presets, kept as data in ``presets.json``; loaded and validated here."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

PRESETS_FILE = Path(__file__).with_name("presets.json")


@dataclass(frozen=True)
class Linear:
    name: str
    k_in: int
    n: int

    def __post_init__(self):
        for attr in ("k_in", "n"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"linear {self.name!r}: {attr} must be a positive integer, got {v!r}")
        if self.k_in % 32:
            raise ValueError(f"linear {self.name!r}: k_in={self.k_in} must be a multiple of 32")


@dataclass(frozen=True)
class Moe:
    experts: int
    top_k: int
    linears: tuple[Linear, ...]

    def __post_init__(self):
        if not (isinstance(self.experts, int) and self.experts > 0):
            raise ValueError(f"moe.experts must be a positive integer, got {self.experts!r}")
        if not (isinstance(self.top_k, int) and 0 < self.top_k <= self.experts):
            raise ValueError(f"moe.top_k must be in 1..experts={self.experts}, got {self.top_k!r}")
        if not self.linears:
            raise ValueError("moe.linears must not be empty")


@dataclass(frozen=True)
class Preset:
    name: str
    source: str
    linears: tuple[Linear, ...]
    moe: Moe | None = None
    extra: dict = field(default_factory=dict, compare=False)


def _linear(d: dict, where: str) -> Linear:
    unknown = set(d) - {"name", "k_in", "n"}
    if unknown or not {"name", "k_in", "n"} <= set(d):
        raise ValueError(f"{where}: a linear needs exactly name, k_in, n; got keys {sorted(d)}")
    return Linear(str(d["name"]), d["k_in"], d["n"])


def parse_preset(name: str, d: dict) -> Preset:
    if not isinstance(d.get("linears"), list) or not d["linears"]:
        raise ValueError(f"preset {name!r}: 'linears' must be a non-empty list")
    linears = tuple(_linear(x, f"preset {name!r}") for x in d["linears"])
    moe = None
    if d.get("moe") is not None:
        m = d["moe"]
        moe = Moe(m.get("experts"), m.get("top_k"), tuple(_linear(x, f"preset {name!r} moe") for x in m.get("linears", [])))
    names = [lin.name for lin in linears] + ([lin.name for lin in moe.linears] if moe else [])
    if len(set(names)) != len(names):
        raise ValueError(f"preset {name!r}: linear names must be unique")
    return Preset(name, str(d.get("source", "")), linears, moe)


def load_presets(path: Path = PRESETS_FILE) -> dict[str, Preset]:
    data = json.loads(Path(path).read_text())
    return {name: parse_preset(name, d) for name, d in data["presets"].items()}


def default_preset_names(path: Path = PRESETS_FILE) -> list[str]:
    """The presets ``lowbit bench`` runs when none is named (the file's "default" list)."""
    data = json.loads(Path(path).read_text())
    names = list(data.get("default", [n for n in data["presets"] if n != "quick"]))
    unknown = [n for n in names if n not in data["presets"]]
    if unknown:
        raise ValueError(f"{path}: default presets {unknown} are not defined")
    return names


_SHAPE = re.compile(r"^(\d+)\s*[xX]\s*(\d+)$")


def parse_shape(text: str) -> Linear:
    """'K_INxN' (e.g. '4096x14336', input dim first) -> a custom Linear."""
    m = _SHAPE.match(text.strip())
    if not m:
        raise ValueError(f"shape must look like K_INxN (e.g. 4096x14336), got {text!r}")
    return Linear(f"{m[1]}x{m[2]}", int(m[1]), int(m[2]))
