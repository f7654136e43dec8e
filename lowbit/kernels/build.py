"""Build ``csrc/**/*.cu`` into one shared library with nvcc, cached by source hash and GPU arch.

The library exposes a plain C interface (``csrc/lowbit.h``) and never links against torch,
so one build serves every torch version. Build on demand with::

    python -m lowbit build            # the default targets: sm_80, sm_89, sm_90a
    python -m lowbit build --arch sm_90a

The first CUDA call builds for the current GPU only, if no cached build covers it.
Cache: ``$LOWBIT_CACHE_DIR`` or ``~/.cache/lowbit``; file ``liblowbit-<key>.so`` where the key
hashes the sources, flags, nvcc version and arch list. Each ``.cu`` file compiles in its own nvcc
process, one per CPU at a time, into ``objects/`` of the cache, so a rebuild after an edit compiles
only the files that see it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
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


def _translation_unit(src: Path) -> list[Path]:
    """A ``.cu`` file and the lowbit headers it includes, transitively (sorted)."""
    seen, todo = set(), [src]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        for inc in re.findall(r'^\s*#include\s+"([^"]+)"', f.read_text(errors="replace"), flags=re.M):
            todo += [f.parent / inc, CSRC_DIR / inc]
    return sorted(seen)


def _compile_order(srcs: list[Path]) -> list[Path]:
    """Costliest translation units first (bytes with their headers: kbit/gemv.cu is 40 lines, its kernels
    are in tiled/gemv.cuh), so that with one job per file the longest compiles start at once."""
    return sorted(srcs, key=lambda f: -sum(g.stat().st_size for g in _translation_unit(f)))


def _object_path(src: Path, flags: list[str], nvcc_version: str) -> Path:
    """Where a compiled ``.cu`` file is kept: keyed by its translation unit's bytes, the flags and nvcc, so
    that a rebuild after editing one file compiles only the files that see the edit."""
    h = hashlib.sha256()
    for f in _translation_unit(src):
        f = f.resolve()
        h.update((f.relative_to(CSRC_DIR.resolve()).as_posix() if f.is_relative_to(CSRC_DIR.resolve()) else f.name).encode())
        h.update(f.read_bytes())
    h.update(" ".join(flags).encode())
    h.update(nvcc_version.encode())
    return cache_dir() / "objects" / f"{src.stem}-{h.hexdigest()[:16]}.o"


#: compiled objects not used by any build for this long are deleted (each edit of a file leaves its old one)
OBJECT_MAX_AGE_S = 14 * 24 * 3600


def _prune_objects(keep: set[Path]) -> None:
    now = time.time()
    for f in (cache_dir() / "objects").glob("*.o"):
        try:
            if f not in keep and now - f.stat().st_mtime > OBJECT_MAX_AGE_S:
                f.unlink()
        except OSError:  # another build removed or is using it
            pass


def build(archs: tuple[str, ...] = DEFAULT_ARCHS, *, force: bool = False, verbose: bool = False,
          jobs: int | None = None, progress=None) -> Path:
    """Compile the library for ``archs`` (cached); return its path. Raises BuildError.

    Each ``.cu`` file compiles to an object in its own nvcc process (``jobs`` at once, default: one per
    CPU), kept in the cache for the next build (``force``: compile all again), then one link;
    ``progress(name, done, total)`` is called as each file finishes."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found (put it on PATH or set NVCC / CUDA_HOME) — needed to build lowbit's CUDA library")
    archs = tuple(archs)
    out = library_path(archs, nvcc)
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = [*BASE_FLAGS, *(gencode(a) for a in archs), f"-I{CSRC_DIR}"]
    if verbose:
        flags += ["-Xptxas", "-v"]
    srcs = _compile_order(sources())
    jobs = max(1, min(len(srcs), jobs or os.cpu_count() or 1))
    compile_flags = [f for f in flags if f != "-shared"]
    version = _nvcc_version(nvcc)
    reports = []
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        def compile_one(src: Path):
            obj = _object_path(src, compile_flags, version)
            if obj.exists() and not force and not verbose:
                obj.touch()  # in use: not pruned
                return src, obj, ""
            obj.parent.mkdir(parents=True, exist_ok=True)
            tmp_obj = Path(tmp) / obj.name
            cmd = [nvcc, *compile_flags, "-c", str(src), "-o", str(tmp_obj)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"nvcc failed ({proc.returncode}) on {src.name}:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
            os.replace(tmp_obj, obj)
            return src, obj, proc.stdout + proc.stderr

        objs = []
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(compile_one, src) for src in srcs]
            try:
                for done, fut in enumerate(as_completed(futures), 1):
                    src, obj, report = fut.result()
                    objs.append(obj)
                    reports.append(report)
                    if progress is not None:
                        progress(src.relative_to(CSRC_DIR).as_posix(), done, len(srcs))
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        tmp_out = Path(tmp) / out.name
        cmd = [nvcc, *flags, *map(str, sorted(objs)), "-o", str(tmp_out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"linking failed ({proc.returncode}):\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        if verbose:
            print("".join(reports) + proc.stdout + proc.stderr)
        os.replace(tmp_out, out)  # atomic: concurrent builders never see a half-written file
    _prune_objects(set(objs))
    return out
