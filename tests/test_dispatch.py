"""The dispatcher's decisions (no GPU needed): path rule, crossover file, forced paths, the GEMM's
launch rules, and the kbit_gemm op's CPU reference and argument checks."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit import dispatch, ops
from lowbit.kernels import picks, tiled

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
    assert [tiled.gemv_instance(m) for m in range(1, 9)] == [1, 2, 3, 4, 8, 8, 8, 8]
    for m in (0, 9):
        with pytest.raises(ValueError):
            tiled.gemv_instance(m)


def test_gemm_token_tiles_and_splits():
    assert [tiled.gemm_token_tiles(m) for m in (9, 16, 17, 32, 33, 64, 65, 2048)] == [2, 2, 4, 4, 8, 8, 8, 8]
    assert tiled.gemm_splits(224, 1, 32, 132, 2) == 1  # row blocks fill the GPU
    assert tiled.gemm_splits(32, 1, 16, 132, 2) == 4  # 4096x4096: one CTA per SM (4 groups each), not 8-way at two
    assert tiled.gemm_splits(80, 1, 8, 132, 2) == 1  # 2048x10240: 80 CTAs rather than 240 at two per SM
    assert tiled.gemm_splits(1, 1, 3, 132) == 1  # a split keeps >= 2 groups
    assert tiled.gemm_splits(1, 1, 64, 132, 2) == 32
    assert tiled.gemm_splits(112, 1, 32, 132) == 1  # 85% of one wave: not two waves at 85%
    assert tiled.gemm_splits(32, 1, 32, 132) == 4  # 128 of 132
    # 8192x8192: one per SM splits K and leaves 16 groups per CTA, so two per SM where the instance fits them
    assert tiled.gemm_splits(64, 1, 32, 132, 2) == 4
    assert tiled.gemm_splits(64, 1, 32, 132, 1) == 2
    assert tiled.gemm_splits(112, 1, 16, 132, 2) == 1  # 4096x14336: unsplit at one per SM stays unsplit


@settings(max_examples=300, deadline=None)
@given(row_blocks=st.integers(1, 600), chunks=st.integers(1, 40), groups=st.integers(1, 400),
       sms=st.integers(1, 200), per_sm=st.integers(1, 2))
def test_gemm_splits_bounds(row_blocks, chunks, groups, sms, per_sm):
    s = tiled.gemm_splits(row_blocks, chunks, groups, sms, per_sm)
    assert 1 <= s <= max(1, groups // 2)  # a split keeps >= 2 groups of 256 columns (one where K has fewer)
    # one wave of CTAs at most (per_sm of them per SM), unless the rows alone need more
    assert s == 1 or row_blocks * chunks * s <= per_sm * sms
    if per_sm == 1 or tiled.gemm_splits(row_blocks, chunks, groups, sms, 1) == 1:
        assert row_blocks * chunks * s <= max(sms, row_blocks * chunks)  # one per SM
    # two per SM only where one per SM still splits K and leaves each CTA GEMM_TWO_PER_SM_MIN_GROUPS groups or more
    one = tiled.gemm_splits(row_blocks, chunks, groups, sms, 1)
    if s != one:
        assert per_sm == 2 and one > 1 and -(-groups // one) >= tiled.GEMM_TWO_PER_SM_MIN_GROUPS


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
    # the grouped crossover: the smallest mean from which the GEMM side never loses again (the H100's block timings of
    # 2026-11-28, us, (GEMV side, GEMM side)), twice the sweep's largest where it never wins
    h100 = {0.5: (109.0, 143.0), 1.0: (171.9, 211.3), 1.5: (237.1, 234.0), 2.0: (270.6, 265.5), 8.0: (445.8, 343.8)}
    assert crossover.grouped_crossover(h100) == 1.5
    assert crossover.grouped_crossover({**h100, 2.0: (260.0, 265.5)}) == 8.0  # a later loss moves it past that loss
    assert crossover.grouped_crossover({0.5: (1.0, 2.0), 4.0: (1.0, 2.0)}) == 8.0


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




@pytest.mark.parametrize("rows, experts, min_rows, want", [
    (8, 512, 16, "grouped_gemv"), (4096, 512, 16, "grouped_gemv"), (8191, 512, 16, "grouped_gemv"),
    (8192, 512, 16, "grouped_gemm"), (32768, 512, 16, "grouped_gemm"), (3, 1, 4, "grouped_gemv"), (4, 1, 4, "grouped_gemm"),
    (767, 512, 1.5, "grouped_gemv"), (768, 512, 1.5, "grouped_gemm"),
])
def test_grouped_rule(rows, experts, min_rows, want):
    assert dispatch.choose_grouped(rows, experts, min_rows) == want
    assert dispatch.choose_grouped(rows, experts, min_rows, "gemv") == "grouped_gemv"
    assert dispatch.choose_grouped(rows, experts, min_rows, "gemm") == "grouped_gemm"
    assert dispatch.choose_grouped(rows, experts, min_rows, "dequant_matmul") == want  # no grouped dequantize path


def test_grouped_path_cpu_and_fp32_is_reference():
    assert dispatch.grouped_path(torch.zeros(100000, 8, dtype=F16), 4) == "reference"
    with dispatch.forced_path("gemm"):
        assert dispatch.grouped_path(torch.zeros(3, 8), 4) == "reference"


def test_grouped_crossover_in_file(tmp_path):
    """grouped_gemm_min_rows is optional, validated, and kept when the tuner rewrites the GEMM classes."""
    from lowbit.bench import crossover

    path = tmp_path / "x.json"
    path.write_text(json.dumps({"version": 1, "gpus": {"G": {"gemm_max_m": [[None, 64]], "grouped_gemm_min_rows": 12}}}))
    assert dispatch.load_grouped(path) == {"G": 12}
    crossover.save(path, "G", [(1000, 16), (None, 128)])
    assert dispatch.load_grouped(path) == {"G": 12}
    assert dispatch.load_crossovers(path)["G"] == [(1000, 16), (None, 128)]
    for bad in (0, -1.5, True, "16", [2]):
        path.write_text(json.dumps({"version": 1, "gpus": {"G": {"gemm_max_m": [[None, 64]], "grouped_gemm_min_rows": bad}}}))
        with pytest.raises(ValueError, match="grouped_gemm_min_rows"):
            dispatch.load_grouped(path)
    assert dispatch.load_grouped(tmp_path / "missing.json") == {}
    shipped = dispatch.load_grouped()
    assert all(v >= 1 for v in shipped.values())


def test_gemm_tiles_per_warp_rule(monkeypatch):
    sms, f = 132, tiled.gemm_tiles_per_warp
    assert f(2, 1792, 32, 1, sms) == 1  # no two-tile instance at 16 tokens
    assert f(4, 1792, 32, 1, sms) == 2  # 8192x28672
    assert f(8, 512, 112, 1, sms) == 2  # 28672x8192: large, split-K anyway
    assert f(8, 896, 16, 1, sms) == 1   # 4096x14336 M=64: 56 CTAs of 256 rows would need split-K
    assert f(8, 896, 16, 2, sms) == 2   # M=128: 112 CTAs
    assert f(8, 256, 16, 2, sms) == 1   # 4096x4096 M=128
    for nt, r in tiled.GEMM_INSTANCES:
        assert nt in tiled.GEMM_TOKEN_TILES and r in (1, 2)
    monkeypatch.setattr(tiled, "GEMM_TILES_PER_WARP", 2)
    assert f(2, 1792, 32, 1, sms) == 1  # pinned to an instance that exists
    assert f(4, 256, 16, 1, sms) == 2
    monkeypatch.setattr(tiled, "GEMM_TILES_PER_WARP", 1)
    assert f(8, 1792, 32, 1, sms) == 1


def test_grouped_token_tiles():
    assert tiled.grouped_token_tiles(4096, 512) == 2    # 8 rows per expert
    assert tiled.grouped_token_tiles(16384, 512) == 4   # 32
    assert tiled.grouped_token_tiles(32768, 512) == 8   # 64
    assert tiled.grouped_token_tiles(10 ** 6, 512) == 8
    assert tiled.grouped_token_tiles(5, 0) == 2


def test_grouped_gemm_op_cpu_is_reference_and_checks(gen):
    ex = lowbit.quantize_kbit_experts(torch.randn(3, 40, 256, generator=gen), bits=3)
    qw, qa = ex.tiled()
    off = torch.tensor([0, 2, 2, 7])
    x = torch.randn(7, 256, generator=gen)
    y = ops.kbit_grouped_gemm(x, off, qw, qa, ex.codebook, ex.scales, 3, 40, 256)
    assert torch.equal(y, ops.grouped_reference(x, off, qw, qa, ex.codebook, ex.scales, 3, 40, 256))
    with pytest.raises(ValueError, match="expert_offsets"):
        ops.kbit_grouped_gemm(x, off[:3], qw, qa, ex.codebook, ex.scales, 3, 40, 256)
    with pytest.raises(ValueError, match="expert_offsets must rise"):
        ops.kbit_grouped_gemm(x, torch.tensor([0, 5, 2, 7]), qw, qa, ex.codebook, ex.scales, 3, 40, 256)
    with pytest.raises(ValueError, match="K_in"):
        ops.kbit_grouped_gemm(x[:, :128].contiguous(), off, qw, qa, ex.codebook, ex.scales, 3, 40, 256)


def test_grouped_crossover_from_measurements(tmp_path):
    from lowbit.bench import crossover

    f = crossover.grouped_crossover
    assert f({0.5: (10, 12), 1.0: (20, 19), 2.0: (30, 25)}) == 1.0
    assert f({0.5: (10, 9), 1.0: (20, 21), 2.0: (30, 25)}) == 2.0  # a loss above resets the start
    assert f({0.5: (10, 9), 1.0: (20, 19)}) == 0.5
    assert f({0.5: (10, 12), 8.0: (20, 21)}) == 16.0  # never wins: above the sweep
    path = tmp_path / "c.json"
    crossover.save(path, "G", [(None, 64)], 1.5)
    assert dispatch.load_grouped(path) == {"G": 1.5}
    crossover.save(path, "G", [(None, 32)])  # the dense classes alone: the grouped value stays
    assert dispatch.load_grouped(path) == {"G": 1.5}
    assert dispatch.load_crossovers(path)["G"] == [(None, 32)]


def test_nvfp4_plain_gemv_only_where_it_measured_faster():
    wins = dispatch.nvfp4_plain_wins
    assert wins(1, 14336, 4096) and wins(1, 5120, 2048) and wins(1, 2048, 5120)  # K 2048..8192, >= 10M weights
    assert not wins(2, 14336, 4096)  # M > 1: the tiled GEMV
    assert not wins(1, 4096, 14336) and not wins(1, 2048, 10240)  # long K: a partial last round of K steps
    assert not wins(1, 8960, 512) and not wins(1, 4096, 2048) and not wins(1, 1024, 4096)  # short K, or small


def test_x_staging_rule(monkeypatch):
    """The stream-K GEMV stages x (kbit K <= 3) only where every warp has >= STAGE_X_MIN_UNITS units, and never with
    STAGE_X off: 2048x5120 on a 132-CTA grid (2,560 units on 2,112 warps) reads it from global memory, 4096x6144
    (6,144) stages it."""
    warps = 132 * tiled.STREAM_CTA_WARPS
    assert tiled.x_flag(320 * 8, warps) == tiled.FLAG_GLOBAL_X
    assert tiled.x_flag(384 * 16, warps) == 0
    assert tiled.x_flag(2 * warps, warps) == 0 and tiled.x_flag(2 * warps - 1, warps) == tiled.FLAG_GLOBAL_X
    monkeypatch.setattr(tiled, "STAGE_X", False)
    assert tiled.x_flag(384 * 16, warps) == tiled.FLAG_GLOBAL_X


def test_bulk_rule_picks_the_shapes_it_was_measured_faster_on():
    """The bulk-copy GEMV's plain-call rule (lowbit.kernels.tiled.bulk_rule) on 132 SMs: the shapes two H100 sweeps
    had it faster on, and not the ones it lost (benchmarks/journal/2026-11-27_bulk_copies_and_allreduce_prefetch.md;
    shapes as K_in x N)."""
    from lowbit.kernels.tiled import bulk_rule

    faster = {2: [(28672, 8192), (20480, 4096), (4096, 4096), (4096, 6144), (2048, 10240), (5120, 2048)],
              4: [(8192, 29568), (8192, 28672), (28672, 8192), (4096, 4096), (5120, 2048), (2048, 5120)]}
    slower = {2: [(8192, 29568), (8192, 28672), (4096, 28672), (4096, 14336), (14336, 4096), (8192, 10240),
                  (4096, 128256), (2048, 4096)],
              4: [(4096, 28672), (4096, 14336), (14336, 4096), (4096, 6144), (8192, 10240), (20480, 4096),
                  (4096, 128256), (2048, 4096)],
              3: [(8192, 29568), (28672, 8192), (4096, 4096)],
              5: [(8192, 29568), (2048, 10240)]}
    for bits, shapes in faster.items():
        assert all(bulk_rule(bits, n, k, 132) for k, n in shapes), bits
    for bits, shapes in slower.items():
        assert not any(bulk_rule(bits, n, k, 132) for k, n in shapes), bits


def test_bulk_ctas_routes_tokens_by_call_kind(monkeypatch):
    """Which calls the bulk-copy GEMV takes, on a fake 132-SM H200 and a fake library whose ring always fits: plain
    calls at one token only (bulk_rule's data), the decode layers' calls (epilogue, SwiGLU) up to
    BULK_LAYER_MAX_M[K] tokens (one where K is not listed), never more than BULK_MAX_M; DENSE_PATH = "bulk" at any
    1..8 tokens; and the ring is asked with the call's token count."""
    from types import SimpleNamespace

    props = SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    asked = []

    class Lib:
        def symbol(self, op, **sym):
            return lambda n, ctas, swi, m: asked.append((sym["bits"], n, ctas, swi, m)) or 4

    monkeypatch.setattr(tiled, "_bulk_rings", {})
    monkeypatch.setattr(tiled, "BULK_LAYER_MAX_M", {4: 4})
    monkeypatch.setattr(tiled, "gpu_name", lambda device: "Fake H200")
    monkeypatch.setattr(picks, "pick", lambda gpu, fmt, n, k_in: None)
    dev, bf16, lib = torch.device("cuda", 0), torch.bfloat16, Lib()

    def ctas(bits, m, n, k_in, **kw):
        return tiled.bulk_ctas(lib, dev, bits, bf16, m, n, k_in, **kw)

    for m in (1, 2, 4):  # the layers at K = 4: q|k|v, o_proj, gate|up (tile pairs)
        assert ctas(4, m, 6144, 4096, epilogue=True) == 132
        assert ctas(4, m, 4096, 4096, epilogue=True) == 132
        assert ctas(4, m, 28672, 4096, swiglu=True) == 132
        assert (4, 28672, 132, 1, m) in asked
    assert ctas(4, 5, 6144, 4096, epilogue=True) == 0 and ctas(4, 5, 28672, 4096, swiglu=True) == 0
    monkeypatch.setattr(tiled, "BULK_LAYER_MAX_M", {4: 9})
    assert ctas(4, 8, 6144, 4096, epilogue=True) == 132 and ctas(4, 9, 6144, 4096, epilogue=True) == 0  # the MMA's N
    assert ctas(3, 1, 6144, 4096, epilogue=True) == 132 and ctas(3, 2, 6144, 4096, epilogue=True) == 0  # K = 3: one
    assert ctas(3, 1, 4096, 14336, epilogue=True) == 132  # down_proj (108 units per CTA) too, however fast HBM is
    assert ctas(3, 1, 28672, 4096, swiglu=True) == 0  # gate|up: BULK_SWIGLU_BITS
    assert ctas(2, 1, 6144, 4096, epilogue=True) == 132 and ctas(2, 4, 6144, 4096, epilogue=True) == 0
    assert ctas(4, 1, 4096, 4096) == 132 and ctas(4, 2, 4096, 4096) == 0  # plain: bulk_rule, one token
    # a measured pick (lowbit tune --gemv-kernels) replaces bulk_rule, for plain calls only
    monkeypatch.setattr(picks, "pick", lambda gpu, fmt, n, k_in: {"kbit3": "bulk", "kbit4": "split"}.get(fmt))
    assert ctas(3, 1, 4096, 4096) == 132 and ctas(3, 1, 29568, 8192) == 132 and ctas(3, 2, 4096, 4096) == 0
    assert ctas(4, 1, 4096, 4096) == 0 and ctas(4, 1, 4096, 4096, epilogue=True) == 132
    monkeypatch.setattr(tiled, "DENSE_PATH", "bulk")
    assert ctas(3, 8, 4096, 4096) == 132 and ctas(3, 9, 4096, 4096) == 0 and ctas(3, 0, 4096, 4096) == 0


def test_constant_result_is_torchs_mark_without_its_import():
    """dispatch marks its file lookups for torch.compile as ``torch.compiler.assume_constant_result`` does, without
    importing ``torch._dynamo`` when lowbit loads (~2 s of every CLI call): the decorator must still set exactly
    that mark, and ``import lowbit`` (the CLI included) must not load dynamo."""
    import subprocess
    import sys

    def f():
        return 1

    def g():
        return 1

    assert torch.compiler.assume_constant_result(f) is f and dispatch._constant_result(g) is g
    assert vars(f) == vars(g) == {"_dynamo_marked_constant": True}
    code = "import sys, lowbit, lowbit.cli; print('torch._dynamo' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_untuned_note_names_what_a_gpu_lacks(monkeypatch, tmp_path):
    """A GPU that neither tuning file lists gets one line naming both tuners; one listed in the shipped files gets
    none; an entry the user measured (``lowbit tune --kbit-crossover`` into the user file) counts as tuned."""
    from lowbit import tuning

    shipped = next(iter(dispatch.load_crossovers()))
    assert dispatch.untuned_note(shipped) is None  # the shipped files list the same GPU
    note = dispatch.untuned_note("Example GPU 9000")
    assert note.startswith("note: lowbit has no tuning for Example GPU 9000")
    assert "`lowbit tune --kbit-crossover`" in note and "`lowbit tune`" in note
    user = tmp_path / "kbit_dispatch.json"
    user.write_text(json.dumps({"version": 1, "gpus": {"Example GPU 9000": {"gemm_max_m": [[None, 64]]}}}))
    monkeypatch.setenv("LOWBIT_DISPATCH_FILE", str(user))
    note = dispatch.untuned_note("Example GPU 9000")
    assert "--kbit-crossover" not in note and note.endswith("the fp16/bf16 GEMV configurations: `lowbit tune`")
    monkeypatch.setattr(tuning, "table", lambda: {"Example GPU 9000": {}})
    assert dispatch.untuned_note("Example GPU 9000") is None
