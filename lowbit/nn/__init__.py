"""Modules that put lowbit kernels into models: they own the quantized tensors and call the dispatcher."""

from .experts import KbitMoeExperts, fused_experts_layout
from .fused import FusedKbitLinear, KbitLinearPart, fuse_linears
from .linear import KbitLinear
from .nvfp4 import NvFp4Linear

__all__ = ["FusedKbitLinear", "KbitLinear", "KbitLinearPart", "KbitMoeExperts", "NvFp4Linear", "fuse_linears",
           "fused_experts_layout"]
