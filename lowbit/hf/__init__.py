"""transformers integration: model sources, the static-cache decode loop, ``lowbit generate``, and
lowbit as a transformers quantizer (``from_pretrained(..., quantization_config=lowbit.hf.LowbitConfig(...))``,
:mod:`lowbit.hf.quantizer`).

Needs the ``lowbit[hf]`` extra; the rest of lowbit does not import this package.
"""


def __getattr__(name: str):
    # LowbitConfig / LowbitHfQuantizer: importing the quantizer module registers "lowbit" with transformers
    if name in ("LowbitConfig", "LowbitHfQuantizer"):
        from . import quantizer

        return getattr(quantizer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LowbitConfig", "LowbitHfQuantizer"]
