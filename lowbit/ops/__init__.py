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

from .common import *  # noqa: F401,F403
from .common import _check_out_dtype  # noqa: F401
from .dense import *  # noqa: F401,F403
from .kbit import *  # noqa: F401,F403
from .kbit import _check_kernel_x_args  # noqa: F401
from .nvfp4 import *  # noqa: F401,F403
import importlib as _importlib  # noqa: E402

# The submodules by name (the star imports above also carried the *formats* named kbit / nvfp4).
common, dense, kbit, nvfp4 = (_importlib.import_module(f"{__name__}.{m}") for m in ("common", "dense", "kbit", "nvfp4"))
