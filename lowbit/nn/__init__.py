"""Modules that put lowbit kernels into models: they own the quantized tensors and call the dispatcher.

Every module of this package is imported here; each ``QuantizedModule`` subclass registers itself
(``REGISTRY``) and is an attribute of ``lowbit.nn``, so a new format's module file needs no edit here.
"""

import importlib as _importlib
import pkgutil as _pkgutil

from .base import REGISTRY, QuantizedModule, formats, linear_class
from .experts import KbitMoeExperts, fused_experts_layout
from .fused import FusedKbitLinear, FusedParts, KbitLinearPart, LinearPart, fuse_linears
from .linear import KbitLinear
from .nvfp4 import NvFp4Linear

__all__ = ["REGISTRY", "QuantizedModule", "formats", "linear_class", "FusedKbitLinear", "FusedParts", "KbitLinear",
           "KbitLinearPart", "LinearPart", "KbitMoeExperts", "NvFp4Linear", "fuse_linears",
           "fused_experts_layout"]

for _info in _pkgutil.iter_modules(__path__):
    _importlib.import_module(f"{__name__}.{_info.name}")
globals().update(REGISTRY)
__all__ += [name for name in REGISTRY if name not in __all__]
