"""Compiled CUDA kernels: the nvcc build and its cache (``build``), the ctypes loader (``library``),
device facts (``device``), the launch planning of the shared tiled kernels (``tiled``), the kernels measured
fastest per GPU and shape (``picks``), and one module per format that registers its CUDA implementations on
the ``lowbit::`` ops when imported."""

import importlib
import pkgutil

#: the modules that are not a format's kernels
INFRASTRUCTURE = ("build", "library", "device", "tiled", "picks")


def register_all() -> None:
    """Import every format's kernel module (a new format's module is found by being in this package)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name not in INFRASTRUCTURE:
            importlib.import_module(f"{__name__}.{info.name}")
