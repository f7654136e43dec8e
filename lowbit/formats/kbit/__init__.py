"""kbit: K-bit (K = 2..5) codebook quantization in blocks of 32.

* :mod:`.definition` -- the format itself, in PyTorch (the reference every kernel is tested against);
* :mod:`.tiled` -- the GPU layout the kernels read, and its pack / unpack;
* :mod:`.weight` -- ``KbitWeight`` / ``KbitExperts``: a quantized weight with its GPU layout built once;
* :mod:`.columns` -- the format quantized column by column, for error-compensating calibration (GPTQ);
* :mod:`.rotation` -- the optional block-32 Hadamard rotation of a weight's input space.
"""

from . import columns, definition, rotation, tiled, weight
from .definition import *  # noqa: F401,F403
from .definition import BLOCK, SUPPORTED_BITS, _check_codebook_values  # noqa: F401
from .weight import KbitExperts, KbitWeight, quantize, quantize_experts  # noqa: F401
