"""Modules that put lowbit kernels into models: they own the quantized tensors and call the dispatcher."""

from .experts import KbitMoeExperts, fused_experts_layout
from .linear import KbitLinear

__all__ = ["KbitLinear", "KbitMoeExperts", "fused_experts_layout"]
