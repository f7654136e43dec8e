"""Load the compiled library with ctypes and call its symbols.

Symbols follow ``lowbit_<op>_b<bits>_<dtype>`` (see ``csrc/lowbit.h``); :data:`SIGNATURES`
is the one table of argument types per op, so no per-dtype ladders are written by hand.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings
from pathlib import Path

import torch

from . import build as _build

ABI_VERSION = 15
_P, _I64, _I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int

#: op -> ctypes argument types (every entry returns a cudaError_t as int): the library-wide entries here,
#: each format's kernel module adds its own (:func:`register_signatures`) when it is imported.
SIGNATURES: dict[str, list] = {
    "read_bw": [_P, _I64, _P, ctypes.c_int, ctypes.c_int, _P],
    "copy_bw": [_P, _P, _I64, ctypes.c_int, _P],
    # expert_offsets int64 [E + 1] (device), E, rows, stream: a device-side assertion unless valid
    "check_expert_offsets": [_P, _I, _I64, _P],
}


def register_signatures(entries: dict[str, list]) -> None:
    """Add a kernel family's symbol signatures (an op registered twice must keep its signature)."""
    for op, argtypes in entries.items():
        if op in SIGNATURES and SIGNATURES[op] != list(argtypes):
            raise ValueError(f"lowbit: symbol family {op!r} registered twice with different signatures")
        SIGNATURES[op] = list(argtypes)


DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class LibraryUnavailable(RuntimeError):
    pass


_lock = threading.Lock()
_loaded: dict[str, "Library"] = {}
_failed: dict[str, str] = {}


class Library:
    def __init__(self, path: Path):
        self.path = path
        self._dll = ctypes.CDLL(str(path))
        self._dll.lowbit_error_string.restype = ctypes.c_char_p
        self._dll.lowbit_error_string.argtypes = [ctypes.c_int]
        version = self._dll.lowbit_abi_version()
        if version != ABI_VERSION:
            raise LibraryUnavailable(f"{path}: ABI version {version}, expected {ABI_VERSION}; rebuild it")
        self._fns: dict[str, ctypes._CFuncPtr] = {}

    def symbol(self, op: str, **params) -> ctypes._CFuncPtr:
        name = "lowbit_" + op + "".join(f"_{_fmt(k, v)}" for k, v in params.items())
        fn = self._fns.get(name)
        if fn is None:
            try:
                fn = getattr(self._dll, name)
            except AttributeError:
                raise LibraryUnavailable(f"{self.path} has no symbol {name}") from None
            fn.argtypes = SIGNATURES[op]
            fn.restype = ctypes.c_int
            self._fns[name] = fn
        return fn

    def raw_symbol(self, op: str, **params) -> ctypes._CFuncPtr:
        """A fresh function pointer without argtypes (callers pass ctypes objects; saves the
        per-argument conversion on the eager hot path). Checks that the symbol exists."""
        self.symbol(op, **params)
        fn = self._dll["lowbit_" + op + "".join(f"_{_fmt(k, v)}" for k, v in params.items())]
        fn.restype = ctypes.c_int
        return fn

    def call(self, op: str, args: list, **params) -> None:
        err = self.symbol(op, **params)(*args)
        if err != 0:
            self.raise_error(f"{op}{params}", err)

    def raise_error(self, what: str, err: int) -> None:
        # the failed CUDA call's error is still the runtime's last error: cleared here, so that the next launch (ours
        # or PyTorch's, after a caller handled this exception) does not report it as its own
        self._dll.lowbit_clear_error()
        msg = self._dll.lowbit_error_string(err).decode()
        raise RuntimeError(f"lowbit CUDA kernel {what} failed: {msg} (cudaError {err})")


def _fmt(key: str, value) -> str:
    if key == "bits":
        return f"b{value}"
    if key == "dtype":
        return DTYPE_NAMES[value]
    if key == "m":
        return f"m{value}"
    if key == "nt":
        return f"t{value}"
    if key in ("rows", "r"):
        return f"r{value}"
    if key == "unroll":
        return f"u{value}"
    if key == "prefetch":
        return f"p{value}"
    if key in ("d", "g", "w"):  # decode attention: head dim, query heads per KV head, warps per CTA
        return f"{key}{value}"
    return str(value)


def _device_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return _build.arch_for_capability(major, minor)


def _locate_or_build(arch: str) -> Path:
    override = os.environ.get("LOWBIT_LIBRARY")
    if override:
        return Path(override)
    nvcc = _build.find_nvcc()
    if nvcc is None:
        raise LibraryUnavailable("no nvcc found to build lowbit's CUDA library (set LOWBIT_LIBRARY to a prebuilt one)")
    for archs in ((arch,), _build.DEFAULT_ARCHS):
        if arch in archs:
            p = _build.library_path(archs, nvcc)
            if p.exists():
                return p
    print(f"lowbit: building the CUDA library for {arch} (once; cached in {_build.cache_dir()}) ...", file=sys.stderr,
          flush=True)
    return _build.build((arch,), progress=lambda name, done, total: print(f"lowbit: [{done}/{total}] {name}",
                                                                         file=sys.stderr, flush=True))


def get_library(device: torch.device | None = None) -> Library:
    """The library for ``device``'s arch, built on first use. Raises LibraryUnavailable."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    arch = _device_arch(device)
    with _lock:
        if arch in _loaded:
            return _loaded[arch]
        if arch in _failed:
            raise LibraryUnavailable(_failed[arch])
        try:
            lib = Library(_locate_or_build(arch))
        except (OSError, _build.BuildError, LibraryUnavailable) as e:
            _failed[arch] = f"lowbit CUDA library unavailable for {arch}: {e}"
            raise LibraryUnavailable(_failed[arch]) from e
        _loaded[arch] = lib
        return lib


_warned = False


def library_or_none(device: torch.device) -> "Library | None":
    """The compiled library, or None (warning once) so an op falls back to a slower correct path."""
    global _warned
    try:
        return get_library(device)
    except LibraryUnavailable as e:
        if not _warned:
            warnings.warn(f"{e}; lowbit ops on CUDA fall back to the PyTorch reference / cuBLAS (slow)", stacklevel=3)
            _warned = True
        return None


def ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


def stream_of(device: torch.device) -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
