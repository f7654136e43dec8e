"""SBVR: weights as sums of coefficient x bitvector per group, coefficients from a shared cache.

* :mod:`.definition` -- the format in PyTorch: encoder, decoder, bit packing, the exact product and the
  authors' bit-plane-activation product;
* :mod:`.weight` -- ``SbvrWeight`` and ``quantize``;
* :mod:`.tiled` -- the GPU kernels' layout of the weight and of the encoded activations;
* :mod:`.columns` -- the format quantized column by column, for error-compensating calibration (GPTQ).
"""

from . import columns, definition, tiled, weight
from .definition import *  # noqa: F401,F403
from .weight import SbvrExperts, SbvrWeight, linear_reference, quantize, quantize_experts  # noqa: F401
