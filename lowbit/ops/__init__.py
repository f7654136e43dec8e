"""Op layer: one ``torch.library`` custom op per operation, under the ``lowbit::`` namespace, one
module per format (``kbit``, ``nvfp4``, ``dense``; ``common``: what they share).

Each op has
* a default implementation = the format's pure-PyTorch reference (runs on CPU, and on any
  device no kernel is registered for),
* a fake implementation (shapes/dtypes only) so ``torch.compile(fullgraph=True)`` traces it,
* device kernels registered by ``lowbit.kernels.*`` (CUDA; imported by the package, never by
  this module), which override the default.
All three run the same metadata checks, so bad input fails the same way everywhere.
"""

import importlib as _importlib
import pkgutil as _pkgutil
import types as _types

# Every module of this package is one format's ops (or what they share, or the decode step's attention): importing it registers its
# ops; its public names (ops, checks, references, limits) are re-exported here. A new format's
# module is found by being here.
for _info in _pkgutil.iter_modules(__path__):
    _mod = _importlib.import_module(f"{__name__}.{_info.name}")
    globals().update({k: v for k, v in vars(_mod).items()
                      if not k.startswith("_") and not isinstance(v, _types.ModuleType) and k not in ("Tensor", "annotations")})
    globals()[_info.name] = _mod  # lowbit.ops.kbit is kbit's op module
