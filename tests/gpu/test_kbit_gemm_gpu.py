"""kbit GEMM (tensor cores, M > 8) on CUDA against the format reference.

Error bounds and reference: kbit_check.py (relative norm error vs an fp64 product of the
reference-dequantized weights, fp16 <= 1e-3, bf16 <= 8e-3; NaN never passes).
"""

import math

import pytest
import torch

import lowbit
from lowbit import dispatch
from lowbit.kernels import tiled
from lowbit.kernels.library import get_library, ptr, stream_of

from .kbit_check import BOUND, DTYPES
from .kbit_check import dtype_id as ids
from .kbit_check import ref as _ref
from .kbit_check import rel as _rel

pytestmark = pytest.mark.gpu


def _shapes(gen):
    yield 2 * int(torch.randint(1, 300, (1,), generator=gen)) + 1, 32 * int(torch.randint(1, 40, (1,), generator=gen))
    yield 64, 8192  # one row block: deep split-K
    yield 1000, 2048 + 96  # K_in not a multiple of 256 (padded group), N not a multiple of 128


def _gemm_raw(q, x, splits):
    """Direct C call: NaN-filled output with a guard tail, NaN-filled workspace."""
    lib = get_library()
    n, k_in = q.shape
    m = x.shape[0]
    qw, qa = q.tiled()
    launch = tiled.GemmLauncher(lib, qw, qa, q.codebook, q.scale, q.bits, n, k_in)
    _, nt, r, splits, ws_floats, cnt = launch.plan(x.dtype, m, splits)
    buf = torch.full((m * n + 64,), float("nan"), dtype=x.dtype, device="cuda")
    ws = torch.full((max(ws_floats, 1),), float("nan"), dtype=torch.float32, device="cuda")
    args = [ptr(x), ptr(qw), ptr(qa), ptr(q.codebook), ptr(q.scale), ptr(buf), ptr(None), ptr(ws) if ws_floats else ptr(None),
            ptr(cnt), m, n, k_in, splits, stream_of(x.device)]
    lib.call("kbit_gemm", args, bits=q.bits, dtype=x.dtype, nt=nt, r=r)
    torch.cuda.synchronize()
    assert buf[m * n:].isnan().all(), "wrote past the output"
    return buf[: m * n].view(m, n)


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("m", [9, 16, 17, 33, 64, 65, 130])
@pytest.mark.parametrize("tiles_per_warp", [1, 2])
def test_gemm_matches_reference(bits, dtype, m, tiles_per_warp, gen, monkeypatch):
    """Every instance (M up to 16 / 32 / 64, and M > 64 in chunks; one and two 16-row tiles per warp),
    M not a multiple of the tile, odd N, partial last group; K split one way, by the rule, and as far
    as it goes."""
    monkeypatch.setattr(tiled, "GEMM_TILES_PER_WARP", tiles_per_warp)
    for n, k_in in _shapes(gen):
        q = lowbit.quantize_kbit(torch.randn(n, k_in, generator=gen), bits=bits).to("cuda")
        x = torch.randn(m, k_in, generator=gen).to(dtype).cuda()
        ref = _ref(x, q)
        groups = -(-k_in // 256)
        for splits in sorted({1, None, groups}, key=lambda s: -1 if s is None else s):
            err = _rel(_gemm_raw(q, x, splits), ref)
            assert err <= BOUND[dtype], f"N={n} K_in={k_in} M={m} splits={splits}: rel err {err:.2e}"


def test_gemm_rejects_bad_splits(gen):
    q = lowbit.quantize_kbit(torch.randn(48, 512, generator=gen), bits=4).to("cuda")
    qw, qa = q.tiled()
    launch = tiled.GemmLauncher(get_library(), qw, qa, q.codebook, q.scale, 4, 48, 512)
    with pytest.raises(ValueError, match="splits"):
        launch.plan(torch.float16, 16, splits=3)  # 2 groups


def test_gemm_through_dispatch_and_bias(gen, tmp_path, monkeypatch):
    """KbitLinear (bias fused) runs the GEMM where this GPU's crossover file says so (a user file
    written by the tuner here: M <= 32 for every size)."""
    from lowbit.bench import crossover

    user = tmp_path / "kbit_dispatch.json"
    crossover.save(user, torch.cuda.get_device_name(), [(None, 32)])
    monkeypatch.setenv("LOWBIT_DISPATCH_FILE", str(user))
    dispatch.reload_crossovers()
    lin = torch.nn.Linear(768, 300, bias=True, dtype=torch.bfloat16)
    mod = lowbit.nn.KbitLinear.from_linear(lin, 4).cuda()
    x = torch.randn(3, 7, 768, generator=gen).bfloat16().cuda()  # M = 21
    try:
        assert dispatch.kbit_path(x.reshape(-1, 768), 300) == "gemm"
        assert dispatch.kbit_path(x.reshape(-1, 768)[:1].expand(40, 768), 300) == "dequant_matmul"
        with torch.no_grad():
            y = mod(x)
    finally:
        monkeypatch.undo()
        dispatch.reload_crossovers()
    w = mod.dequantize(torch.float64).cpu()
    ref = x.cpu().double().reshape(-1, 768) @ w.t() + lin.bias.double()
    assert y.shape == (3, 7, 300)
    assert _rel(y.reshape(-1, 300), ref) <= BOUND[torch.bfloat16]


def test_gemm_deterministic_and_in_cuda_graph(gen):
    q = lowbit.quantize_kbit(torch.randn(256, 8192, generator=gen), bits=4).to("cuda")  # 2 row blocks: split-K
    x = torch.randn(40, 8192, generator=gen).half().cuda()
    with dispatch.forced_path("gemm"):
        ys = [lowbit.kbit_linear(x, q) for _ in range(4)]
        assert all(torch.equal(ys[0], y) for y in ys[1:])
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.cuda.graph(g):
            y = lowbit.kbit_linear(x, q)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ys[0])


def test_gemm_empty_batch(gen):
    q = lowbit.quantize_kbit(torch.randn(48, 256, generator=gen), bits=3).to("cuda")
    qw, qa = q.tiled()
    x = torch.empty(0, 256, dtype=torch.float16, device="cuda")
    y = lowbit.ops.kbit_gemm(x, qw, qa, q.codebook, q.scale, 3, 48, 256)
    assert y.shape == (0, 48)




# ------------------------------------------------------------------ grouped (MoE) GEMM
def _grouped_raw(ex, x, off, nt):
    """Direct C call of the grouped GEMM with nt token tiles: NaN-filled output with a guard tail."""
    lib = get_library()
    e, n, k_in = ex.shape
    qw, qa = ex.tiled()
    launch = tiled.GroupedGemmLauncher(lib, qw, qa, ex.codebook, ex.scales, ex.bits, n, k_in)
    _, ctas = launch.plan(x.dtype, nt)
    rows = x.shape[0]
    buf = torch.full((rows * n + 64,), float("nan"), dtype=x.dtype, device="cuda")
    args = [ptr(x), ptr(off), ptr(qw), ptr(qa), ptr(ex.codebook), ptr(ex.scales), ptr(buf), ptr(None), e, n, k_in,
            ctas, stream_of(x.device)]
    lib.call("kbit_grouped_gemm", args, bits=ex.bits, dtype=x.dtype, nt=nt)
    torch.cuda.synchronize()
    assert buf[rows * n:].isnan().all(), "wrote past the output"
    return buf[: rows * n].view(rows, n)


def _check_experts(y, x, off, ex, bound):
    off = off.tolist()
    for i in range(len(off) - 1):
        lo, hi = off[i], off[i + 1]
        if hi > lo:
            err = _rel(y[lo:hi], _ref(x[lo:hi], ex.expert(i)))
            assert err <= bound, f"expert {i} ({hi - lo} rows): rel err {err:.2e}"


@pytest.mark.parametrize("bits", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("nt", [2, 4, 8])
def test_grouped_gemm_matches_per_expert_reference(bits, dtype, nt, gen):
    """Uneven experts (empty ones, one row, runs over several chunks of 8 nt rows), odd N (a partial
    row block), K_in % 256 != 0; every row written, nothing past the output."""
    e, n, k_in = 12, 16 * 9 - 5, 512 + 96
    ex = lowbit.quantize_kbit_experts(torch.randn(e, n, k_in, generator=gen), bits=bits).to("cuda")
    counts = torch.randint(0, 40, (e,), generator=gen)
    counts[0], counts[4], counts[5], counts[e - 1] = 0, 1, 8 * nt * 2 + 3, 0  # empty first/last, 3 chunks
    off = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    x = torch.randn(int(off[-1]), k_in, generator=gen).to(dtype).cuda()
    _check_experts(_grouped_raw(ex, x, off.cuda(), nt), x, off, ex, BOUND[dtype])


def test_grouped_gemm_many_experts_one_active_and_empty(gen):
    """513 experts (the chunk scan's 256-thread rounds), every row on one expert; an empty batch."""
    e, n, k_in = 513, 48, 256
    ex = lowbit.quantize_kbit_experts(torch.randn(e, n, k_in, generator=gen), bits=4).to("cuda")
    counts = torch.zeros(e, dtype=torch.int64)
    counts[300] = 150
    off = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    x = torch.randn(150, k_in, generator=gen).half().cuda()
    for nt in (2, 8):
        _check_experts(_grouped_raw(ex, x, off.cuda(), nt), x, off, ex, BOUND[torch.float16])
    y = lowbit.ops.kbit_grouped_gemm(x[:0], torch.zeros(e + 1, dtype=torch.int64, device="cuda"), *ex.tiled(),
                                     ex.codebook, ex.scales, 4, n, k_in)
    assert y.shape == (0, n)


def test_grouped_dispatch_deterministic_and_graph_replays_new_routing(gen):
    """Mean rows per expert at or above the crossover -> the grouped GEMM; bit-identical reruns; a
    captured graph reads the routing (offsets) on the device, so a replay after new offsets of the
    same row count computes the new grouping."""
    e, n, k_in = 8, 96, 1024
    ex = lowbit.quantize_kbit_experts(torch.randn(e, n, k_in, generator=gen), bits=4).to("cuda")
    min_rows = dispatch.grouped_gemm_min_rows(torch.device("cuda"))
    rows = int(max(min_rows, 16) * e) + 5
    x = torch.randn(rows, k_in, generator=gen).half().cuda()
    assert dispatch.grouped_path(x, e) == "grouped_gemm"
    assert dispatch.grouped_path(x[: math.ceil(min_rows * e) - 1], e) == "grouped_gemv"

    def offsets():
        cut = torch.sort(torch.randint(0, rows + 1, (e - 1,), generator=gen)).values
        return torch.cat([torch.zeros(1, dtype=torch.int64), cut, torch.tensor([rows])])

    off_dev = offsets().cuda()
    ys = [lowbit.kbit_grouped_linear(x, off_dev, ex) for _ in range(3)]
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    _check_experts(ys[0], x, off_dev.cpu(), ex, BOUND[torch.float16])
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        y = lowbit.kbit_grouped_linear(x, off_dev, ex)
    new = offsets()
    off_dev.copy_(new)
    g.replay()
    torch.cuda.synchronize()
    _check_experts(y, x, new, ex, BOUND[torch.float16])
    with dispatch.forced_path("gemv"):
        assert _rel(lowbit.kbit_grouped_linear(x, off_dev, ex), y.cpu().double()) <= 1e-3
