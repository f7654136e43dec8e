"""Weight formats. Each module is the reference (single source of truth) for one format."""

from . import e4m4, kbit

__all__ = ["e4m4", "kbit"]
