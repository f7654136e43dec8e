"""The import graph reads as the data flow: every import (lazy ones inside functions included) goes
to the same layer or one below, there are no cycles, and nothing below the facade imports it."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lowbit"

#: bottom to top; a module belongs to the first entry that is it or one of its packages
LAYERS = [
    ("lowbit._checks", "lowbit.errors", "lowbit._version"),  # what every layer shares
    ("lowbit.formats",),                                      # each format's definition and layouts (PyTorch)
    ("lowbit.ops",),                                          # op schemas, references, fakes
    ("lowbit.kernels", "lowbit.tuning"),                      # CUDA build, loader, launch planning, registrations
    ("lowbit.dispatch",),                                     # which kernel runs a call
    ("lowbit.nn",),                                           # modules
    ("lowbit.model",),                                        # quantize a model, checkpoints
    ("lowbit",),                                              # the facade (lowbit/__init__.py)
    ("lowbit.hf", "lowbit.bench"),                            # generate / eval, benchmarks
    ("lowbit.cli", "lowbit.__main__"),                        # the command line
]


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _targets(mod: str, node) -> list[str]:
    """lowbit modules an import statement loads (``from pkg import name``: the submodule if it is one)."""
    package = mod if MODULES[mod].name == "__init__.py" else mod.rpartition(".")[0]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "lowbit"]
    if node.level == 0:
        if not (node.module or "").startswith("lowbit"):
            return []
        base = node.module
    else:
        base = package
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        if node.module:
            base = f"{base}.{node.module}"
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(mod, node):
                    while t not in MODULES and "." in t:
                        t = t.rpartition(".")[0]
                    if t != mod and t in MODULES:
                        edges[mod].add(t)
    return edges


def _layer(mod: str) -> int:
    for i, names in enumerate(LAYERS):
        if any(mod == n or (n != "lowbit" and mod.startswith(n + ".")) for n in names):
            return i
    raise AssertionError(f"{mod} is in no layer: add it to LAYERS in {__file__}")


EDGES = _edges()


def test_every_module_has_a_layer():
    for mod in MODULES:
        _layer(mod)


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_go_down(mod):
    up = [t for t in EDGES[mod] if _layer(t) > _layer(mod)]
    assert not up, f"{mod} (layer {_layer(mod)}) imports {up} from above it"


def test_nothing_below_the_facade_imports_it():
    below = [m for m in MODULES if _layer(m) < _layer("lowbit")]
    assert not [m for m in below if "lowbit" in EDGES[m]]


def test_no_cycles():
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in MODULES:
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_lazy_imports():
    """A function-level import counts (the layering must hold for every import, not only the top ones)."""
    # lowbit/cli.py imports the bench and generate commands inside a function, only when they are asked for
    assert {"lowbit.bench.cli", "lowbit.hf.generate"} <= EDGES["lowbit.cli"]
