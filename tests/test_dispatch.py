"""The dispatcher's decisions (no GPU needed): path rule, crossover file, forced paths, the GEMM's
launch rules, and the kbit_gemm op's CPU reference and argument checks."""

import json

import pytest
import torch

import lowbit
from lowbit import dispatch, ops
from lowbit.kernels import cuda_kbit

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.mark.parametrize("m, gemm_max, want", [
    (1, 64, "gemv"), (4, 64, "gemv"), (5, 64, "gemv"), (8, 64, "gemv"),
    (9, 64, "gemm"), (64, 64, "gemm"), (65, 64, "dequant_matmul"), (2048, 64, "dequant_matmul"),
    (9, 8, "dequant_matmul"), (300, 512, "gemm"),
])
def test_path_rule(m, gemm_max, want):
    assert dispatch.choose_path(True, F16, m, gemm_max) == want
    assert dispatch.choose_path(True, BF16, m, gemm_max) == want


@pytest.mark.parametrize("is_cuda, dtype, m", [(False, F16, 1), (False, F16, 32), (True, F32, 1), (True, F32, 32),
                                               (True, F16, 0)])
def test_path_rule_reference_or_cublas_where_kernels_cannot_run(is_cuda, dtype, m):
    assert dispatch.choose_path(is_cuda, dtype, m, 256) == "dequant_matmul"
    for forced in dispatch.PATHS:  # a forced kernel path never applies where the kernel cannot run
        assert dispatch.choose_path(is_cuda, dtype, m, 256, forced) == "dequant_matmul"


def test_forced_path():
    assert dispatch.choose_path(True, F16, 2, 64, "gemm") == "gemm"
    assert dispatch.choose_path(True, F16, 2, 64, "dequant_matmul") == "dequant_matmul"
    assert dispatch.choose_path(True, F16, 500, 64, "gemm") == "gemm"
    assert dispatch.choose_path(True, F16, 9, 64, "gemv") == "gemm"  # the GEMV takes <= 8 rows: the rule
    with dispatch.forced_path("gemm"):
        assert dispatch._forced == "gemm"
        with dispatch.forced_path(None):
            assert dispatch._forced is None
        assert dispatch._forced == "gemm"
    assert dispatch._forced is None
    with pytest.raises(ValueError, match="path must be"), dispatch.forced_path("cublas"):
        pass


def test_cpu_calls_take_the_reference_path(gen):
    x = torch.randn(32, 96, generator=gen)
    assert dispatch.kbit_path(x) == "dequant_matmul"
    with dispatch.forced_path("gemm"):
        assert dispatch.kbit_path(x.half()) == "dequant_matmul"


def test_crossover_file(tmp_path):
    shipped = dispatch.load_crossovers()
    assert "NVIDIA H100 80GB HBM3" in shipped
    for classes in shipped.values():
        assert classes[-1][0] is None and all(m >= dispatch.GEMV_MAX_M for _, m in classes)
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"version": 1, "gpus": {"GPU A": {"gemm_max_m": [[1000, 16], [None, 128]]}}}))
    classes = dispatch.load_crossovers(p)["GPU A"]
    assert classes == [(1000, 16), (None, 128)]
    assert [dispatch.class_max_m(classes, w) for w in (10, 1000, 1001, None)] == [16, 16, 128, 128]
    assert dispatch.load_crossovers(tmp_path / "missing.json") == {}
    for bad in ({"version": 2, "gpus": {}},
                {"version": 1, "gpus": {"G": {"gemm_max_m": [[None, 4]]}}},  # below the GEMV's rows
                {"version": 1, "gpus": {"G": {"gemm_max_m": [[None, "64"]]}}},
                {"version": 1, "gpus": {"G": {"gemm_max_m": [[100, 64]]}}},  # last class not open-ended
                {"version": 1, "gpus": {"G": {"gemm_max_m": [[100, 64], [50, 32], [None, 16]]}}},  # not rising
                {"version": 1, "gpus": {"G": {"gemm_max_m": []}}}, {"version": 1, "gpus": {"G": 64}}):
        p.write_text(json.dumps(bad))
        with pytest.raises(ValueError):
            dispatch.load_crossovers(p)


def test_gemv_instance():
    assert [cuda_kbit.gemv_instance(m) for m in range(1, 9)] == [1, 2, 3, 4, 8, 8, 8, 8]
    for m in (0, 9):
        with pytest.raises(ValueError):
            cuda_kbit.gemv_instance(m)


def test_gemm_token_tiles_and_splits():
    assert [cuda_kbit.gemm_token_tiles(m) for m in (9, 16, 17, 32, 33, 64, 65, 2048)] == [2, 2, 4, 4, 8, 8, 8, 8]
    assert cuda_kbit.gemm_splits(224, 1, 32, 132) == 1  # row blocks fill the GPU
    assert cuda_kbit.gemm_splits(32, 1, 16, 264) == 8  # 4096x4096: 32 row blocks, 8-way split-K
    assert cuda_kbit.gemm_splits(1, 1, 3, 264) == 1  # a split keeps >= 2 groups
    assert cuda_kbit.gemm_splits(1, 1, 64, 264) == 32


def test_gemm_op_cpu_is_reference_and_checks(gen):
    q = lowbit.quantize_kbit(torch.randn(40, 320, generator=gen), bits=3)
    qw, qa = q.tiled()
    x = torch.randn(20, 320, generator=gen).half()
    bias = torch.randn(40, generator=gen).half()
    y = ops.kbit_gemm(x, qw, qa, q.codebook, q.scale, 3, 40, 320, bias)
    assert torch.equal(y, ops.tiled_linear_reference(x, qw, qa, q.codebook, q.scale, 3, 40, 320, bias))
    with pytest.raises(TypeError):
        ops.kbit_gemm(x.float(), qw, qa, q.codebook, q.scale, 3, 40, 320)
    with pytest.raises(ValueError, match="K_in"):
        ops.kbit_gemm(x[:, :288].contiguous(), qw, qa, q.codebook, q.scale, 3, 40, 320)
    with pytest.raises(ValueError, match="bias"):
        ops.kbit_gemm(x, qw, qa, q.codebook, q.scale, 3, 40, 320, bias[:39])
    torch.library.opcheck(torch.ops.lowbit.kbit_gemm.default, (x, qw, qa, q.codebook, q.scale, 3, 40, 320))


def test_gemv_op_takes_up_to_8_rows(gen):
    q = lowbit.quantize_kbit(torch.randn(24, 96, generator=gen), bits=4)
    qw, qa = q.tiled()
    for m in (1, 8):
        x = torch.randn(m, 96, generator=gen).half()
        assert ops.kbit_gemv(x, qw, qa, q.codebook, q.scale, 4, 24, 96).shape == (m, 24)
    with pytest.raises(ValueError, match="1..8"):
        ops.kbit_gemv(torch.randn(9, 96, generator=gen).half(), qw, qa, q.codebook, q.scale, 4, 24, 96)


def test_crossover_from_measurements():
    from lowbit.bench import crossover

    assert crossover.crossover_m({16: (1, 2), 32: (2, 2), 64: (3, 2), 128: (1, 2)}) == 32  # first loss ends it
    assert crossover.crossover_m({16: (3, 2)}) == dispatch.GEMV_MAX_M
    assert crossover.derive_classes({16_000_000: 32, 60_000_000: 128, 235_000_000: 128}) == [(16_000_000, 32), (None, 128)]
    assert crossover.derive_classes({4_000_000: 16}) == [(None, 16)]
    with pytest.raises(ValueError):
        crossover.derive_classes({})


def test_crossover_file_written_and_user_file_overrides(tmp_path, monkeypatch):
    from lowbit.bench import crossover

    user = tmp_path / "d.json"
    monkeypatch.setenv("LOWBIT_DISPATCH_FILE", str(user))
    assert dispatch.user_crossover_file() == user
    crossover.save(user, "GPU X", [(1000, 16), (None, 64)])
    crossover.save(user, "NVIDIA H100 80GB HBM3", [(None, 48)])
    table = dispatch.crossover_table()
    assert table["GPU X"] == [(1000, 16), (None, 64)]
    assert table["NVIDIA H100 80GB HBM3"] == [(None, 48)]  # the user's measurement wins over the shipped one
    user.write_text('{"version": 1, "gpus": {"G": {"gemm_max_m": 7}}}')
    with pytest.raises(ValueError):
        crossover.save(user, "GPU Y", [(None, 64)])  # never extends a broken file


def test_tune_cli_has_crossover_flag():
    import argparse

    from lowbit.bench import tune

    p = argparse.ArgumentParser()
    tune.add_parser(p.add_subparsers())
    args = p.parse_args(["tune", "--kbit-crossover", "--shape", "2048x5120"])
    assert args.kbit_crossover and args.shape == ["2048x5120"]


@pytest.mark.parametrize("chunk_rows", [16, 48, 1000])
def test_chunked_dequant_linear_matches_whole(chunk_rows, gen):
    """The dequantize + cuBLAS path decoding W a few tiles at a time (ragged last chunk, N not a
    multiple of 16) gives the whole-weight product; here with the reference decode on CPU."""
    from lowbit.formats import kbit_tiled

    n, k_in = 16 * 7 - 3, 320
    q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=3)
    qw, qa = q.tiled()
    x = torch.randn(5, k_in, generator=gen)
    y = cuda_kbit.chunked_dequant_linear(x, qw, qa, q.codebook, q.scale, 3, n, k_in, chunk_rows,
                                         dequant=kbit_tiled.dequantize)
    ref = ops.tiled_linear_reference(x, qw, qa, q.codebook, q.scale, 3, n, k_in)
    assert y.shape == (5, n) and y.is_contiguous()
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-5)
