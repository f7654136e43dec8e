"""Modules that put lowbit kernels into models: they own the quantized tensors and call the dispatcher."""

from .experts import KbitMoeExperts, fused_experts_layout
from .fused import FusedKbitLinear, KbitLinearPart, fuse_linears
from .linear import KbitLinear

__all__ = ["FusedKbitLinear", "KbitLinear", "KbitLinearPart", "KbitMoeExperts", "fuse_linears", "fused_experts_layout"]
