"""Compiled CUDA kernels: build (nvcc -> one shared library), load (ctypes), call."""
