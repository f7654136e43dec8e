"""The CUDA library builds from a clean checkout with nvcc and exports every symbol the op layer needs.
Runs on machines without a GPU (CI); skipped only without nvcc.

It builds for sm_90a, the arch the kernels are tuned and measured on: a clean build of all three
default archs takes ~15 minutes of a 2-core CI machine, and sm_80 / sm_89 compile the same sources
(the only arch-dependent code is the programmatic-launch instructions, behind ``__CUDA_ARCH__ >= 900``).
``LOWBIT_TEST_BUILD_ARCHS=default`` (or a comma-separated list) builds those instead."""

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lowbit.kernels import build
from lowbit.kernels.library import ABI_VERSION, DTYPE_NAMES, SIGNATURES

NVCC = build.find_nvcc()
_ARCHS_ENV = os.environ.get("LOWBIT_TEST_BUILD_ARCHS", "sm_90a")
ARCHS = build.DEFAULT_ARCHS if _ARCHS_ENV == "default" else tuple(a.strip() for a in _ARCHS_ENV.split(","))
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found on this machine: cannot build the CUDA library")


@pytest.fixture(scope="module")
def built_library(tmp_path_factory):
    """`python -m lowbit build` into an empty cache: a clean build, as a user types it."""
    cache = tmp_path_factory.mktemp("lowbit-cache")
    env = {**os.environ, "LOWBIT_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-m", "lowbit", "build", "--arch", ",".join(ARCHS)], capture_output=True, text=True, env=env,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr
    n_sources = len(build.sources())
    assert f"[{n_sources}/{n_sources}]" in proc.stderr  # progress, one line per file
    path = proc.stdout.strip().splitlines()[-1]
    assert path.startswith(str(cache)) and path.endswith(".so")
    return path


@needs_nvcc
def test_library_builds_and_exports_symbols(built_library):
    lib = ctypes.CDLL(built_library)  # static cudart: loads without a GPU driver
    assert lib.lowbit_abi_version() == ABI_VERSION
    assert set(SIGNATURES) == {"kbit_dequant", "kbit_tiled_dequant", "read_bw", "copy_bw", "kbit_gemv", "kbit_gemv_occupancy",
                               "kbit_gemv_swiglu_pairs", "kbit_routed_act_fits", "nvfp4_gemv_swiglu_pairs",
                               "kbit_gemm", "kbit_gemm_occupancy", "kbit_split_gemv", "kbit_split_gemv_occupancy",
                               "kbit_routed_gemv", "kbit_bulk_gemv", "kbit_bulk_gemv_ring", "kbit_grouped_gemm", "kbit_grouped_gemm_occupancy", "nvfp4_gemm", "nvfp4_gemm_occupancy",
                               "nvfp4_grouped_gemm", "nvfp4_grouped_gemm_occupancy", "nvfp4_routed_gemv",
                               "nvfp4_routed_act_fits",
                               "nvfp4_gemv", "nvfp4_gemv_occupancy", "nvfp4_split_gemv", "nvfp4_split_gemv_occupancy",
                               "nvfp4_plain_gemv", "nvfp4_w4a4_gemv", "nvfp4_quantize", "nvfp4_dequant", "dense_gemv", "dense_gemv_scalar",
                               "check_expert_offsets", "sbvr_encode_x", "sbvr_gemv", "sbvr_grouped_gemv", "sbvr_dequant",
                               "sbvr_lookup_gemv", "decode_attention", "decode_attention_occupancy",
                               "decode_attention_mma", "decode_attention_mma_occupancy", "moe_router"}
    assert hasattr(lib, "lowbit_read_bw") and hasattr(lib, "lowbit_copy_bw") and hasattr(lib, "lowbit_nvfp4_w4a4_gemv")
    assert hasattr(lib, "lowbit_check_expert_offsets") and hasattr(lib, "lowbit_clear_error")
    assert hasattr(lib, "lowbit_nvfp4_gemv_swiglu_pairs") and hasattr(lib, "lowbit_nvfp4_routed_act_fits")
    from lowbit.kernels.tiled import GEMM_INSTANCES, GEMM_TOKEN_TILES
    from lowbit.tuning import ROWS_UNROLL

    from lowbit.kernels.attention import MMA_HEAD_DIMS
    from lowbit.ops import DECODE_ATTENTION_SHAPES

    for dt in ("fp16", "bf16"):
        assert all(hasattr(lib, f"lowbit_decode_attention_{dt}_d{d}_g{g}") for d, g in DECODE_ATTENTION_SHAPES)
        assert all(hasattr(lib, f"lowbit_decode_attention_occupancy_{dt}_d{d}_g{g}") for d, g in DECODE_ATTENTION_SHAPES)
        for d in MMA_HEAD_DIMS:
            assert all(hasattr(lib, f"lowbit_decode_attention_mma{o}_{dt}_d{d}_w{w}") for o in ("", "_occupancy") for w in (4, 8))
        assert hasattr(lib, f"lowbit_sbvr_encode_x_{dt}") and hasattr(lib, f"lowbit_moe_router_{dt}")
        assert all(hasattr(lib, f"lowbit_kbit_routed_gemv_b{bits}_{dt}") for bits in (2, 3, 4, 5))
        for ns in (2, 3, 4, 5, 6):
            assert hasattr(lib, f"lowbit_sbvr_dequant_b{ns}_{dt}") and hasattr(lib, f"lowbit_sbvr_grouped_gemv_b{ns}_{dt}")
            assert all(hasattr(lib, f"lowbit_sbvr_gemv_b{ns}_{dt}_m{m}") for m in range(1, 9))
        assert all(hasattr(lib, f"lowbit_sbvr_lookup_gemv_{dt}_m{m}") for m in range(1, 9))
        for nt, r in GEMM_INSTANCES:
            assert hasattr(lib, f"lowbit_nvfp4_gemm_{dt}_t{nt}_r{r}")
            assert hasattr(lib, f"lowbit_nvfp4_gemm_occupancy_{dt}_t{nt}_r{r}")
        for nt in GEMM_TOKEN_TILES:
            assert hasattr(lib, f"lowbit_nvfp4_grouped_gemm_{dt}_t{nt}")
            assert hasattr(lib, f"lowbit_nvfp4_grouped_gemm_occupancy_{dt}_t{nt}")
        assert hasattr(lib, f"lowbit_nvfp4_split_gemv_{dt}") and hasattr(lib, f"lowbit_nvfp4_split_gemv_occupancy_{dt}")
        assert hasattr(lib, f"lowbit_nvfp4_routed_gemv_{dt}")
        assert hasattr(lib, f"lowbit_nvfp4_plain_gemv_{dt}") and hasattr(lib, f"lowbit_nvfp4_quantize_{dt}")
        assert hasattr(lib, f"lowbit_nvfp4_dequant_{dt}")
        for m in (1, 2, 3, 4, 8):
            assert hasattr(lib, f"lowbit_nvfp4_gemv_{dt}_m{m}") and hasattr(lib, f"lowbit_nvfp4_gemv_occupancy_{dt}_m{m}")
        for m in (1, 2, 3, 4):
            assert hasattr(lib, f"lowbit_dense_gemv_scalar_{dt}_m{m}")
            for rows, unroll in ROWS_UNROLL:
                for p in (0, 1):
                    assert hasattr(lib, f"lowbit_dense_gemv_{dt}_m{m}_r{rows}_u{unroll}_p{p}")
    for bits in (2, 3, 4, 5):
        for dt in DTYPE_NAMES.values():
            assert hasattr(lib, f"lowbit_kbit_dequant_b{bits}_{dt}")
        assert hasattr(lib, f"lowbit_kbit_bulk_gemv_ring_b{bits}")
        assert hasattr(lib, f"lowbit_kbit_gemv_swiglu_pairs_b{bits}") and hasattr(lib, f"lowbit_kbit_routed_act_fits_b{bits}")
        for dt in ("fp16", "bf16"):
            assert hasattr(lib, f"lowbit_kbit_bulk_gemv_b{bits}_{dt}")
            assert hasattr(lib, f"lowbit_kbit_split_gemv_b{bits}_{dt}")
            assert hasattr(lib, f"lowbit_kbit_tiled_dequant_b{bits}_{dt}")
            assert hasattr(lib, f"lowbit_kbit_split_gemv_occupancy_b{bits}_{dt}")
            for m in (1, 2, 3, 4, 8):  # tiled.gemv_instance
                assert hasattr(lib, f"lowbit_kbit_gemv_b{bits}_{dt}_m{m}")
                assert hasattr(lib, f"lowbit_kbit_gemv_occupancy_b{bits}_{dt}_m{m}")
            for nt, r in GEMM_INSTANCES:
                assert hasattr(lib, f"lowbit_kbit_gemm_b{bits}_{dt}_t{nt}_r{r}")
                assert hasattr(lib, f"lowbit_kbit_gemm_occupancy_b{bits}_{dt}_t{nt}_r{r}")
            for nt in GEMM_TOKEN_TILES:
                assert hasattr(lib, f"lowbit_kbit_grouped_gemm_b{bits}_{dt}_t{nt}")
                assert hasattr(lib, f"lowbit_kbit_grouped_gemm_occupancy_b{bits}_{dt}_t{nt}")


@needs_nvcc
def test_library_contains_the_archs_asked_for(built_library):
    every = set(build.DEFAULT_ARCHS) | set(ARCHS)
    cuobjdump = shutil.which("cuobjdump") or str(Path(NVCC).resolve().with_name("cuobjdump"))
    if Path(cuobjdump).is_file():
        listing = subprocess.run([cuobjdump, "--list-elf", built_library], capture_output=True, text=True).stdout
        found = {a for a in every if f".{a}." in listing}
    else:  # no cuobjdump here: each cubin carries the link options it was built with
        blob = Path(built_library).read_bytes()
        found = {a for a in every if f"-arch {a} ".encode() in blob}
    assert found == set(ARCHS)


@needs_nvcc
def test_build_is_cached(built_library, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(Path(built_library).parent))
    assert str(build.build(ARCHS)) == built_library  # no rebuild: same key, same file


def test_build_error_without_nvcc(monkeypatch):
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    with pytest.raises(build.BuildError, match="nvcc not found"):
        build.build(("sm_90a",))


def test_arch_names():
    assert build.arch_for_capability(9, 0) == "sm_90a"
    assert build.arch_for_capability(8, 9) == "sm_89"
    assert build.gencode("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    with pytest.raises(ValueError, match="arch must look like"):
        build.gencode("hopper")


@needs_nvcc
def test_key_changes_with_arch():
    assert build.library_key(("sm_80",), NVCC) != build.library_key(("sm_90a",), NVCC)


def _tiny_csrc(root: Path) -> Path:
    src = root / "csrc"
    src.mkdir()
    (src / "common.cuh").write_text("#pragma once\nconstexpr int kValue = 1;\n")
    (src / "a.cu").write_text('#include "common.cuh"\nextern "C" int lowbit_a() { return kValue; }\n')
    (src / "b.cu").write_text('extern "C" int lowbit_b() { return 2; }\n')
    return src


@needs_nvcc
def test_rebuild_compiles_only_the_files_an_edit_reaches(tmp_path, monkeypatch):
    """Each .cu file is compiled into the cache's objects/; editing a header recompiles the files that
    include it and nothing else, and the new library has the edit."""
    src = _tiny_csrc(tmp_path)
    monkeypatch.setattr(build, "CSRC_DIR", src)
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path / "cache"))
    compiled, real_run = [], subprocess.run

    def spy(cmd, *args, **kwargs):
        if "-c" in cmd:
            compiled.append(Path(cmd[cmd.index("-c") + 1]).name)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(build.subprocess, "run", spy)
    done = []
    first = build.build(("sm_90a",), progress=lambda name, i, n: done.append((name, i, n)))
    assert sorted(compiled) == ["a.cu", "b.cu"]
    assert sorted(d[0] for d in done) == ["a.cu", "b.cu"] and sorted(d[1:] for d in done) == [(1, 2), (2, 2)]
    compiled.clear()
    (src / "common.cuh").write_text("#pragma once\nconstexpr int kValue = 11;\n")
    second = build.build(("sm_90a",))
    assert compiled == ["a.cu"] and second != first
    lib = ctypes.CDLL(str(second))
    assert lib.lowbit_a() == 11 and lib.lowbit_b() == 2
    compiled.clear()
    assert build.build(("sm_90a",)) == second and compiled == []  # cached library: nothing compiled


@needs_nvcc
def test_build_error_names_the_file(tmp_path, monkeypatch):
    src = _tiny_csrc(tmp_path)
    (src / "b.cu").write_text('extern "C" int lowbit_b() { return undefined_name; }\n')
    monkeypatch.setattr(build, "CSRC_DIR", src)
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(build.BuildError, match=r"nvcc failed \(\d+\) on b\.cu"):
        build.build(("sm_90a",))
