"""NVFP4: E2M1 values, one E4M3 scale per 16 elements, one fp32 scale per tensor.

* :mod:`.definition` -- the format in PyTorch (encode / decode, the checkpoint layouts, the W4A4 reference);
* :mod:`.tiled` -- the GPU layout the tensor-core kernels read (kbit's K=4 tiles + per-lane scales);
* :mod:`.weight` -- ``NvFp4Weight``, ``NvFp4Experts``, ``quantize`` and the checkpoint conventions;
* :mod:`.columns` -- the format quantized column by column, for error-compensating calibration (GPTQ).
"""

from . import columns, definition, tiled, weight
from .definition import *  # noqa: F401,F403
from .definition import _MIDPOINTS  # noqa: F401
from .weight import (COMPRESSED_TENSORS_KEYS, MODELOPT_KEYS, NvFp4Experts, NvFp4Weight, dequantize_tiled,  # noqa: F401
                     from_state_dict, from_tiled, linear_reference, quantize, to_state_dict)
