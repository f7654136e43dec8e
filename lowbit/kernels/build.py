"""Build ``csrc/**/*.cu`` into one shared library with nvcc, cached by source hash and GPU arch.

The library exposes a plain C interface (``csrc/lowbit.h``) and never links against torch,
so one build serves every torch version. Build on demand with::

    python -m lowbit build            # the default targets: sm_80, sm_89, sm_90a
    python -m lowbit build --arch sm_90a

The first CUDA call builds for the current GPU only, if no cached build covers it.
Cache: ``$LOWBIT_CACHE_DIR`` or ``~/.cache/lowbit``; file ``liblowbit-<key>.so`` where the key
hashes the sources, flags, nvcc version and arch list.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

def _find_csrc() -> Path:
    """The CUDA sources: $LOWBIT_CSRC_DIR, else the installed package's ``lowbit/_csrc`` (a wheel),
    else the checkout's ``csrc/`` (an editable install)."""
    env = os.environ.get("LOWBIT_CSRC_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[1]
    for cand in (here / "_csrc", here.parent / "csrc"):
        if any(cand.glob("*.cu")):
            return cand
    return here.parent / "csrc"


CSRC_DIR = _find_csrc()
DEFAULT_ARCHS = ("sm_80", "sm_89", "sm_90a")
BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "--threads", "0")


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("LOWBIT_CACHE_DIR", Path.home() / ".cache" / "lowbit"))


def find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").is_file():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return None


def arch_for_capability(major: int, minor: int) -> str:
    """Compute capability -> our arch name (Hopper gets the 'a' target for wgmma/setmaxnreg)."""
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def gencode(arch: str) -> str:
    num = arch.removeprefix("sm_")
    if not num[:2].isdigit():
        raise ValueError(f"arch must look like 'sm_90a' or 'sm_89', got {arch!r}")
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def sources() -> list[Path]:
    """Every translation unit: ``csrc/*.cu`` (shared) and each folder's (``tiled/`` holds headers only)."""
    srcs = sorted(CSRC_DIR.rglob("*.cu"))
    if not srcs:
        raise BuildError(f"no CUDA sources found in {CSRC_DIR} (set LOWBIT_CSRC_DIR to a lowbit checkout's csrc/)")
    return srcs


def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout


def library_key(archs: tuple[str, ...], nvcc: str) -> str:
    h = hashlib.sha256()
    for f in sorted(CSRC_DIR.rglob("*")):
        if f.suffix in (".cu", ".cuh", ".h"):
            h.update(f.relative_to(CSRC_DIR).as_posix().encode())
            h.update(f.read_bytes())
    h.update(" ".join(BASE_FLAGS).encode())
    h.update(",".join(archs).encode())
    h.update(_nvcc_version(nvcc).encode())
    return h.hexdigest()[:16]


def library_path(archs: tuple[str, ...], nvcc: str) -> Path:
    return cache_dir() / f"liblowbit-{library_key(archs, nvcc)}.so"


def build(archs: tuple[str, ...] = DEFAULT_ARCHS, *, force: bool = False, verbose: bool = False) -> Path:
    """Compile the library for ``archs`` (cached); return its path. Raises BuildError."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found (put it on PATH or set NVCC / CUDA_HOME) — needed to build lowbit's CUDA library")
    archs = tuple(archs)
    out = library_path(archs, nvcc)
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, *BASE_FLAGS, *(gencode(a) for a in archs), f"-I{CSRC_DIR}"]
    if verbose:
        cmd += ["-Xptxas", "-v"]
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / out.name
        cmd += [*map(str, sources()), "-o", str(tmp_out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"nvcc failed ({proc.returncode}):\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        if verbose:
            print(proc.stdout + proc.stderr)
        os.replace(tmp_out, out)  # atomic: concurrent builders never see a half-written file
    return out
