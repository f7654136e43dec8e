"""transformers integration: model sources, the static-cache decode loop, ``lowbit generate``.

Needs the ``lowbit[hf]`` extra; the rest of lowbit does not import this package.
"""
